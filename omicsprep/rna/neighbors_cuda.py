"""Each cell's candidates for its exact nearest neighbours on the GPU: the cells within a bound of its k-th distance.

A brute-force search of a million cells' 90 nearest (cuML's, through cuVS) writes every
distance and selects from each row of a million: 11 s on an H100. Here an approximate search
(cuML's IVF-Flat, 2 s) finds k cells for each cell, whose farthest, its distance computed again
in float64, bounds the k-th nearest distance from above; then one pass over all pairs
(:mod:`omicsprep.rna.pairs_cuda`, which sums the silhouettes' distances per label in the same
pass) keeps the cells within the bound, widened by float32's rounding of the pairs' squared
distances. Every one of the k nearest is among them, whatever the approximate search missed:
:func:`omicsprep.rna.embedding.exact_neighbors` orders them by exact distances. A cell with
more candidates than :data:`MAX_CANDIDATES` (a bound far off, or many cells at one distance),
and every cell of an embedding wider than the pass takes, is searched by brute force. Imported
on the GPU path only (or under Numba's CUDA simulator, which the tests use on machines without
a GPU).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from omicsprep.rna import pairs_cuda
from omicsprep.rna.distances import squared_distances_to

MAX_CANDIDATES = 256
"""The most candidates kept for a cell (int32 each); a cell with more is searched by brute force."""
UNIT_ROUNDOFF = 2.0**-24  # float32's


def rounded_up_limits(bounds: Any, n_dims: int, *, xp: ModuleType) -> Any:
    """Squared-distance bounds (float64) as the pass's float32 limits, widened by float32's rounding.

    The pass sums ``d`` squares of float32 differences: within ``d + 3`` unit roundoffs of the
    exact squared distance, relative to it (Higham's bounds); ``2d + 8`` of them, and the bound
    rounded up to float32, keep every cell that is within the bound.
    """
    widened = (bounds * (1 + (2 * n_dims + 8) * UNIT_ROUNDOFF)).astype(xp.float32)
    return xp.nextafter(widened, xp.float32(np.inf))


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


def neighbour_candidates(
    points: Any, n_neighbors: int, *, xp: ModuleType, cuml: Any, codes: Any = None, n_labels: int = 1
) -> tuple[Any, Any]:
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
    codes
        Each cell's label, ``0 .. n_labels - 1``, for the summed distances per label; none: one label.
    n_labels
        How many labels.

    Returns
    -------
    The candidates' indices (int64), each row's after its last -1; and each cell's summed
    distance to each label's cells (float64), or None for an embedding wider than
    :data:`omicsprep.rna.pairs_cuda.MAX_DIMS`.
    """
    n_cells, n_dims = points.shape
    points = xp.ascontiguousarray(points, dtype=xp.float32)
    if n_dims > pairs_cuda.MAX_DIMS:  # the pass's registers: brute force for every cell
        candidates, sums, searched = xp.full((n_cells, 0), -1, dtype=xp.int64), None, xp.arange(n_cells)
    else:
        limits = rounded_up_limits(_upper_bounds(points, n_neighbors, xp=xp, cuml=cuml), n_dims, xp=xp)
        codes = xp.zeros(n_cells, dtype=xp.int32) if codes is None else codes
        sums, counts, candidates = pairs_cuda.pair_sums_gpu(
            points, codes, n_labels, cosine=False, xp=xp, limits=limits, max_candidates=MAX_CANDIDATES
        )
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
    return candidates, sums
