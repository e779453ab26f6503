"""EmptyDrops' Monte Carlo as one Numba source, compiled for the CPU and for CUDA.

:func:`build` takes a decorator (``numba.njit`` or ``numba.cuda.jit(device=True)``) and an
``increment(hist, slot, index)`` and returns ``simulate_iteration`` compiled with it, so both
backends draw the same ambient droplets and count identically.

Random numbers come from Philox4x32-10, a counter-based generator: the key is the seed and the
counter is (draw, iteration), so a draw does not depend on which thread makes it or in which
order. One Philox block serves one draw: word 0 picks an alias-table column, word 1 decides
between the column and its alias, and for a Dirichlet-multinomial (finite alpha) words 2 and 3
run a Pólya urn (a fresh ambient draw with probability ``alpha / (alpha + k)`` after ``k``
draws, else a copy of a uniformly chosen earlier draw). The urn draws exactly the
Dirichlet-multinomial that DropletUtils samples by drawing Gamma proportions per iteration, at
O(1) per draw instead of O(genes) per iteration.

Like DropletUtils' ``montecarlo_pval``, an iteration adds draws to one ambient droplet until
each tested total is reached, updating the log-probability per draw, and counts, per tested
total, where that log-probability falls among the sorted observed ones (``hist``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numba
import numpy as np

MASK32 = np.uint64(0xFFFFFFFF)
SHIFT32 = np.uint64(32)
PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = np.uint64(0x9E3779B9)
PHILOX_W1 = np.uint64(0xBB67AE85)
PHILOX_ROUNDS = 10
TO_UNIT = 1.0 / 4294967296.0  # a 32-bit word to [0, 1)


def build(jit: Callable, increment: Callable) -> tuple[Callable, Callable]:
    """``(philox, simulate_iteration)`` compiled with ``jit``.

    ``philox(c0, c1, c2, c3, k0, k1) -> (w0, w1, w2, w3)``: Philox4x32-10 of a 128-bit counter
    under a 64-bit key, every word a 32-bit value held in a uint64.

    ``simulate_iteration(iteration, key0, key1, alias_prob, alias_index, log_ambient,
    alpha_ambient, alpha, use_alpha, log_count, group_totals, group_starts, sorted_p, tracker,
    drawn, slot, hist)``: one simulated ambient droplet. ``group_totals`` are the distinct tested
    totals, ascending; ``sorted_p[group_starts[g]:group_starts[g + 1]]`` the observed
    log-probabilities (data part) of total ``group_totals[g]``, ascending. ``tracker[slot]``
    (zeros, length genes) and ``drawn[slot]`` (length of the largest total) are the scratch of
    this iteration; ``tracker[slot]`` is zero again on return.
    """

    @jit
    def philox(c0, c1, c2, c3, k0, k1):
        for _ in range(PHILOX_ROUNDS):
            product0 = PHILOX_M0 * c0
            product1 = PHILOX_M1 * c2
            c0, c1, c2, c3 = (
                (product1 >> SHIFT32) ^ c1 ^ k0,
                product1 & MASK32,
                (product0 >> SHIFT32) ^ c3 ^ k1,
                product0 & MASK32,
            )
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        return c0, c1, c2, c3

    @jit
    def draw_gene(draw, iteration, key0, key1, alias_prob, alias_index, alpha, use_alpha, drawn, slot):
        w0, w1, w2, w3 = philox(np.uint64(draw), np.uint64(iteration), np.uint64(0), np.uint64(0), key0, key1)
        if use_alpha and float(w2) * TO_UNIT * (alpha + draw) >= alpha:
            return drawn[slot, np.int64((w3 * np.uint64(draw)) >> SHIFT32)]
        column = np.int64((w0 * np.uint64(alias_prob.size)) >> SHIFT32)
        if float(w1) * TO_UNIT < alias_prob[column]:
            return column
        return alias_index[column]

    @jit
    def simulate_iteration(
        iteration,
        key0,
        key1,
        alias_prob,
        alias_index,
        log_ambient,
        alpha_ambient,
        alpha,
        use_alpha,
        log_count,
        group_totals,
        group_starts,
        sorted_p,
        tracker,
        drawn,
        slot,
        hist,
    ):
        log_p = 0.0
        n_drawn = 0
        for group in range(group_totals.size):
            while n_drawn < group_totals[group]:
                gene = draw_gene(n_drawn, iteration, key0, key1, alias_prob, alias_index, alpha, use_alpha, drawn, slot)
                count = tracker[slot, gene]
                if use_alpha:
                    log_p += math.log(alpha_ambient[gene] + count)  # ratio of Gammas in the Dirichlet-multinomial
                else:
                    log_p += log_ambient[gene]
                log_p -= log_count[count + 1]  # the observed count's factorial
                tracker[slot, gene] = count + 1
                drawn[slot, n_drawn] = gene
                n_drawn += 1
            lo = group_starts[group]
            hi = group_starts[group + 1]
            while lo < hi:  # lower bound of log_p among the observed
                mid = (lo + hi) // 2
                if sorted_p[mid] < log_p:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < group_starts[group + 1]:
                increment(hist, slot, lo)
        for draw in range(n_drawn):
            tracker[slot, drawn[slot, draw]] = 0

    return philox, simulate_iteration


@numba.njit(cache=True, inline="always")
def _increment_own_row(hist, slot, index):
    hist[slot, index] += 1


# Inlined at Numba IR level: the per-draw calls otherwise cost more than the draw (2.4x measured).
philox, simulate_iteration = build(numba.njit(cache=True, inline="always"), _increment_own_row)


@numba.njit(cache=True, parallel=True)
def _count_cpu(
    niters,
    n_chunks,
    key0,
    key1,
    alias_prob,
    alias_index,
    log_ambient,
    alpha_ambient,
    alpha,
    use_alpha,
    log_count,
    group_totals,
    group_starts,
    sorted_p,
):
    n_genes = alias_prob.size
    hist = np.zeros((n_chunks, sorted_p.size), dtype=np.int64)
    tracker = np.zeros((n_chunks, n_genes), dtype=np.int32)
    drawn = np.empty((n_chunks, max(group_totals[-1], 1)), dtype=np.int32)
    for chunk in numba.prange(n_chunks):
        for iteration in range(chunk * niters // n_chunks, (chunk + 1) * niters // n_chunks):
            simulate_iteration(
                iteration,
                key0,
                key1,
                alias_prob,
                alias_index,
                log_ambient,
                alpha_ambient,
                alpha,
                use_alpha,
                log_count,
                group_totals,
                group_starts,
                sorted_p,
                tracker,
                drawn,
                chunk,
                hist,
            )
    return hist.sum(axis=0)


def simulation_inputs(
    ambient: np.ndarray, alpha: float, group_totals: np.ndarray, group_sizes: np.ndarray, sorted_p: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The arrays :func:`count_cpu` and the CUDA launch take after ``alpha``.

    ``ambient``: proportions per gene (all positive); ``group_totals``: the distinct tested totals,
    ascending, with ``group_sizes`` barcodes each; ``sorted_p``: the observed log-probabilities
    (data part), by total then ascending. Returns ``alias_prob, alias_index, log_ambient,
    alpha_ambient, log_count, group_totals, group_starts, sorted_p`` as :func:`build` names them.
    """
    alias_prob, alias_index = alias_table(ambient)
    log_count = np.concatenate(([0.0], np.log(np.arange(1, int(group_totals[-1]) + 1, dtype=float))))
    return (
        alias_prob,
        alias_index,
        np.log(ambient),
        ambient * alpha if math.isfinite(alpha) else ambient,
        log_count,
        group_totals.astype(np.int64),
        np.concatenate(([0], np.cumsum(group_sizes))).astype(np.int64),
        sorted_p.astype(np.float64),
    )


def philox_key(seed: int) -> tuple[int, int]:
    """The 64-bit Philox key of ``seed``, as two 32-bit words."""
    return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


def count_cpu(niters: int, key: tuple[int, int], alpha: float, *inputs: np.ndarray) -> np.ndarray:
    """Per sorted observation, the simulations landing at it (the lower bound), on all CPU cores.

    ``inputs``: from :func:`simulation_inputs`.
    """
    alias_prob, alias_index, log_ambient, alpha_ambient, log_count, group_totals, group_starts, sorted_p = inputs
    n_chunks = max(1, min(niters, numba.get_num_threads()))
    return _count_cpu(
        niters,
        n_chunks,
        np.uint64(key[0]),
        np.uint64(key[1]),
        alias_prob,
        alias_index,
        log_ambient,
        alpha_ambient,
        alpha,
        math.isfinite(alpha),
        log_count,
        group_totals,
        group_starts,
        sorted_p,
    )


@numba.njit(cache=True)
def alias_table(prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of ``prob`` (Vose's construction): acceptance and alias per column."""
    n = prob.size
    scaled = prob * (n / prob.sum())
    accept = np.ones(n)
    alias = np.arange(n).astype(np.int32)
    small = np.empty(n, dtype=np.int64)
    large = np.empty(n, dtype=np.int64)
    n_small = 0
    n_large = 0
    for i in range(n):
        if scaled[i] < 1.0:
            small[n_small] = i
            n_small += 1
        else:
            large[n_large] = i
            n_large += 1
    while n_small and n_large:
        n_small -= 1
        s = small[n_small]
        g = large[n_large - 1]
        accept[s] = scaled[s]
        alias[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        if scaled[g] < 1.0:
            n_large -= 1
            small[n_small] = g
            n_small += 1
    return accept, alias
