"""The output matrix of fragment counts, on either backend.

It is assembled in feature-major (CSC) order from sorted ``feature << CELL_BITS | cell`` keys.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
from scipy import sparse

from omicsprep.backend import asnumpy

FEATURE_BITS = 40  # (feature, cell) keys: feature << 23 | cell; a tile is chromosome << tile bits | tile
CELL_BITS = 63 - FEATURE_BITS
HOST_GROWTH = 1.25  # spare room of the growing host output: realloc grows it in place, so it is the only copy


class FeatureColumns:
    """The output matrix in feature-major (CSC) order, a block of finished features at a time.

    The fragments are sorted, so once they have passed a feature its counts are final. Only
    the unfinished features' (feature, cell) counts wait for the next chunk.
    """

    def __init__(self, xp: ModuleType) -> None:
        self.xp = xp
        self.cells, self.counts, self.size = xp.zeros(0, xp.int32), xp.zeros(0, xp.float32), 0
        self.features: list[np.ndarray] = []  # each block's finished features, and their non-zeros
        self.lengths: list[np.ndarray] = []
        self.waiting_keys, self.waiting_counts = xp.zeros(0, xp.int64), xp.zeros(0, xp.int64)

    def add(self, keys, *, finished_below: int | None) -> None:
        """Count a chunk's ``feature << CELL_BITS | cell`` keys.

        Features below ``finished_below`` (all when ``None``) are final after it.
        """
        xp = self.xp
        keys, counts = xp.unique(keys, return_counts=True)
        keys, counts = _merged(self.waiting_keys, self.waiting_counts, keys, counts.astype(xp.int64), xp=xp)
        cut = keys.size if finished_below is None else position_in(keys, finished_below << CELL_BITS, xp=xp)
        self.waiting_keys, self.waiting_counts = keys[cut:], counts[cut:]
        keys, counts = keys[:cut], counts[:cut]
        features, lengths = runs(keys >> CELL_BITS, xp=xp)
        self.features.append(asnumpy(features))
        self.lengths.append(asnumpy(lengths))
        self.cells = _appended(self.cells, self.size, (keys & ((1 << CELL_BITS) - 1)).astype(xp.int32), xp=xp)
        self.counts = _appended(self.counts, self.size, counts.astype(xp.float32), xp=xp)
        self.size += keys.size

    def csc(self, *, n_cells: int, n_features: int | None):
        """The counts as a SciPy CSC matrix, and its features.

        With ``n_features``, every feature number below it is a column (peaks), else only
        those with counts (tiles).
        """
        features, lengths = (
            np.concatenate([np.zeros(0, np.int64), *self.features]),
            np.concatenate([np.zeros(0, np.int64), *self.lengths]),
        )
        columns = np.arange(n_features) if n_features is not None else features
        per_column = np.zeros(columns.size, dtype=np.int64)
        per_column[np.searchsorted(columns, features)] = lengths
        # SciPy keeps 32-bit indices where they reach, and widens them beyond 2^31 entries (the
        # GPU then takes the matrix in row blocks: omicsprep.backend.to_device).
        indptr = np.concatenate([[0], np.cumsum(per_column)])
        cells, counts = _trimmed(self.cells, self.size), _trimmed(self.counts, self.size)
        matrix = sparse.csc_matrix((asnumpy(counts), asnumpy(cells), indptr), shape=(n_cells, columns.size))
        matrix.has_sorted_indices = True  # cells ascend within each feature
        return matrix, columns


def _merged(keys_a, counts_a, keys_b, counts_b, *, xp: ModuleType):
    """Two sorted arrays of unique keys as one, the counts of keys in both summed.

    Merged by positions, without sorting again.
    """
    if keys_a.size == 0 or keys_b.size == 0:
        return (keys_b, counts_b) if keys_a.size == 0 else (keys_a, counts_a)
    keys = xp.empty(keys_a.size + keys_b.size, dtype=xp.int64)
    counts = xp.empty_like(keys)
    at_a = xp.arange(keys_a.size) + xp.searchsorted(keys_b, keys_a, side="left")
    at_b = xp.arange(keys_b.size) + xp.searchsorted(keys_a, keys_b, side="right")
    keys[at_a], keys[at_b], counts[at_a], counts[at_b] = keys_a, keys_b, counts_a, counts_b
    repeated = keys[1:] == keys[:-1]  # a key of both arrays: A's copy, then B's
    counts[:-1][repeated] += counts[1:][repeated]
    kept = xp.concatenate([xp.ones(1, dtype=bool), ~repeated])
    return keys[kept], counts[kept]


def position_in(sorted_values, value: int, *, xp: ModuleType, side: str = "left") -> int:
    """Where ``value`` goes in ``sorted_values`` (CuPy searches arrays only)."""
    return int(xp.searchsorted(sorted_values, xp.asarray([value], dtype=xp.int64), side=side)[0])


def runs(values, *, xp: ModuleType):
    """Each run of equal values in sorted ``values``: the value and its length."""
    starts = xp.flatnonzero(xp.concatenate([xp.ones(min(values.size, 1), dtype=bool), values[1:] != values[:-1]]))
    return values[starts], xp.diff(xp.concatenate([starts, xp.asarray([values.size])]))


def _appended(buffer, size: int, values, *, xp: ModuleType):
    """``buffer[:size]`` followed by ``values``, in a buffer with room to grow.

    On the host the buffer is resized in place (realloc moves no pages), so the output never
    exists twice; on the device it is doubled.
    """
    needed = size + values.size
    if needed > buffer.size:
        capacity = max(needed, int(buffer.size * (HOST_GROWTH if xp is np else 2)))
        if xp is np:
            buffer.resize(capacity, refcheck=False)
        else:
            grown = xp.empty(capacity, dtype=buffer.dtype)
            grown[:size] = buffer[:size]
            buffer = grown
    buffer[size:needed] = values
    return buffer


def _trimmed(buffer, size: int):
    """The first ``size`` elements: the host buffer shrunk in place, a view on the device."""
    if isinstance(buffer, np.ndarray):
        buffer.resize(size, refcheck=False)
        return buffer
    return buffer[:size]
