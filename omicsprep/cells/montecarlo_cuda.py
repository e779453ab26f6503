"""The CUDA launch of EmptyDrops' Monte Carlo: one thread per iteration.

Compiled from the same source as the CPU kernel (:mod:`omicsprep.cells.montecarlo`), with the
same counter-based random numbers, so both backends give identical counts for a seed. Imported
only on the GPU path (or under Numba's CUDA simulator, which the tests use to compare the
kernels on machines without a GPU).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

from numba import cuda

from omicsprep.cells import montecarlo

# One warp per block: an iteration is one long serial chain of draws, so spreading the iterations
# over every SM (10,000 iterations: 313 blocks for the H200's 132 SMs, not 79 of 128) beats filling some.
THREADS_PER_BLOCK = 32
SCRATCH_BYTES = 4 << 30  # per launch: iterations run in batches whose trackers fit


@cuda.jit(device=True)
def _increment_shared(hist, slot, index):
    cuda.atomic.add(hist, index, 1)


_, _simulate_iteration = montecarlo.build(cuda.jit(device=True), _increment_shared)


@cuda.jit(cache=True)
def _count_kernel(
    first,
    n_iterations,
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
    hist,
):
    slot = cuda.grid(1)
    if slot < n_iterations:
        _simulate_iteration(
            first + slot,
            key0,
            key1,
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
            tracker,
            drawn,
            slot,
            hist,
        )


def count_gpu(niters: int, key: tuple[int, int], alpha: float, *inputs: Any, xp: ModuleType) -> Any:
    """:func:`omicsprep.cells.montecarlo.count_cpu` on the GPU; ``xp`` is CuPy (NumPy under the simulator)."""
    device = [xp.asarray(array) for array in inputs]
    alias_prob, alias_index, log_ambient, alpha_ambient, log_count, group_totals, group_starts, sorted_p = device
    max_total = max(int(group_totals[-1]), 1)
    batch = max(1, min(niters, SCRATCH_BYTES // (4 * (alias_prob.size + max_total))))
    tracker = xp.zeros((batch, alias_prob.size), dtype=xp.int32)  # kernels leave it zero
    drawn = xp.empty((batch, max_total), dtype=xp.int32)
    hist = xp.zeros(sorted_p.size, dtype=xp.int64)
    for first in range(0, niters, batch):
        n_iterations = min(batch, niters - first)
        blocks = (n_iterations + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
        _count_kernel[blocks, THREADS_PER_BLOCK](
            first,
            n_iterations,
            xp.uint64(key[0]),
            xp.uint64(key[1]),
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
            tracker,
            drawn,
            hist,
        )
    return hist
