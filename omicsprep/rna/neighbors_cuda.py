"""Each cell's candidates for its exact nearest neighbours on the GPU: the cells within a bound of its k-th distance.

A brute-force search of a million cells' 90 nearest (cuML's, through cuVS) writes every
distance and selects from each row of a million: 11 s on an H100. Here an approximate search
(cuML's IVF-Flat, 2 s) finds k cells for each cell, whose farthest, its distance computed again
in float64, bounds the k-th nearest distance from above (up to :data:`BRUTE_FORCE_BOUND_MAX_CELLS`
cells cuML's brute force finds them: 0.05 s for 55,000 cells' 71 nearest, IVF-Flat 0.19 s, an
H100); then one pass over all pairs (:mod:`omicsprep.rna.pairs_cuda`, which sums the
silhouettes' distances per label in the same pass) keeps the cells within the bound, widened
by float32's rounding of the pairs' squared distances. Every one of the k nearest is among
them, whatever the float32 search missed:
:func:`omicsprep.rna.embedding.exact_neighbors` orders them by exact distances. A cell with
more candidates than :data:`MAX_CANDIDATES` (a bound far off, or many cells at one distance)
is searched by brute force: cuML's picks its k in float32 (then ordered in float64), so at a
near-tie of the k-th such a cell may differ from the CPU's (none at a million cells of the atlas
study: 191 candidates at most). An embedding wider than the pass's registers takes cuBLAS's
matrix products instead, each block's cells within the bounds kept by a kernel as it reads them,
and so does one wider than :data:`PASS_MAX_DIMS_WITHOUT_SUMS` when no sums are wanted. Imported
on the GPU path only (or under Numba's CUDA simulator, which the tests use on machines without a
GPU).
"""

from __future__ import annotations

import logging
import math
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np
from numba import cuda

from omicsprep.rna import pairs_cuda
from omicsprep.rna.distances import squared_distances_to

BRUTE_FORCE_BOUND_MAX_CELLS = 100_000
"""The most cells whose bounds come from cuML's brute force rather than IVF-Flat (kBET's labels, say)."""
MAX_CANDIDATES = 256
"""The most candidates kept for a cell (int32 each); a cell with more is searched by brute force."""
# The most bytes of one block of products (cells of the block x all cells), float32.
PRODUCT_BLOCK_BYTES = 1 << 30
KEEP_THREADS_PER_BLOCK = 256
# Without sums to take along, wider embeddings take the products: the pass's threads hold one cell
# each there, a coordinate read serving one pair, so kBET's labels (about 83,000 cells of 100
# dimensions) took 0.54-0.66 s each for their neighbours (an H100, tree 59de272). CuPy's
# element-wise way over the products took 0.72-0.94 s (fa1f224): it wrote and read each block
# several times; the kernel reads it once.
PASS_MAX_DIMS_WITHOUT_SUMS = 64
UNIT_ROUNDOFF = 2.0**-24  # float32's

log = logging.getLogger(__name__)


def rounded_up_limits(bounds: Any, n_dims: int, *, xp: ModuleType) -> Any:
    """Squared-distance bounds (float64) as the pass's float32 limits, widened by float32's rounding.

    The pass sums ``d`` squares of float32 differences: within ``d + 3`` unit roundoffs of the
    exact squared distance, relative to it (Higham's bounds); ``2d + 8`` of them, and the bound
    rounded up to float32, keep every cell that is within the bound.
    """
    widened = (bounds * (1 + (2 * n_dims + 8) * UNIT_ROUNDOFF)).astype(xp.float32)
    return xp.nextafter(widened, xp.float32(np.inf))


def _pass_points_and_limits(points: Any, bounds: Any, *, xp: ModuleType) -> tuple[Any, Any]:
    """The float32 points the pass reads and each cell's limit, for ``bounds`` on ``points``' own distances.

    float32 points are read as they are. float64 ones are centred and rounded to float32, which
    moves each cell by at most a unit roundoff of its norm: each distance by at most ``u`` times
    the two cells' norms (twice, for the centring's own rounding), added to the bound's distance.
    A cell within the bound is at most that distance farther from the centre than the cell.
    """
    if points.dtype == xp.float32:
        return points, rounded_up_limits(bounds, points.shape[1], xp=xp)
    centred = points - points.mean(axis=0)
    norms, distance = xp.sqrt((centred * centred).sum(axis=1)), xp.sqrt(bounds)
    reach = distance + 2 * UNIT_ROUNDOFF * (2 * norms + distance)
    return centred.astype(xp.float32), rounded_up_limits(reach * reach, points.shape[1], xp=xp)


def _ivf_settings(n_cells: int) -> dict[str, int]:
    """The IVF-Flat search's lists (about the square root of the cells) and those probed per cell."""
    lists = max(1, math.isqrt(n_cells))
    return {"nlist": lists, "nprobe": min(lists, max(8, lists // 32))}


def _upper_bounds(points: Any, n_neighbors: int, *, xp: ModuleType, cuml: Any) -> Any:
    """Each cell's squared distance (float64, on ``points``) to the farthest of the cells a float32 search found.

    Any ``n_neighbors`` distinct cells bound the ``n_neighbors``-th nearest distance from above;
    a cell for which the search found fewer gets no bound (infinity). The search reads float32.
    """
    if points.shape[0] <= BRUTE_FORCE_BOUND_MAX_CELLS:
        algorithm: dict[str, Any] = {"algorithm": "brute"}
    else:
        algorithm = {"algorithm": "ivfflat", "algo_params": _ivf_settings(points.shape[0])}
    search = cuml.neighbors.NearestNeighbors(n_neighbors=n_neighbors, **algorithm)
    searched = xp.ascontiguousarray(points, dtype=xp.float32)
    found = xp.asarray(search.fit(searched).kneighbors(searched, return_distance=False)).astype(xp.int64)
    # Cells of the data, each once (a search short of cells may fill its rows with -1 or repeats).
    in_order = xp.sort(found, axis=1)
    valid = (in_order[:, 0] >= 0) & (in_order[:, -1] < points.shape[0]) & (xp.diff(in_order, axis=1) > 0).all(axis=1)
    bounds = squared_distances_to(points, xp.where(valid[:, None], found, 0), xp=xp).max(axis=1)
    bounds[~valid] = xp.inf
    return bounds


@cache
def _keep_kernel() -> Any:
    """The kernel keeping, from a block of products, each cell's cells within its bound (a thread a pair).

    Consecutive threads read consecutive products of a row (coalesced), each product once; a
    kept cell takes the next slot of its row (an atomic add: the candidates' order within a row
    is arbitrary, their exact distances order them).
    """

    @cuda.jit
    def keep(products, squares, first_row, bounds, margin, counts, candidates):
        column, row = cuda.grid(2)
        if row >= products.shape[0] or column >= products.shape[1]:
            return
        cell = first_row + row
        pair = squares[cell] + squares[column]
        if pair - 2.0 * products[row, column] <= bounds[cell] + margin * pair:
            slot = cuda.atomic.add(counts, cell, 1)
            if slot < candidates.shape[1]:
                candidates[cell, slot] = column

    return keep


def _within_bounds_by_products(points: Any, bounds: Any, *, xp: ModuleType) -> tuple[Any, Any]:
    """Each cell's count of cells within its bound and up to :data:`MAX_CANDIDATES` of them, from matrix products.

    The products by cuBLAS, a block of cells at a time; :func:`_keep_kernel` reads each block
    once. The candidates' columns are as many as the most cells one cell keeps
    (:func:`omicsprep.rna.pairs_cuda.fitting_width`), as the pass's. Centred coordinates in
    float32: each of ``|x|^2``, ``|y|^2`` and ``xy`` is within ``d`` unit roundoffs of its own
    scale, the sums, the centring and the rounding to float32 add 8 (Higham's bounds), allowed
    as a share of ``|x|^2 + |y|^2``.
    """
    n_cells, n_dims = points.shape
    centred = (points - points.mean(axis=0)).astype(xp.float32)
    squares = (centred * centred).sum(axis=1)
    margin = (2 * n_dims + 8) * UNIT_ROUNDOFF
    bounds = xp.ascontiguousarray(bounds, dtype=xp.float64)
    counts = xp.zeros(n_cells, dtype=xp.int32)
    candidates = xp.full((n_cells, MAX_CANDIDATES), -1, dtype=xp.int32)
    block = max(PRODUCT_BLOCK_BYTES // (4 * n_cells), 1)  # at most 65,535 rows: a grid's second dimension
    for start in range(0, n_cells, block):
        products = centred[start : start + block] @ centred.T
        grid = (-(-n_cells // KEEP_THREADS_PER_BLOCK), products.shape[0])
        _keep_kernel()[grid, KEEP_THREADS_PER_BLOCK](products, squares, start, bounds, margin, counts, candidates)
    return counts, candidates[:, : pairs_cuda.fitting_width(counts, MAX_CANDIDATES, xp=xp)]


def neighbour_candidates(
    points: Any, n_neighbors: int, *, xp: ModuleType, cuml: Any, codes: Any = None, n_labels: int = 1
) -> tuple[Any, Any]:
    """Cells x up to :data:`MAX_CANDIDATES`: each cell's candidates, among them its ``n_neighbors`` nearest.

    Parameters
    ----------
    points
        Cells x coordinates on the device (CuPy; NumPy under the simulator), float32 or another
        float type (taken as float64): the candidates are exact for these coordinates' distances.
    n_neighbors
        The nearest cells each cell needs, itself among them.
    xp
        CuPy (NumPy under the simulator).
    cuml
        cuML's module (a stand-in under the simulator): its IVF-Flat search bounds the
        distances, its brute force searches the cells with too many candidates.
    codes
        Each cell's label, ``0 .. n_labels - 1``, for the summed distances per label; none: the
        sums of one label, or none at all from the products.
    n_labels
        How many labels.

    Returns
    -------
    The candidates' indices (int64), each row's after its last -1; and each cell's summed
    distance to each label's cells (float64), or None where the candidates came from matrix
    products: an embedding wider than :data:`omicsprep.rna.pairs_cuda.MAX_DIMS`, or than
    :data:`PASS_MAX_DIMS_WITHOUT_SUMS` without ``codes``.
    """
    n_cells, n_dims = points.shape
    if points.dtype != xp.float32:  # float16's rounding is coarser than the limits allow: as float64
        points = points.astype(xp.float64)
    bounds = _upper_bounds(points, n_neighbors, xp=xp, cuml=cuml)
    if n_dims > pairs_cuda.MAX_DIMS or (codes is None and n_dims > PASS_MAX_DIMS_WITHOUT_SUMS):
        counts, candidates = _within_bounds_by_products(points, bounds, xp=xp)
        sums = None
    else:
        read, limits = _pass_points_and_limits(points, bounds, xp=xp)
        codes = xp.zeros(n_cells, dtype=xp.int32) if codes is None else codes
        sums, counts, candidates = pairs_cuda.pair_sums_gpu(
            read, codes, n_labels, cosine=False, xp=xp, limits=limits, max_candidates=MAX_CANDIDATES
        )
    candidates = candidates.astype(xp.int64)
    searched = xp.flatnonzero((counts > MAX_CANDIDATES) | (counts < n_neighbors))
    if searched.size:
        log.info("exact neighbours: %d of %d cells searched by brute force (too many or too few candidates)",
                 searched.size, n_cells)  # fmt: skip
        brute = cuml.neighbors.NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(points)
        nearest = xp.asarray(brute.kneighbors(points[searched], return_distance=False)).astype(xp.int64)
        width = max(candidates.shape[1], n_neighbors)
        padded = xp.full((n_cells, width), -1, dtype=xp.int64)
        padded[:, : candidates.shape[1]] = candidates
        padded[searched] = -1
        padded[searched, :n_neighbors] = nearest
        candidates = padded
    return candidates, sums
