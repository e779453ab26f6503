"""The silhouettes' sums on the GPU: each cell's summed distance to the cells of each label.

A million cells are 10^12 pairs. As matrix products (the CPU's way, in
:func:`omicsprep.rna.integration_scores.silhouette_samples`) each block of distances is
written to device memory, read back for the square root and again for the sums per label,
several terabytes of memory traffic per pass. Here each thread holds one cell's coordinates
and walks a chunk of the other cells, sorted by label, adding their distances in float64 and
each label's sum to the result once: only coordinates are read. Imported on the GPU path only
(or under Numba's CUDA simulator, which the tests use on machines without a GPU).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numba
from numba import cuda

MAX_DIMS = 128
"""Coordinates a thread holds; embeddings of more dimensions take the matrix products."""

THREADS_PER_BLOCK = 128
CELLS_PER_CHUNK = 4096  # the other cells a thread walks; a grid's second dimension holds at most 65,535 chunks


@cuda.jit(cache=True)
def _label_sums_kernel(points, codes, n_dims, chunk, cosine, sums):
    cell = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    n_cells = points.shape[0]
    if cell >= n_cells:
        return
    own = cuda.local.array(MAX_DIMS, numba.float32)
    for k in range(n_dims):
        own[k] = points[cell, k]
    first = cuda.blockIdx.y * chunk
    label = codes[first]
    total = 0.0
    for other in range(first, min(first + chunk, n_cells)):
        if codes[other] != label:  # the same for every thread of the block: no divergence
            cuda.atomic.add(sums, (cell, label), total)
            label = codes[other]
            total = 0.0
        accumulated = numba.float32(0.0)
        if cosine:  # unit vectors: 1 - cosine similarity, within [0, 2]
            for k in range(n_dims):
                accumulated += own[k] * points[other, k]
            total += min(max(1.0 - accumulated, 0.0), 2.0)
        else:
            for k in range(n_dims):
                difference = own[k] - points[other, k]
                accumulated += difference * difference
            total += math.sqrt(accumulated)
    cuda.atomic.add(sums, (cell, label), total)


def label_distance_sums_gpu(points: Any, codes: Any, n_labels: int, *, cosine: bool, xp: ModuleType) -> Any:
    """Cells x labels: each cell's summed distance to the cells of each label (itself included, at 0).

    Parameters
    ----------
    points
        Cells x at most :data:`MAX_DIMS` coordinates, float32 (unit rows for ``cosine``).
    codes
        Each cell's label, ``0 .. n_labels - 1``.
    n_labels
        How many labels.
    cosine
        1 - cosine similarity instead of the Euclidean distance.
    xp
        CuPy (NumPy under the simulator).

    Returns
    -------
    The sums, float64, on the device.
    """
    order = xp.argsort(codes, kind="stable")
    points = xp.ascontiguousarray(points[order], dtype=xp.float32)
    codes = xp.ascontiguousarray(codes[order], dtype=xp.int32)
    n_cells = points.shape[0]
    chunk = max(CELLS_PER_CHUNK, -(-n_cells // 65_535))
    sums = xp.zeros((n_cells, n_labels), dtype=xp.float64)
    grid = (-(-n_cells // THREADS_PER_BLOCK), -(-n_cells // chunk))
    _label_sums_kernel[grid, THREADS_PER_BLOCK](points, codes, points.shape[1], chunk, cosine, sums)
    in_order = xp.empty_like(sums)
    in_order[order] = sums
    return in_order
