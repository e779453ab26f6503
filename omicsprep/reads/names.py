"""Cell and gene names numbered as a BAM is read: dictionaries of bytes that Numba's kernels search and fill.

Open addressing on FNV-1a hashes; names are compared byte by byte and kept in NumPy arrays,
so that no Python object is made per read.
"""

from __future__ import annotations

import numba
import numpy as np

from omicsprep.jit_cache import track_sources

track_sources()  # before the functions below are compiled and cached (cache=True)

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


class NameDictionary:
    """Distinct names numbered in order of first appearance, held as bytes in NumPy arrays.

    Filled by :func:`_insert_names` (Numba, open addressing on FNV-1a hashes, names compared
    byte by byte); grown here whenever the kernel stops for room.
    """

    def __init__(self) -> None:
        self.slots: np.ndarray = np.full(1 << 12, -1, dtype=np.int32)
        self.hashes: np.ndarray = np.empty(1 << 10, dtype=np.uint64)
        self.starts: np.ndarray = np.empty(1 << 10, dtype=np.int64)
        self.lengths: np.ndarray = np.empty(1 << 10, dtype=np.int32)
        self.data: np.ndarray = np.empty(1 << 16, dtype=np.uint8)
        self.size = 0
        self.data_used = 0

    def tables(self) -> tuple[np.ndarray, ...]:
        """The arrays the kernels search: slots, hashes, starts and lengths of names, name bytes."""
        return self.slots, self.hashes, self.starts, self.lengths, self.data

    def codes(self, buf: np.ndarray, hashes: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Codes of the names at ``buf[starts:starts + lengths]`` (FNV-1a ``hashes``), new names added."""
        codes = np.empty(len(hashes), dtype=np.int32)
        done = 0
        while True:
            done, self.size, self.data_used = _insert_names(
                buf, hashes, starts, lengths, done, codes, self.tables(), self.size, self.data_used
            )
            if done == len(hashes):
                return codes
            self._grow(int(lengths[done]))

    def _grow(self, name_length: int) -> None:
        if 2 * (self.size + 1) > len(self.slots):
            self.slots = _rehash(self.hashes, self.size, 2 * len(self.slots))
        if self.size + 1 > len(self.hashes):
            n = 2 * len(self.hashes)
            self.hashes, self.starts, self.lengths = (np.resize(a, n) for a in (self.hashes, self.starts, self.lengths))
        if self.data_used + name_length > len(self.data):
            self.data = np.resize(self.data, 2 * (len(self.data) + name_length))

    def names(self, first: int = 0) -> list[str]:
        """The names numbered from ``first`` on, in code order."""
        return [
            self.data[start : start + length].tobytes().decode("utf-8", "replace")
            for start, length in zip(self.starts[first : self.size], self.lengths[first : self.size], strict=True)
        ]


@numba.njit(cache=True, inline="always")
def find_name(buf, start, length, value, table):
    """The code of ``buf[start:start + length]`` (hash ``value``) in ``table`` (:meth:`NameDictionary.tables`).

    Or ``-(slot + 2)`` of the empty slot the name would take.
    """
    slots, known_hashes, name_starts, name_lengths, data = table
    mask = slots.size - 1
    slot = value & mask
    while True:
        code = slots[slot]
        if code < 0:
            return -np.int64(slot) - 2
        if known_hashes[code] == value and name_lengths[code] == length:
            at = name_starts[code]
            same = True
            for k in range(length):
                if data[at + k] != buf[start + k]:
                    same = False
                    break
            if same:
                return np.int64(code)
        slot = (slot + 1) & mask


@numba.njit(cache=True, nogil=True)
def _insert_names(buf, hashes, starts, lengths, done, codes, table, size, used):
    """Code each name from ``done`` on, adding new ones; stop early when a table is full.

    Returns how many names are coded, and the dictionary's new size and bytes used.
    """
    slots, known_hashes, name_starts, name_lengths, data = table
    for i in range(done, hashes.size):
        start, length, value = starts[i], lengths[i], hashes[i]
        code = find_name(buf, start, length, value, table)
        if code < 0:
            if 2 * (size + 1) > slots.size or size >= known_hashes.size or used + length > data.size:
                return i, size, used
            slots[-code - 2] = size
            known_hashes[size], name_starts[size], name_lengths[size] = value, used, length
            data[used : used + length] = buf[start : start + length]
            code, size, used = size, size + 1, used + length
        codes[i] = code
    return hashes.size, size, used


@numba.njit(cache=True)
def _rehash(hashes, size, n_slots):
    slots = np.full(n_slots, -1, dtype=np.int32)
    mask = n_slots - 1
    for code in range(size):
        slot = hashes[code] & mask
        while slots[slot] >= 0:
            slot = (slot + 1) & mask
        slots[slot] = code
    return slots


@numba.njit(cache=True, inline="always")
def fnv1a(buf, start, length):
    """FNV-1a, 64-bit, of ``buf[start:start + length]``: the hash the dictionaries key names by."""
    value = _FNV_OFFSET
    for i in range(start, start + length):
        value = (value ^ np.uint64(buf[i])) * _FNV_PRIME
    return value
