"""Ambient RNA removal as SoupX does it: the soup profile, ``autoEstCont`` and ``adjustCounts``.

Follows SoupX 1.6.2 (Young & Behjati 2020): the soup is the pooled expression of nearly empty
droplets; the contamination fraction is the posterior mode from cluster-level counts of
marker genes that the clusters do not express; the correction subtracts each cell's expected
soup counts, shared among its genes by the soup profile and capped at the observed counts
(SoupX's ``alloc``), first for clusters and then spread over the clusters' cells.

The subtraction runs on NumPy or CuPy through one code (:func:`remove_soup`); the estimation
is a few per-cluster sums and runs on the CPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import sparse, stats

from omicsprep.backend import Backend, array_module, asnumpy, cupyx_sparse

log = logging.getLogger(__name__)

# quickMarkers: a cell expresses a gene with more than this count; markers pass this BH FDR.
EXPRESS_CUT = 0.9
MARKER_FDR = 0.01
# autoEstCont evaluates the posterior on this grid of contamination fractions.
RHO_PROBES = np.arange(1001) * 0.001
# SoupX warns below these many markers or cluster-level estimates.
FEW_ESTIMATES = 10


def soup_profile(raw: sparse.csr_matrix, *, soup_range: tuple[int, int] = (0, 100)) -> np.ndarray:
    """The soup's share of each gene, pooled over nearly empty droplets (SoupX ``estimateSoup``).

    Parameters
    ----------
    raw
        Every droplet: barcodes x genes counts.
    soup_range
        Droplets whose total count lies strictly between these bounds are taken as soup.

    Returns
    -------
    Proportions per gene (float64, summing to 1).

    Raises
    ------
    ValueError
        No droplet (or no count) in ``soup_range``.
    """
    totals = np.asarray(raw.sum(axis=1, dtype=np.float64)).ravel()
    in_soup = (totals > soup_range[0]) & (totals < soup_range[1])
    counts = np.asarray(raw[in_soup].sum(axis=0, dtype=np.float64)).ravel()
    if counts.sum() == 0:
        msg = f"no counts in droplets with {soup_range[0]} < total < {soup_range[1]}: no soup profile"
        raise ValueError(msg)
    return counts / counts.sum()


@dataclass(frozen=True)
class ContaminationEstimate:
    """What :func:`estimate_contamination` found.

    Attributes
    ----------
    rho
        The global contamination fraction: the posterior mode within the allowed range.
    markers
        The genes (column indices) whose cluster-level counts were used, best first.
    rho_half_max
        The range of fractions whose posterior density is at least half its maximum.
    posterior
        The posterior density on :data:`RHO_PROBES`.
    estimates
        One row per (marker, cluster): ``gene``, ``cluster`` (label), ``observed`` and
        ``expected`` soup counts (at a fraction of 1), their ratio ``rho`` and ``used``
        (the cluster shows no sign of expressing the gene, so it estimates the soup).
    """

    rho: float
    markers: list[int]
    rho_half_max: tuple[float, float]
    posterior: np.ndarray
    estimates: pd.DataFrame


def _benjamini_hochberg(p_values: np.ndarray, *, axis: int) -> np.ndarray:
    return np.asarray(stats.false_discovery_control(p_values, method="bh", axis=axis))


def _cluster_sums(cluster_of: np.ndarray, n_clusters: int, matrix: sparse.csr_matrix) -> np.ndarray:
    """Dense clusters x genes sums of ``matrix``'s rows."""
    membership = sparse.csr_matrix(
        (np.ones(cluster_of.size), (cluster_of, np.arange(cluster_of.size))), shape=(n_clusters, cluster_of.size)
    )
    return np.asarray((membership @ matrix).toarray())


def _marker_scores(cells: sparse.csr_matrix, cluster_of: np.ndarray, n_clusters: int) -> np.ndarray:
    """Each gene's best tf-idf over the clusters where it is a marker (SoupX ``quickMarkers``); -inf where none.

    A gene is a marker of a cluster where the hypergeometric test of the cluster's expressing
    cells passes :data:`MARKER_FDR` (BH over all genes, per cluster).
    """
    expressed = (cells > EXPRESS_CUT).astype(np.float64)
    n_expressing = _cluster_sums(cluster_of, n_clusters, expressed)
    cluster_sizes = np.bincount(cluster_of, minlength=n_clusters)[:, None]
    n_cells = cells.shape[0]
    total_expressing = n_expressing.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        tfidf = n_expressing / cluster_sizes * np.log(n_cells / total_expressing)
    # The test sums many terms per gene and cluster: it is run only where the cluster has more
    # expressing cells than expected. Elsewhere the p-value is at least 1/2 (the median of a
    # hypergeometric is its mean rounded), far above MARKER_FDR, and 1 there keeps BH's calls.
    p_values = np.ones_like(n_expressing)
    enriched = np.nonzero(n_expressing * n_cells > total_expressing * cluster_sizes)
    p_values[enriched] = stats.hypergeom.sf(
        n_expressing[enriched] - 1, n_cells, total_expressing[enriched[1]], cluster_sizes[enriched[0], 0]
    )
    is_marker = _benjamini_hochberg(p_values, axis=1) < MARKER_FDR
    return np.where(is_marker, tfidf, -np.inf).max(axis=0, initial=-np.inf)


def _non_expressing(
    cells: sparse.csr_matrix,
    soup: np.ndarray,
    *,
    markers: np.ndarray,
    cluster_of: np.ndarray,
    n_clusters: int,
    max_contamination: float,
    fdr: float,
) -> np.ndarray:
    """Clusters x markers: no cell of the cluster has more of the marker than soup alone allows.

    SoupX ``estimateNonExpressingCells``: a cell expresses a gene when its count exceeds the
    soup's at ``max_contamination`` (Poisson, BH over cells per gene, at ``fdr``).
    """
    counts = cells[:, markers].toarray()
    totals = np.asarray(cells.sum(axis=1, dtype=np.float64))
    expected = totals * max_contamination * soup[markers]
    q_values = _benjamini_hochberg(stats.poisson.sf(counts - 1, expected), axis=0)
    lowest = np.full((n_clusters, markers.size), np.inf)
    np.minimum.at(lowest, cluster_of, q_values)
    return lowest >= fdr


def estimate_contamination(
    cells: sparse.csr_matrix,
    soup: np.ndarray,
    *,
    clusters: np.ndarray,
    tfidf_min: float = 1.0,
    soup_quantile: float = 0.9,
    max_markers: int = 100,
    contamination_range: tuple[float, float] = (0.01, 0.8),
    rho_max_fdr: float = 0.2,
    prior_rho: float = 0.05,
    prior_rho_std_dev: float = 0.10,
) -> ContaminationEstimate:
    """The global contamination fraction, as SoupX ``autoEstCont`` estimates it.

    Markers (tf-idf above ``tfidf_min``) that are among the soup's most abundant genes (above
    its ``soup_quantile``) give, in each cluster that does not express them, an estimate of
    the fraction: observed over expected soup counts. A gamma prior (mode ``prior_rho``,
    standard deviation ``prior_rho_std_dev``) turns each into a posterior; their mean's mode
    within ``contamination_range`` is the estimate.

    Parameters
    ----------
    cells
        Called cells x genes counts.
    soup
        The soup profile (:func:`soup_profile`).
    clusters
        A cluster label per cell.
    tfidf_min
        Markers need a tf-idf above this.
    soup_quantile
        Markers need a soup share above this quantile of the profile.
    max_markers
        The best this many markers are used.
    contamination_range
        The fraction is sought within this range; its upper end is the largest contamination
        a cluster's counts may be explained by before the cluster counts as expressing.
    rho_max_fdr
        The FDR of the test that a cluster expresses a marker.
    prior_rho, prior_rho_std_dev
        The mode and standard deviation of the gamma prior.

    Returns
    -------
    The estimate, with the markers and per-cluster estimates behind it.

    Raises
    ------
    ValueError
        No marker passes the filters, or no cluster is free of every marker.
    """
    cells = sparse.csr_matrix(cells, dtype=np.float64)
    labels, cluster_of = np.unique(np.asarray(clusters), return_inverse=True)
    n_clusters = labels.size
    scores = _marker_scores(cells, cluster_of, n_clusters)
    candidates = np.flatnonzero((scores > tfidf_min) & (soup > np.quantile(soup, soup_quantile)))
    # Best first; equal scores in gene order, as SoupX's stable sort of name-sorted genes.
    markers = candidates[np.argsort(-scores[candidates], kind="stable")][:max_markers]
    log.info(
        "SoupX markers: %d pass tf-idf > %g, %d also the soup quantile; taking %d",
        np.count_nonzero(scores > tfidf_min),
        tfidf_min,
        candidates.size,
        markers.size,
    )
    if markers.size == 0:
        msg = "no plausible marker genes: is the sample low in complexity? Otherwise lower tfidf_min or soup_quantile"
        raise ValueError(msg)
    if markers.size < FEW_ESTIMATES:
        log.warning("only %d SoupX marker genes: the contamination estimate may be unstable", markers.size)
    used = _non_expressing(
        cells,
        soup,
        markers=markers,
        cluster_of=cluster_of,
        n_clusters=n_clusters,
        max_contamination=max(contamination_range),
        fdr=rho_max_fdr,
    )
    observed = _cluster_sums(cluster_of, n_clusters, cells[:, markers])
    cluster_totals = np.bincount(cluster_of, weights=np.asarray(cells.sum(axis=1)).ravel(), minlength=n_clusters)
    expected = np.outer(cluster_totals, soup[markers])
    if not used.any():
        msg = "every cluster expresses every marker: no contamination estimate (set rho by hand)"
        raise ValueError(msg)
    if used.sum() < FEW_ESTIMATES:
        log.warning("only %d cluster-level estimates of rho: the estimate may be unstable", used.sum())
    # Gamma prior of mode prior_rho and sd prior_rho_std_dev, parametrised as SoupX does.
    variance_ratio = (prior_rho_std_dev / prior_rho) ** 2
    shape = 1 + variance_ratio**-2 / 2 * (1 + np.sqrt(1 + 4 * variance_ratio))
    scale = prior_rho / (shape - 1)
    posterior = stats.gamma.pdf(
        RHO_PROBES[:, None], shape + observed[used], scale=scale / (1 + scale * expected[used])
    ).mean(axis=1)
    lowest, highest = contamination_range
    in_range = (lowest <= RHO_PROBES) & (highest >= RHO_PROBES)
    probes, density = RHO_PROBES[in_range], posterior[in_range]
    half_max = probes[density >= density.max() / 2]
    cluster_index, marker_index = np.indices(used.shape)
    estimates = pd.DataFrame(
        {
            "gene": markers[marker_index.ravel()],
            "cluster": labels[cluster_index.ravel()],
            "observed": observed.ravel(),
            "expected": expected.ravel(),
            "rho": observed.ravel() / expected.ravel(),
            "used": used.ravel(),
        }
    )
    return ContaminationEstimate(
        rho=float(probes[np.argmax(density)]),
        markers=markers.tolist(),
        rho_half_max=(float(half_max.min()), float(half_max.max())),
        posterior=posterior,
        estimates=estimates,
    )


def _water_fill(xp: Any, *, groups: Any, limits: Any, weights: Any, targets: Any) -> Any:
    """Share each group's target among its entries by weight, none beyond its limit (SoupX ``alloc``).

    Entries whose share would pass their limit get the limit, and what they could not take
    goes to the rest by weight; solved at once for all groups: entries sorted by
    limit/weight saturate in that order, entry i once the target reaches
    ``limit_i / weight_i * (weight left from i on) + limits before i``.

    Parameters
    ----------
    xp
        NumPy or CuPy.
    groups
        A group label (integer) per entry.
    limits
        Each entry's limit (positive).
    weights
        Each entry's weight (not negative; need not sum to 1).
    targets
        Each entry's group's target (alike within a group).

    Returns
    -------
    Each entry's share.
    """
    if limits.size == 0:
        return xp.zeros(0)
    weighted = weights > 0
    ratio = xp.where(weighted, limits / xp.where(weighted, weights, 1.0), xp.inf)
    order = xp.lexsort(xp.stack([ratio, groups.astype(xp.float64)]))  # by group, then ratio
    group_sorted, limit, weight = groups[order], limits[order], weights[order]
    starts_group = xp.concatenate([xp.ones(1, dtype=bool), group_sorted[1:] != group_sorted[:-1]])
    group = xp.cumsum(starts_group) - 1
    first = xp.flatnonzero(starts_group)

    def before_in_group(values: Any) -> Any:
        exclusive = xp.cumsum(values) - values
        return exclusive - exclusive[first][group]

    group_weight = xp.bincount(group, weights=weight)[group]
    saturates_at = xp.where(
        weight > 0, limit / xp.where(weight > 0, weight, 1.0) * (group_weight - before_in_group(weight)), xp.inf
    )
    target = targets[order]
    saturated = saturates_at + before_in_group(limit) <= target
    left_over = target - xp.bincount(group, weights=xp.where(saturated, limit, 0.0))[group]
    weight_left = xp.bincount(group, weights=xp.where(saturated, 0.0, weight))[group]
    share = xp.where(saturated, limit, left_over * weight / xp.where(weight_left > 0, weight_left, 1.0))
    shares = xp.empty_like(share)
    shares[order] = share
    return shares


def remove_soup(
    cells: sparse.csr_matrix,
    soup: np.ndarray,
    *,
    rho: float | np.ndarray,
    clusters: np.ndarray | None = None,
    backend: Backend = "cpu",
) -> sparse.csr_matrix:
    """The counts less their soup: SoupX ``adjustCounts(method="subtraction", roundToInt=FALSE)``.

    Each cell (or cluster) loses ``rho`` times its total count, shared among its genes by the
    soup profile and never more than a gene's count. With clusters, as SoupX recommends, the
    soup is removed from each cluster's pooled counts, and each gene's removed counts are
    then spread over the cluster's cells that have it, by their expected soup (total x rho),
    again capped at their counts.

    Parameters
    ----------
    cells
        Called cells x genes counts.
    soup
        The soup profile (:func:`soup_profile`).
    rho
        The contamination fraction: one, or one per cell.
    clusters
        A cluster label per cell; ``None`` corrects every cell alone.
    backend
        ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy): the same computation.

    Returns
    -------
    Corrected cells x genes (float64, CSR, in host memory; zeros dropped).
    """
    xp = array_module(backend)
    host = sparse.csr_matrix(cells, dtype=np.float64, copy=True)  # its structure is reused, then pruned
    host.sum_duplicates()
    matrix = cupyx_sparse().csr_matrix(host) if backend == "gpu" else host
    n_cells, n_genes = matrix.shape
    entries = matrix.tocoo()
    row, gene, count = entries.row, entries.col, entries.data
    expected_soup = xp.bincount(row, weights=count, minlength=n_cells) * xp.asarray(rho, dtype=xp.float64)
    soup_share = xp.asarray(soup, dtype=xp.float64)
    if clusters is None:
        removed = _water_fill(xp, groups=row, limits=count, weights=soup_share[gene], targets=expected_soup[row])
    else:
        cluster_of = xp.asarray(np.unique(np.asarray(clusters), return_inverse=True)[1])
        n_clusters = int(cluster_of.max()) + 1
        # (cluster, gene) pairs flattened: pooled counts, then the soup removed from each.
        pair = cluster_of[row] * n_genes + gene
        pooled = xp.bincount(pair, weights=count, minlength=n_clusters * n_genes)
        present = xp.flatnonzero(pooled)
        cluster_soup = xp.bincount(cluster_of, weights=expected_soup, minlength=n_clusters)
        pooled_removed = xp.zeros_like(pooled)
        pooled_removed[present] = _water_fill(
            xp,
            groups=present // n_genes,
            limits=pooled[present],
            weights=soup_share[present % n_genes],
            targets=cluster_soup[present // n_genes],
        )
        removed = _water_fill(xp, groups=pair, limits=count, weights=expected_soup[row], targets=pooled_removed[pair])
    # tocoo keeps the CSR order of the entries, so the structure is reused.
    corrected = type(matrix)((xp.maximum(count - removed, 0.0), matrix.indices, matrix.indptr), shape=matrix.shape)
    corrected = asnumpy(corrected).tocsr()
    corrected.eliminate_zeros()
    return corrected
