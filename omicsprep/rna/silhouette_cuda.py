"""The silhouettes' sums on the GPU: each cell's summed distance to the cells of each label.

A million cells are 10^12 pairs. Their dot products come from cuBLAS, a block of cells
against all cells at a time, and a kernel turns each product into a distance and sums them
per label as it reads them: the cells sorted by label, a CUDA block sums one cell's distances
to one label's cells. Each product is written once and read once; the CPU's way
(:func:`omicsprep.rna.integration_scores.label_distance_sums`) also writes the distances and
reads them again for a second product. An earlier kernel that computed each pair's distance
from coordinates held in registers (the products never written) took 8.5 s for 50 dimensions
on an H200: the coordinates' loads, one per dimension and pair for at most four cells a
thread, bound it. Imported on the GPU path only (or under Numba's CUDA simulator, which the
tests use on machines without a GPU).
"""

from __future__ import annotations

import math
from functools import cache
from types import ModuleType
from typing import Any

import numba
from numba import cuda

# The most bytes of one block of products (cells of the block x all cells), float32: a million
# cells are 977 blocks of 1,024, a product and a launch of the kernel each.
PRODUCT_BLOCK_BYTES = 1 << 32
THREADS_PER_BLOCK = 256  # a power of two: the block's sums are halved in turn


@cache
def _segment_sums_kernel(threads: int) -> Any:
    """The kernel for CUDA blocks of ``threads``: block (row, label) sums that row's distances to the label's cells."""

    @cuda.jit
    def segment_sums(products, squares, first_row, bounds, cosine, sums):
        row, label = cuda.blockIdx.x, cuda.blockIdx.y
        thread = cuda.threadIdx.x
        own = squares[first_row + row]
        total = 0.0
        for column in range(bounds[label] + thread, bounds[label + 1], threads):
            product = products[row, column]
            if cosine:  # unit vectors: 1 - cosine similarity, within [0, 2]
                distance = min(max(numba.float32(1.0) - product, numba.float32(0.0)), numba.float32(2.0))
            else:
                distance = math.sqrt(max(own + squares[column] - numba.float32(2.0) * product, numba.float32(0.0)))
            total += numba.float64(distance)
        partial = cuda.shared.array(threads, numba.float64)
        partial[thread] = total
        cuda.syncthreads()
        half = threads // 2
        while half > 0:
            if thread < half:
                partial[thread] += partial[thread + half]
            cuda.syncthreads()
            half //= 2
        if thread == 0:
            sums[first_row + row, label] = partial[0]

    return segment_sums


def label_distance_sums_gpu(points: Any, codes: Any, n_labels: int, *, cosine: bool, xp: ModuleType) -> Any:
    """:func:`omicsprep.rna.integration_scores.label_distance_sums` by cuBLAS and the kernel: float64, on the device.

    ``xp`` is CuPy (NumPy under the simulator).
    """
    order = xp.argsort(codes, kind="stable")
    points = xp.ascontiguousarray(points[order], dtype=xp.float32)
    bounds = xp.searchsorted(codes[order], xp.arange(n_labels + 1)).astype(xp.int64)
    squares = (points * points).sum(axis=1)
    n_cells = points.shape[0]
    sums = xp.zeros((n_cells, n_labels), dtype=xp.float64)
    kernel = _segment_sums_kernel(THREADS_PER_BLOCK)
    block = max(PRODUCT_BLOCK_BYTES // (4 * n_cells), 1)
    for start in range(0, n_cells, block):
        products = points[start : start + block] @ points.T
        kernel[(products.shape[0], n_labels), THREADS_PER_BLOCK](products, squares, start, bounds, cosine, sums)
    in_order = xp.empty_like(sums)
    in_order[order] = sums
    return in_order
