"""The CUDA kernel of UMI deduplication: one thread per group (one cell and gene).

Compiled from the same source as the CPU kernel (:mod:`omicsprep.reads.umi_kernels`), so the two
count identically. Imported only on the GPU path (or under Numba's CUDA simulator, which
the tests use to compare the kernels on machines without a GPU).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from numba import cuda

from omicsprep.reads import umi_kernels

_count_group = umi_kernels.build(cuda.jit(device=True))
THREADS_PER_BLOCK = 128


@cuda.jit(cache=True)
def _count_groups_kernel(umis, counts, starts, order, method, threshold, component, stack, mark, covered, molecules):
    k = cuda.grid(1)
    if k < order.size:
        g = order[k]
        molecules[g] = _count_group(
            umis, counts, starts[g], starts[g + 1], method, threshold, component, stack, mark, covered
        )


def count_groups_gpu(umis: Any, counts: Any, starts: Any, method: int, threshold: int, *, xp: ModuleType) -> Any:
    """Molecules in every group, on the GPU; arguments as :func:`omicsprep.reads.umi.count_groups`.

    ``xp`` is the array module of the arguments and the result: CuPy, or NumPy under the
    simulator.
    """
    n_groups = starts.size - 1
    # Largest groups first: they take longest, and groups of like size then share a warp.
    order = xp.argsort(starts[:-1] - starts[1:]).astype(xp.int64)
    molecules = xp.empty(n_groups, dtype=xp.int64)
    scratch = [xp.empty(umis.size, dtype=xp.int32) for _ in range(3)] + [xp.empty(umis.size, dtype=xp.uint8)]
    blocks = (n_groups + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    _count_groups_kernel[blocks, THREADS_PER_BLOCK](umis, counts, starts, order, method, threshold, *scratch, molecules)
    return molecules
