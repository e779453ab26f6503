"""Distances from each cell to its candidate neighbours, in float64, from the coordinates' differences."""

from __future__ import annotations

from types import ModuleType
from typing import Any

DIFFERENCES_BYTES = 1 << 28
"""The most memory the coordinates' differences take at once (rows in blocks)."""


def squared_distances_to(points: Any, candidates: Any, *, xp: ModuleType) -> Any:
    """Each row's squared Euclidean distance to each of its ``candidates`` (-1: none, infinity), in float64.

    float32's ``|x|^2 + |y|^2 - 2xy`` loses digits where cells are close: these come from the
    differences instead, a block of rows at a time.

    Parameters
    ----------
    points
        Rows x coordinates.
    candidates
        Rows x candidates: indices of ``points``' rows, -1 where a row has fewer.
    xp
        NumPy or CuPy: the array module of both.

    Returns
    -------
    Rows x candidates, float64.
    """
    squared = xp.empty(candidates.shape, dtype=xp.float64)
    block = max(DIFFERENCES_BYTES // (8 * max(candidates.shape[1], 1) * points.shape[1]), 1)
    for start in range(0, candidates.shape[0], block):
        rows = candidates[start : start + block]
        differences = points[rows].astype(xp.float64) - points[start : start + block, None, :].astype(xp.float64)
        squared[start : start + block] = xp.where(rows >= 0, (differences * differences).sum(axis=2), xp.inf)
    return squared
