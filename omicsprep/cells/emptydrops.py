"""EmptyDrops (Lun et al. 2019) and Cell Ranger's variant of it, exact to DropletUtils 1.18.

A barcode is tested against the ambient profile (Good-Turing proportions of the low-total
barcodes' pooled counts) by its multinomial or Dirichlet-multinomial log-probability; the
p-value is the Monte Carlo rank of that log-probability among simulated ambient droplets of the
same total (:mod:`omicsprep.cells.montecarlo`). Both callers share :func:`_test_barcodes` and
:func:`_fdr`; they differ in which barcodes are ambient, tested and retained, as in
DropletUtils' ``testEmptyDrops``/``emptyDrops`` and ``emptyDropsCellRanger``.

Deliberate differences from DropletUtils: the Monte Carlo uses its own random stream (Philox,
so the p-values match DropletUtils' in distribution, not draw for draw), and ``retain=None``
means no retention (DropletUtils then takes barcodeRanks' knee, which the caller passes in).

The ``backend`` decides where the Monte Carlo runs, the only costly step (iterations x the
largest tested total draws); the ambient profile, alpha and observed log-probabilities are
computed on the CPU either way (Numba, parallel over rows, reading the tested rows in place
rather than copying them out), so both backends return identical tables for a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import pandas as pd
from scipy import sparse
from scipy.special import gammaln

from omicsprep.backend import Backend, array_module, asnumpy
from omicsprep.cells import montecarlo
from omicsprep.cells.optimize import brent_minimum
from omicsprep.errors import InputError

GOOD_TURING_CONFIDENCE = 1.96  # edgeR's goodTuring default
ALPHA_INTERVAL = (0.01, 10_000.0)  # DropletUtils' search interval for the Dirichlet alpha


@dataclass(frozen=True)
class EmptyDropsResult:
    """EmptyDrops' statistics.

    ``table``: one row per input barcode, in input order (RangeIndex), with columns ``total``,
    ``log_prob``, ``p_value``, ``limited`` (no simulation reached the observed log-probability,
    so the p-value is bounded by the iterations) and ``fdr`` (Benjamini-Hochberg over the
    p-values, retained barcodes counted as 0); NaN/NA where a barcode was not tested, as in
    DropletUtils. ``ambient``: the ambient proportions per gene (0 for genes counted in no
    barcode, which DropletUtils drops). ``alpha``: the Dirichlet-multinomial alpha (inf for the
    multinomial). ``retain``: the total at and above which barcodes count as cells, or None.
    """

    table: pd.DataFrame
    ambient: np.ndarray
    alpha: float
    retain: float | None


def empty_drops(
    counts: sparse.csr_matrix,
    *,
    lower: int = 100,
    niters: int = 10_000,
    test_ambient: bool = False,
    ignore: int | None = None,
    alpha: float | None = None,
    retain: float | None = None,
    by_rank: int | None = None,
    seed: int = 0,
    backend: Backend = "cpu",
) -> EmptyDropsResult:
    """DropletUtils' ``emptyDrops``: which barcodes differ from the ambient profile.

    Parameters
    ----------
    counts
        Barcodes x genes counts (CSR; integers, possibly stored as floats; rounded).
    lower
        Barcodes with totals at or below it make the ambient profile (and are not tested).
    niters
        Monte Carlo iterations.
    test_ambient
        Test every barcode with a nonzero total (their FDR stays NaN at or below ``lower``).
    ignore
        Barcodes with totals at or below it are not tested.
    alpha
        Dirichlet-multinomial alpha; None estimates it by maximum likelihood from the ambient
        barcodes; ``inf`` is the multinomial.
    retain
        Barcodes with totals at or above it are cells (FDR 0); None retains none.
    by_rank
        Instead of ``lower``, the ambient barcodes are those ranked below the ``by_rank``
        highest totals.
    seed
        Seed of the Monte Carlo's random stream.
    backend
        Where the Monte Carlo runs; both give identical p-values for a seed.

    Returns
    -------
    EmptyDropsResult
    """
    matrix, totals, detected = _integer_counts(counts)
    lower_total = lower if by_rank is None else _total_at_rank(totals, by_rank)
    ambient_rows = totals <= lower_total
    tested = totals > 0 if test_ambient else ~ambient_rows
    if ignore is not None:
        tested &= totals > ignore
    table, ambient, alpha = _test_barcodes(
        matrix,
        totals,
        detected,
        ambient_rows=ambient_rows,
        tested=tested,
        alpha=alpha,
        niters=niters,
        seed=seed,
        backend=backend,
    )
    table["fdr"] = _fdr(
        table["p_value"].to_numpy(), totals, retain=retain, excluded=ambient_rows if test_ambient else None
    )
    return EmptyDropsResult(table=table, ambient=ambient, alpha=alpha, retain=retain)


def empty_drops_cell_ranger(
    counts: sparse.csr_matrix,
    *,
    expected_cells: int = 3000,
    max_percentile: float = 0.99,
    max_min_ratio: float = 10.0,
    umi_min: int = 500,
    umi_min_frac_median: float = 0.01,
    candidates_max: int = 20_000,
    ambient_rank_min: int = 45_000,
    ambient_rank_max: int = 90_000,
    niters: int = 10_000,
    seed: int = 0,
    backend: Backend = "cpu",
) -> EmptyDropsResult:
    """DropletUtils' ``emptyDropsCellRanger``: Cell Ranger 3's cell calling.

    Barcodes with totals at or above ``retain`` (a tenth, ``max_min_ratio``, of the total at
    rank ``expected_cells * (1 - max_percentile)``: Cell Ranger's "ordmag" cells) are cells and
    are not tested; their ``p_value`` is NaN and their ``fdr`` 0, as DropletUtils marks them, so
    ``fdr <= threshold`` gives all of DropletUtils' cells. The next ``candidates_max`` barcodes
    by total with totals above ``max(umi_min, umi_min_frac_median * median ordmag total)`` are
    tested, against the ambient profile of the barcodes ranked ``ambient_rank_min`` to
    ``ambient_rank_max``, by the multinomial (alpha inf).

    Parameters are DropletUtils' (``n.expected.cells``, ``max.percentile``, ``max.min.ratio``,
    ``umi.min``, ``umi.min.frac.median``, ``cand.max.n``, ``ind.min``, ``ind.max``, ``niters``);
    ``counts``, ``seed`` and ``backend`` as in :func:`empty_drops`.

    Returns
    -------
    EmptyDropsResult
    """
    matrix, totals, detected = _integer_counts(counts)
    n = totals.size
    by_total = np.argsort(-totals, kind="stable")  # R's order(decreasing=TRUE) keeps ties in input order
    n_umi_max = totals[by_total[min(n, round(expected_cells * (1 - max_percentile))) - 1]]
    retain = max(round(n_umi_max / max_min_ratio), 1)
    n_ordmag = int(np.sum(totals >= retain))
    median_rank = n_ordmag // 2  # R truncates the index ncells.simple / 2; index 0 selects nothing
    min_umi = (
        umi_min if median_rank == 0 else max(umi_min, round(umi_min_frac_median * totals[by_total[median_rank - 1]]))
    )
    last_candidate = min(n_ordmag + candidates_max, int(np.sum(totals > min_umi)))
    ambient_rows = np.zeros(n, dtype=bool)
    ambient_rows[by_total[min(ambient_rank_min, n) - 1 : min(ambient_rank_max, n)]] = True
    tested = np.zeros(n, dtype=bool)
    # R's (ncells.simple + 1):i.cand.last counts down when there are fewer candidates than that.
    first, last = sorted((n_ordmag + 1, last_candidate))
    tested[by_total[max(first, 1) - 1 : last]] = True
    table, ambient, alpha = _test_barcodes(
        matrix,
        totals,
        detected,
        ambient_rows=ambient_rows,
        tested=tested,
        alpha=math.inf,
        niters=niters,
        seed=seed,
        backend=backend,
    )
    table["fdr"] = _fdr(table["p_value"].to_numpy(), totals, retain=retain, excluded=None)
    return EmptyDropsResult(table=table, ambient=ambient, alpha=alpha, retain=float(retain))


def _integer_counts(counts: sparse.csr_matrix) -> tuple[sparse.csr_matrix, np.ndarray, np.ndarray]:
    """``counts`` rounded (half to even, as R's round) to int64, zeros dropped; totals, detected genes.

    One parallel pass over the nonzeros gives the rounded counts, the row totals and which genes
    have a nonzero count; ``counts`` is left as it is.
    """
    csr = sparse.csr_matrix(counts)
    data, totals, detected, n_zeros = _round_rows(csr.indptr, csr.indices, csr.data, csr.shape[1])
    matrix = sparse.csr_matrix((data, csr.indices, csr.indptr), shape=csr.shape)
    if n_zeros:  # rounded to zero or stored zeros: drop them from copies of the shared structure
        matrix = sparse.csr_matrix((data, csr.indices.copy(), csr.indptr.copy()), shape=csr.shape)
        matrix.eliminate_zeros()
    return matrix, totals, detected


@numba.njit(cache=True, parallel=True)
def _round_rows(indptr, indices, data, n_genes):
    rounded = np.empty(data.size, dtype=np.int64)
    totals = np.zeros(indptr.size - 1, dtype=np.int64)
    zeros = np.zeros(indptr.size - 1, dtype=np.int64)
    detected = np.zeros(n_genes, dtype=np.bool_)
    for row in numba.prange(indptr.size - 1):
        total = np.int64(0)
        for k in range(indptr[row], indptr[row + 1]):
            count = np.int64(np.rint(data[k]))
            rounded[k] = count
            total += count
            if count == 0:
                zeros[row] += 1
            elif not detected[indices[k]]:  # read first: writes to shared cache lines would stall the threads
                detected[indices[k]] = True  # threads may write the same True: the result is the same
        totals[row] = total
    return rounded, totals, detected, zeros.sum()


def _total_at_rank(totals: np.ndarray, rank: int) -> int:
    """The total of the barcode ranked just below the ``rank`` highest."""
    if rank >= totals.size:
        raise InputError(f"by_rank={rank} needs more than {totals.size} barcodes")
    return int(np.sort(totals)[::-1][rank])


def _test_barcodes(
    matrix: sparse.csr_matrix,
    totals: np.ndarray,
    detected: np.ndarray,
    *,
    ambient_rows: np.ndarray,
    tested: np.ndarray,
    alpha: float | None,
    niters: int,
    seed: int,
    backend: Backend,
) -> tuple[pd.DataFrame, np.ndarray, float]:
    """DropletUtils' ``.test_empty_drops``: the table (without FDR), ambient proportions and alpha.

    ``detected``: the genes with a nonzero count in ``matrix``.
    """
    ambient_matrix = matrix[ambient_rows]
    profile = np.bincount(ambient_matrix.indices, weights=ambient_matrix.data, minlength=matrix.shape[1])
    if profile.sum() == 0:
        raise InputError("no counts in the ambient barcodes to estimate the ambient profile from")
    ambient = np.zeros(matrix.shape[1])
    ambient[detected] = _safe_good_turing(profile[detected].astype(np.int64))
    if alpha is None:
        alpha = _estimate_alpha(ambient_matrix, ambient, totals[ambient_rows])
    data_p = _data_log_prob(matrix, np.flatnonzero(tested), ambient, alpha)
    tested_totals = totals[tested]
    below = _count_below(
        tested_totals, data_p, ambient[detected], alpha=alpha, niters=niters, seed=seed, backend=backend
    )
    n = totals.size
    log_prob = np.full(n, np.nan)
    log_prob[tested] = data_p + _rest_log_prob(tested_totals, alpha)
    p_value = np.full(n, np.nan)
    p_value[tested] = (below + 1) / (niters + 1)
    limited_values = np.zeros(n, dtype=bool)
    limited_values[tested] = below == 0
    limited = pd.arrays.BooleanArray(limited_values, mask=~tested)
    table = pd.DataFrame({"total": totals, "log_prob": log_prob, "p_value": p_value, "limited": limited})
    return table, ambient, float(alpha)


def _safe_good_turing(profile: np.ndarray) -> np.ndarray:
    """DropletUtils' ``.safe_good_turing``: edgeR's goodTuringProportions, zeros made positive."""
    prob = _good_turing_proportions(profile)
    still_zero = prob <= 0
    if still_zero.any():
        pseudo = 1 / profile.sum()
        prob[still_zero] = pseudo / still_zero.sum()
        prob[~still_zero] *= 1 - pseudo
    return prob


def _good_turing_proportions(profile: np.ndarray) -> np.ndarray:
    """The ``goodTuringProportions`` of edgeR of one count vector (simple Good-Turing, Gale & Sampson 1995)."""
    observed, frequency = np.unique(profile[profile > 0], return_counts=True)
    p_zero, proportion = _simple_good_turing(observed.astype(float), frequency.astype(float))
    n_zero = int(np.sum(profile == 0))
    prob = np.empty(profile.size)
    prob[profile == 0] = p_zero / n_zero if n_zero else 0.0
    nonzero = profile > 0
    prob[nonzero] = proportion[np.searchsorted(observed, profile[nonzero])]
    return prob


def _simple_good_turing(observed: np.ndarray, frequency: np.ndarray) -> tuple[float, np.ndarray]:
    """The ``simple_good_turing`` of edgeR: the unseen mass and the proportion of each observed count."""
    big_n = float(np.sum(observed * frequency))
    previous = np.concatenate(([0.0], observed[:-1]))
    following = np.concatenate((observed[1:], [2 * observed[-1] - previous[-1]]))
    log_obs = np.log(observed)
    log_z = np.log(2.0 * frequency / (following - previous))
    rows = observed.size
    mean_x, mean_y = log_obs.mean(), log_z.mean()
    slope = (np.sum(log_obs * log_z) - mean_x * mean_y * rows) / (np.sum(log_obs**2) - mean_x**2 * rows)
    p_zero = frequency[0] / big_n if observed[0] == 1 else 0.0
    out = np.empty(rows)
    smoothed = False  # once the Turing estimate is indistinguishable from the fit, the fit is used
    for i in range(rows):
        next_obs = observed[i] + 1
        fitted = next_obs * math.exp(slope * (math.log(next_obs) - log_obs[i]))
        if i == rows - 1 or observed[i + 1] != next_obs:
            smoothed = True
        if not smoothed:
            turing = next_obs * frequency[i + 1] / frequency[i]
            spread = GOOD_TURING_CONFIDENCE * turing * math.sqrt(1 / frequency[i + 1] + 1 / frequency[i])
            if abs(turing - fitted) <= spread:
                smoothed = True
            else:
                out[i] = turing
        if smoothed:
            out[i] = fitted
    return p_zero, out * ((1.0 - p_zero) / np.sum(out * frequency))


def _estimate_alpha(ambient_matrix: sparse.csr_matrix, ambient: np.ndarray, totals: np.ndarray) -> float:
    """DropletUtils' ``.estimate_alpha``: the Dirichlet-multinomial alpha of the ambient barcodes by ML.

    Maximised with R's ``optimize`` (Brent) over DropletUtils' interval; equal terms are pooled
    (same gene and count; same total), which changes only the order of summation.
    """
    stride = int(ambient_matrix.data.max()) + 1  # one key per (gene, count)
    pair_key, pair_weight = _tally(
        ambient_matrix.indices.astype(np.int64) * stride + ambient_matrix.data, ambient.size * stride
    )
    pair_prop, pair_count = ambient[pair_key // stride], pair_key % stride
    unique_totals, total_weight = _tally(totals, int(totals.max()) + 1)

    def log_likelihood(alpha: float) -> float:
        prop_alpha = pair_prop * alpha
        return float(
            gammaln(alpha) * totals.size
            - np.dot(total_weight, gammaln(unique_totals + alpha))
            + np.dot(pair_weight, gammaln(pair_count + prop_alpha) - gammaln(prop_alpha))
        )

    return brent_minimum(lambda alpha: -log_likelihood(alpha), *ALPHA_INTERVAL)[0]


def _tally(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_counts=True)`` of keys in ``[0, n_keys)``.

    By counting (linear time) when the range is small enough, else by sorting.
    """
    if n_keys > 4 * keys.size + 1_000_000:
        return np.unique(keys, return_counts=True)
    counts = np.bincount(keys, minlength=n_keys)
    present = np.flatnonzero(counts)
    return present, counts[present]


def _data_log_prob(matrix: sparse.csr_matrix, rows: np.ndarray, ambient: np.ndarray, alpha: float) -> np.ndarray:
    """Per row of ``rows``, the data-dependent part of the (Dirichlet-)multinomial log-probability."""
    log_factorial = gammaln(np.arange(int(matrix.data.max(initial=0)) + 2, dtype=float))[1:]  # lfactorial(0..max)
    with np.errstate(divide="ignore"):  # genes counted nowhere have proportion 0 and no nonzeros
        if math.isinf(alpha):
            return _sum_multinomial_terms(
                matrix.indptr, matrix.indices, matrix.data, rows, np.log(ambient), log_factorial
            )
        alpha_prop = alpha * ambient
        return _sum_dirichlet_terms(
            matrix.indptr, matrix.indices, matrix.data, rows, alpha_prop, gammaln(alpha_prop), log_factorial
        )


@numba.njit(cache=True, parallel=True)
def _sum_multinomial_terms(indptr, indices, data, rows, log_prop, log_factorial):
    out = np.zeros(rows.size)
    for i in numba.prange(rows.size):
        total = 0.0
        for k in range(indptr[rows[i]], indptr[rows[i] + 1]):
            total += data[k] * log_prop[indices[k]] - log_factorial[data[k]]
        out[i] = total
    return out


SMALL_COUNTS = 16  # counts below it take their Dirichlet term from a per-gene table (lgamma is costly)


@numba.njit(cache=True, parallel=True)
def _sum_dirichlet_terms(indptr, indices, data, rows, alpha_prop, lgamma_alpha_prop, log_factorial):
    small_terms = np.empty((alpha_prop.size, SMALL_COUNTS))  # the same expression as below, so the same value
    for gene in numba.prange(alpha_prop.size):
        for count in range(min(SMALL_COUNTS, log_factorial.size)):
            small_terms[gene, count] = (
                math.lgamma(alpha_prop[gene] + count) - log_factorial[count] - lgamma_alpha_prop[gene]
            )
    out = np.zeros(rows.size)
    for i in numba.prange(rows.size):
        total = 0.0
        for k in range(indptr[rows[i]], indptr[rows[i] + 1]):
            gene, count = indices[k], data[k]
            if count < SMALL_COUNTS:
                total += small_terms[gene, count]
            else:
                total += math.lgamma(alpha_prop[gene] + count) - log_factorial[count] - lgamma_alpha_prop[gene]
        out[i] = total
    return out


def _rest_log_prob(totals: np.ndarray, alpha: float) -> np.ndarray:
    """The total-dependent part of the log-probability (the multinomial coefficient's numerator)."""
    rest = gammaln(totals + 1.0)
    if math.isinf(alpha):
        return rest
    return rest + gammaln(alpha) - gammaln(totals + alpha)


def _count_below(
    totals: np.ndarray,
    data_p: np.ndarray,
    ambient: np.ndarray,
    *,
    alpha: float,
    niters: int,
    seed: int,
    backend: Backend,
) -> np.ndarray:
    """Per tested barcode, the simulated ambient droplets of its total no more probable than it."""
    if totals.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((data_p, totals))  # DropletUtils' order(totals, probs)
    group_totals, group_sizes = np.unique(totals[order], return_counts=True)
    inputs = montecarlo.simulation_inputs(ambient, alpha, group_totals, group_sizes, data_p[order])
    key = montecarlo.philox_key(seed)
    if backend == "gpu":
        from omicsprep.cells.montecarlo_cuda import count_gpu

        hist = asnumpy(count_gpu(niters, key, alpha, *inputs, xp=array_module(backend)))
    else:
        hist = montecarlo.count_cpu(niters, key, alpha, *inputs)
    running = np.cumsum(hist)
    before_group = np.concatenate(([0], running[np.cumsum(group_sizes)[:-1] - 1]))
    below_sorted = running - np.repeat(before_group, group_sizes)  # cumulative within each total
    below = np.empty_like(below_sorted)
    below[order] = below_sorted
    return below


def _fdr(p_value: np.ndarray, totals: np.ndarray, *, retain: float | None, excluded: np.ndarray | None) -> np.ndarray:
    """Benjamini-Hochberg FDR as DropletUtils computes it: retained barcodes at p 0, ``excluded`` left out."""
    p = p_value.copy()
    if retain is not None:
        p[totals >= retain] = 0.0
    if excluded is not None:
        p[excluded] = np.nan
    return _benjamini_hochberg(p)


def _benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """R's ``p.adjust(p, "BH")``: NaN stays NaN and does not count."""
    fdr = np.full(p.size, np.nan)
    present = np.flatnonzero(~np.isnan(p))
    n = present.size
    if n == 0:
        return fdr
    order = present[np.argsort(-p[present], kind="stable")]
    adjusted = np.minimum.accumulate(p[order] * n / np.arange(n, 0, -1))
    fdr[order] = np.minimum(adjusted, 1.0)
    return fdr
