"""Each cell's candidates for its exact nearest neighbours on the GPU: the cells within a bound of its k-th distance.

A brute-force search of a million cells' 90 nearest (cuML's, through cuVS) writes every
distance and selects from each row of a million; above 64 neighbours it has no fused kernel.
Here an approximate search (cuML's IVF-Flat) finds k cells for each cell, whose farthest, its
distance computed again in float64, bounds the k-th nearest distance from above; then one pass
of matrix products (cuBLAS, a block of cells against all at a time) and a kernel that reads
each product once keep the cells within the bound (plus float32's rounding of
``|x|^2 + |y|^2 - 2xy``, bounded per pair). Every one of the k nearest is among them, whatever
the approximate search missed: :func:`omicsprep.rna.embedding.exact_neighbors` orders them by
exact distances. A cell with more candidates than :data:`MAX_CANDIDATES` (a bound far off, or
many cells at one distance) is searched by brute force. Imported on the GPU path only (or under
Numba's CUDA simulator, which the tests use on machines without a GPU).
"""

from __future__ import annotations

import math
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np
from numba import cuda

from omicsprep.rna.distances import squared_distances_to

MAX_CANDIDATES = 256
"""The most candidates kept for a cell (int32 each); a cell with more is searched by brute force."""
# The most bytes of one block of products (cells of the block x all cells), float32.
PRODUCT_BLOCK_BYTES = 1 << 32
THREADS_PER_BLOCK = 256
COLUMNS_PER_THREAD = 16  # a CUDA block's share of a row: THREADS_PER_BLOCK x this many cells
UNIT_ROUNDOFF = 2.0**-24  # float32's
TWO = np.float32(2)  # Numba takes a global by its type: the kernel's arithmetic stays in float32


def rounding_margin(n_dims: int) -> np.float32:
    """The most float32 moves a squared distance from products, as a share of ``|x|^2 + |y|^2``.

    Each of ``|x|^2``, ``|y|^2`` and ``xy`` summed over ``d`` coordinates in any order is within
    ``d`` unit roundoffs of its own scale, the sum and difference add 3 and the centring of the
    coordinates 4 (worst cases, Higham's bounds): ``2d + 7``, and 1 spare.
    """
    return np.float32((2 * n_dims + 8) * UNIT_ROUNDOFF)


@cache
def _within_bounds_kernel() -> Any:
    """Block (row, chunk of columns): the columns whose squared distance from the row is within its bound."""

    @cuda.jit
    def within_bounds(products, squares, first_row, bounds, rounding, counts, candidates):
        row = cuda.blockIdx.x
        cell = first_row + row
        own, bound = squares[cell], bounds[cell]
        n_cells, capacity = squares.shape[0], candidates.shape[1]
        first = cuda.blockIdx.y * cuda.blockDim.x * COLUMNS_PER_THREAD + cuda.threadIdx.x
        last = min(first + cuda.blockDim.x * COLUMNS_PER_THREAD, n_cells)
        for column in range(first, last, cuda.blockDim.x):
            pair = own + squares[column]
            if pair - TWO * products[row, column] <= bound + rounding * pair:
                slot = cuda.atomic.add(counts, cell, 1)
                if slot < capacity:
                    candidates[cell, slot] = column

    return within_bounds


def _ivf_settings(n_cells: int) -> dict[str, int]:
    """The IVF-Flat search's lists (about the square root of the cells) and those probed per cell."""
    lists = max(1, math.isqrt(n_cells))
    return {"nlist": lists, "nprobe": min(lists, max(8, lists // 32))}


def _upper_bounds(points: Any, n_neighbors: int, *, xp: ModuleType, cuml: Any) -> Any:
    """Each cell's squared distance, in float64, to the farthest of ``n_neighbors`` cells an approximate search found.

    Any ``n_neighbors`` distinct cells bound the ``n_neighbors``-th nearest distance from above;
    a cell for which the search found fewer gets no bound (infinity).
    """
    search = cuml.neighbors.NearestNeighbors(
        n_neighbors=n_neighbors, algorithm="ivfflat", algo_params=_ivf_settings(points.shape[0])
    )
    found = xp.asarray(search.fit(points).kneighbors(points, return_distance=False)).astype(xp.int64)
    # Cells of the data, each once (a search short of cells may fill its rows with -1 or repeats).
    in_order = xp.sort(found, axis=1)
    valid = (in_order[:, 0] >= 0) & (in_order[:, -1] < points.shape[0]) & (xp.diff(in_order, axis=1) > 0).all(axis=1)
    bounds = squared_distances_to(points, xp.where(valid[:, None], found, 0), xp=xp).max(axis=1)
    bounds[~valid] = xp.inf
    return bounds


def neighbour_candidates(points: Any, n_neighbors: int, *, xp: ModuleType, cuml: Any) -> Any:
    """Cells x up to :data:`MAX_CANDIDATES`: each cell's candidates, among them its ``n_neighbors`` nearest.

    Parameters
    ----------
    points
        Cells x coordinates on the device (CuPy; NumPy under the simulator).
    n_neighbors
        The nearest cells each cell needs, itself among them.
    xp
        CuPy (NumPy under the simulator).
    cuml
        cuML's module (a stand-in under the simulator): its IVF-Flat search bounds the
        distances, its brute force searches the cells with too many candidates.

    Returns
    -------
    The candidates' indices (int64), each row's after its last -1.
    """
    n_cells, n_dims = points.shape
    # Centred: smaller norms round less in the products; distances are the same.
    centred = xp.ascontiguousarray(points - points.mean(axis=0), dtype=xp.float32)
    squares = (centred * centred).sum(axis=1)
    bounds = _upper_bounds(points, n_neighbors, xp=xp, cuml=cuml).astype(xp.float32)
    counts = xp.zeros(n_cells, dtype=xp.int32)
    candidates = xp.full((n_cells, MAX_CANDIDATES), -1, dtype=xp.int32)
    kernel = _within_bounds_kernel()
    rounding = rounding_margin(n_dims)
    chunks = -(-n_cells // (THREADS_PER_BLOCK * COLUMNS_PER_THREAD))
    block = max(PRODUCT_BLOCK_BYTES // (4 * n_cells), 1)
    for start in range(0, n_cells, block):
        products = centred[start : start + block] @ centred.T
        kernel[(products.shape[0], chunks), THREADS_PER_BLOCK](
            products, squares, start, bounds, rounding, counts, candidates
        )
    candidates = candidates[:, : int(min(counts.max(), MAX_CANDIDATES))].astype(xp.int64)
    searched = xp.flatnonzero((counts > MAX_CANDIDATES) | (counts < n_neighbors))
    if searched.size:
        brute = cuml.neighbors.NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(points)
        nearest = xp.asarray(brute.kneighbors(points[searched], return_distance=False)).astype(xp.int64)
        width = max(candidates.shape[1], n_neighbors)
        padded = xp.full((n_cells, width), -1, dtype=xp.int64)
        padded[:, : candidates.shape[1]] = candidates
        padded[searched] = -1
        padded[searched, :n_neighbors] = nearest
        candidates = padded
    return candidates
