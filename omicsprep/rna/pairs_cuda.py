"""One pass over all pairs of cells on the GPU: each cell's summed distance to each label, and the cells near it.

The silhouettes (scIB) need every cell's summed distance to the cells of each label; exact
neighbours need, for each cell, the cells within a bound of its k-th nearest distance
(:mod:`omicsprep.rna.neighbors_cuda`). A million cells are 10^12 pairs. As matrix products
(the CPU's way, in :func:`omicsprep.rna.integration_scores.silhouette_samples`) each block of
distances is written to device memory and read back, several terabytes of memory traffic per
pass (9 s a million cells for the neighbours' pass on an H100). Here each thread holds a few
cells' coordinates and walks a chunk of the other cells, sorted by label, adding their distances
in float64 and each label's sum to the result once, and keeping the cells within its bound: only
coordinates are read, and scIB's neighbours and silhouettes of an embedding come from one pass.
Imported on the GPU path only (or under Numba's CUDA simulator, which the tests use on machines
without a GPU).
"""

from __future__ import annotations

import math
from functools import cache
from types import ModuleType
from typing import Any, NamedTuple

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


class PairSums(NamedTuple):
    """What a pass over all pairs gives, in the cells' order.

    ``sums``: cells x labels, each cell's summed distance to each label's cells (float64).
    ``counts``: each cell's cells within its bound, itself among them; ``candidates``: cells x
    the most kept, their indices (-1 after a row's last; a row whose count is larger keeps some).
    Both None in a pass without bounds.
    """

    sums: Any
    counts: Any
    candidates: Any


@cache
def _pairs_kernel(width: int, *, find_candidates: bool) -> Any:
    """The kernel for ``width`` coordinates, a constant: a thread's cells in registers, the loops unrolled.

    (With the width read at run time, a thread's coordinates sat in local memory and a pair
    cost some 28 instructions per dimension; compiled for sm_90, 2026-12-06.) A block holds
    ``cells_per_thread(width)`` runs of consecutive cells, one per thread in each (coalesced loads).
    ``find_candidates``, a constant too: whether the pass keeps each cell's cells within its
    squared-distance limit (Euclidean only).
    """
    held = cells_per_thread(width)

    @cuda.jit
    def pairs(points, codes, chunk, cosine, limits, counts, candidates, sums):
        n_cells = points.shape[0]
        first_cell = cuda.blockIdx.x * cuda.blockDim.x * held + cuda.threadIdx.x
        if first_cell >= n_cells:
            return
        own = cuda.local.array((held, width), numba.float32)
        totals = cuda.local.array(held, numba.float64)
        pair = cuda.local.array(held, numba.float32)
        limit = cuda.local.array(held, numba.float32)
        for j in range(held):
            cell = first_cell + j * cuda.blockDim.x
            limit[j] = -1.0  # a cell past the last keeps none
            for k in range(width):
                own[j, k] = 0.0
                if cell < n_cells:  # a branch, not a select: no load past the last cell
                    own[j, k] = points[cell, k]
            if find_candidates and cell < n_cells:
                limit[j] = limits[cell]
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
                    if find_candidates and pair[j] <= limit[j]:
                        cell = first_cell + j * cuda.blockDim.x
                        slot = cuda.atomic.add(counts, cell, 1)
                        if slot < candidates.shape[1]:
                            candidates[cell, slot] = other
        for j in range(held):
            cell = first_cell + j * cuda.blockDim.x
            if cell < n_cells:
                cuda.atomic.add(sums, (cell, label), totals[j])

    return pairs


def fitting_width(counts: Any, max_candidates: int, *, xp: ModuleType) -> int:
    """The most cells kept by a cell that keeps at most ``max_candidates``: the candidates' width worth holding.

    (One cell over it, searched otherwise, would widen every row to ``max_candidates``.)
    """
    fitting = counts[counts <= max_candidates]
    return int(fitting.max()) if fitting.size else 0


def pair_sums_gpu(
    points: Any,
    codes: Any,
    n_labels: int,
    *,
    cosine: bool,
    xp: ModuleType,
    limits: Any = None,
    max_candidates: int = 0,
) -> PairSums:
    """Each cell's summed distance to each label's cells, and with ``limits`` the cells within them, by the kernel.

    Parameters
    ----------
    points, codes, n_labels, cosine
        As :func:`omicsprep.rna.integration_scores.label_distance_sums` takes them; ``points``
        has at most :data:`MAX_DIMS` coordinates.
    xp
        CuPy (NumPy under the simulator).
    limits
        Each cell's largest squared distance (float32) of a cell it keeps; Euclidean only.
    max_candidates
        The most cells kept a cell.

    Returns
    -------
    The sums (float64) and, with ``limits``, the counts and candidates (int32 indices of ``points``), on the device.
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
    find_candidates = limits is not None
    counts = xp.zeros(n_cells if find_candidates else 1, dtype=xp.int32)
    candidates = xp.full((n_cells, max_candidates) if find_candidates else (1, 1), -1, dtype=xp.int32)
    limits = xp.ascontiguousarray(limits[order], dtype=xp.float32) if find_candidates else counts.astype(xp.float32)
    grid = (-(-n_cells // (THREADS_PER_BLOCK * cells_per_thread(width))), -(-n_cells // chunk))
    _pairs_kernel(width, find_candidates=find_candidates)[grid, THREADS_PER_BLOCK](
        padded, codes, chunk, cosine, limits, counts, candidates, sums
    )
    in_order = xp.empty_like(sums)
    in_order[order] = sums
    if not find_candidates:
        return PairSums(in_order, None, None)
    kept = candidates[:, : fitting_width(counts, max_candidates, xp=xp)]
    # Rows and indices back from the label order to the cells'.
    kept = xp.where(kept >= 0, order.astype(xp.int32)[xp.maximum(kept, 0)], -1)
    in_order_kept, in_order_counts = xp.empty_like(kept), xp.empty_like(counts)
    in_order_kept[order], in_order_counts[order] = kept, counts
    return PairSums(in_order, in_order_counts, in_order_kept)
