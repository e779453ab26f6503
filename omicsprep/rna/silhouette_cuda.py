"""The silhouettes' sums on the GPU: each cell's summed distance to the cells of each label.

A million cells are 10^12 pairs. As matrix products (the CPU's way, in
:func:`omicsprep.rna.integration_scores.silhouette_samples`) each block of distances is
written to device memory, read back for the square root and again for the sums per label,
several terabytes of memory traffic per pass. Here each thread holds a few cells' coordinates
and walks a chunk of the other cells, sorted by label, adding their distances in float64 and
each label's sum to the result once: only coordinates are read. Imported on the GPU path only
(or under Numba's CUDA simulator, which the tests use on machines without a GPU).
"""

from __future__ import annotations

import math
from functools import cache
from types import ModuleType
from typing import Any

import numba
from numba import cuda

MAX_DIMS = 128
"""Coordinates a thread holds; embeddings of more dimensions take the matrix products."""

DIMS_STEP = 8  # coordinates are zero-padded to a multiple of it: one compiled kernel per width
MAX_CELLS_PER_THREAD = 4  # registers: about 166 a thread at widths 32-56 (ptxas, sm_90), no spills
THREADS_PER_BLOCK = 128
CELLS_PER_CHUNK = 4096  # the other cells a thread walks; a grid's second dimension holds at most 65,535 chunks


def cells_per_thread(width: int) -> int:
    """The cells a thread holds: up to :data:`MAX_DIMS` coordinates, each other cell's read once for all.

    A pair costs a load, a subtraction and a multiply-add per dimension. With one cell a thread
    (12.7 s for 50 dimensions at a million cells, one H100) the loads are the likely bound, an
    estimate from instruction throughput, not a profile: held for 2 to 4 cells, each load
    serves them all.
    """
    return max(1, min(MAX_CELLS_PER_THREAD, MAX_DIMS // width))


@cache
def _label_sums_kernel(width: int) -> Any:
    """The kernel for ``width`` coordinates, a constant: a thread's cells in registers, the loops unrolled.

    (With the width read at run time, a thread's coordinates sat in local memory and a pair
    cost some 28 instructions per dimension; compiled for sm_90, 2026-12-06.) A block holds
    ``cells_per_thread(width)`` runs of consecutive cells, one per thread in each (coalesced loads).
    """
    held = cells_per_thread(width)

    @cuda.jit
    def label_sums(points, codes, chunk, cosine, sums):
        n_cells = points.shape[0]
        first_cell = cuda.blockIdx.x * cuda.blockDim.x * held + cuda.threadIdx.x
        if first_cell >= n_cells:
            return
        own = cuda.local.array((held, width), numba.float32)
        totals = cuda.local.array(held, numba.float64)
        pair = cuda.local.array(held, numba.float32)
        for j in range(held):
            cell = first_cell + j * cuda.blockDim.x
            for k in range(width):
                own[j, k] = 0.0
                if cell < n_cells:  # a branch, not a select: no load past the last cell
                    own[j, k] = points[cell, k]
            totals[j] = 0.0
        first = cuda.blockIdx.y * chunk
        last = first + chunk
        if last > n_cells:
            last = n_cells
        label = codes[first]
        for other in range(first, last):
            if codes[other] != label:  # the same for every thread of the block: no divergence
                for j in range(held):
                    cell = first_cell + j * cuda.blockDim.x
                    if cell < n_cells:
                        cuda.atomic.add(sums, (cell, label), totals[j])
                    totals[j] = 0.0
                label = codes[other]
            for j in range(held):
                pair[j] = 0.0
            if cosine:  # unit vectors: 1 - cosine similarity, within [0, 2]
                for k in range(width):
                    coordinate = points[other, k]
                    for j in range(held):
                        pair[j] += own[j, k] * coordinate
                for j in range(held):
                    distance = 1.0 - pair[j]
                    if distance < 0.0:
                        distance = 0.0
                    elif distance > 2.0:
                        distance = 2.0
                    totals[j] += distance
            else:
                for k in range(width):
                    coordinate = points[other, k]
                    for j in range(held):
                        difference = own[j, k] - coordinate
                        pair[j] += difference * difference
                for j in range(held):
                    totals[j] += math.sqrt(pair[j])
        for j in range(held):
            cell = first_cell + j * cuda.blockDim.x
            if cell < n_cells:
                cuda.atomic.add(sums, (cell, label), totals[j])

    return label_sums


def label_distance_sums_gpu(points: Any, codes: Any, n_labels: int, *, cosine: bool, xp: ModuleType) -> Any:
    """:func:`omicsprep.rna.integration_scores.label_distance_sums` by the kernel: float64 sums, on the device.

    ``points`` has at most :data:`MAX_DIMS` coordinates; ``xp`` is CuPy (NumPy under the simulator).
    """
    order = xp.argsort(codes, kind="stable")
    n_cells, n_dims = points.shape
    width = -(-n_dims // DIMS_STEP) * DIMS_STEP
    # Sorted by label (a thread adds a label's sum once); zeros change no distance nor dot product.
    padded = xp.zeros((n_cells, width), dtype=xp.float32)
    padded[:, :n_dims] = points[order]
    codes = xp.ascontiguousarray(codes[order], dtype=xp.int32)
    chunk = max(CELLS_PER_CHUNK, -(-n_cells // 65_535))
    sums = xp.zeros((n_cells, n_labels), dtype=xp.float64)
    grid = (-(-n_cells // (THREADS_PER_BLOCK * cells_per_thread(width))), -(-n_cells // chunk))
    _label_sums_kernel(width)[grid, THREADS_PER_BLOCK](padded, codes, chunk, cosine, sums)
    in_order = xp.empty_like(sums)
    in_order[order] = sums
    return in_order
