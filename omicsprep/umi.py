"""UMI deduplication with UMI-tools' semantics, as Numba kernels.

Reads become molecules: one row per (cell, gene, UMI) with its read count. Within each
(cell, gene) the UMIs are ordered by count, ties by sequence (as UMI-tools 1.1 orders them:
it sorts each component's UMIs before ranking them by count), and counted by one of
UMI-tools' methods; UMIs are 2-bit packed (A<C<G<T, so sequence order is numeric order) and
a Hamming distance is a popcount.
"""

from __future__ import annotations

from typing import Literal

import numba
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from omicsprep.errors import InputError

Method = Literal["unique", "percentile", "cluster", "adjacency", "directional"]
METHODS: tuple[str, ...] = ("unique", "percentile", "cluster", "adjacency", "directional")
MAX_UMI_LENGTH = 32  # 2 bits a base in a uint64
_BASE_CODES = np.full(256, 255, dtype=np.uint8)
for _code, _base in enumerate(b"ACGT"):
    _BASE_CODES[_base] = _code


def pack_umis(umis: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Pack equal-length UMI strings into 2-bit codes.

    Parameters
    ----------
    umis
        UMI sequences as an Arrow string array without nulls, all of one length, at most
        32 bases.

    Returns
    -------
    The packed UMIs (``uint64``) and a mask of valid ones (``False`` where a UMI holds a
    base other than A, C, G, T, e.g. N).

    Raises
    ------
    InputError
        UMIs of mixed lengths, or longer than 32 bases.
    """
    umis = umis.cast(pa.string())
    lengths = pc.utf8_length(umis)
    shortest, longest = (pc.min(lengths).as_py() or 0), (pc.max(lengths).as_py() or 0)
    if shortest != longest:
        raise InputError(f"UMIs of mixed lengths ({shortest} to {longest} bases)")
    if longest > MAX_UMI_LENGTH:
        raise InputError(f"UMIs of {longest} bases; at most {MAX_UMI_LENGTH} are supported")
    # Equal lengths: the string data is one contiguous block of n x length bytes.
    offsets = np.frombuffer(umis.buffers()[1], dtype=np.int32)[umis.offset : umis.offset + len(umis) + 1]
    data = np.frombuffer(umis.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    codes = _BASE_CODES[data.reshape(len(umis), longest)]
    valid = (codes != 255).all(axis=1)
    packed = np.zeros(len(umis), dtype=np.uint64)
    for position in range(longest):
        packed = (packed << np.uint64(2)) | (codes[:, position] & 3).astype(np.uint64)
    return packed, valid


@numba.njit(cache=True, inline="always")
def hamming(a: np.uint64, b: np.uint64) -> int:
    """Hamming distance of two 2-bit packed UMIs."""
    diff = a ^ b
    return _popcount((diff | (diff >> np.uint64(1))) & np.uint64(0x5555555555555555))


@numba.njit(cache=True, inline="always")
def _popcount(x: np.uint64) -> int:
    count = 0
    while x:
        x &= x - np.uint64(1)
        count += 1
    return count


@numba.njit(cache=True)
def _linked(umis, counts, i, j, threshold, directional):  # noqa: ANN001, ANN202
    """Edge i -> j: within the distance, and for directional count(i) >= 2 count(j) - 1."""
    if hamming(umis[i], umis[j]) > threshold:
        return False
    return not directional or counts[i] >= 2 * counts[j] - 1


@numba.njit(cache=True)
def _components(umis, counts, threshold, directional):  # noqa: ANN001, ANN202
    """Component of every UMI, found by searches started in count order (UMI-tools')."""
    n = umis.size
    component = np.full(n, -1, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    n_components = 0
    for start in range(n):
        if component[start] >= 0:
            continue
        # A UMI met again from a later start joins no second component: UMI-tools' later
        # searches may pass through found UMIs, but only unfound ones start components.
        seen = np.zeros(n, dtype=np.bool_)
        seen[start] = True
        component[start] = n_components
        top = 0
        stack[top] = start
        top += 1
        while top:
            top -= 1
            node = stack[top]
            for other in range(n):
                if not seen[other] and _linked(umis, counts, node, other, threshold, directional):
                    seen[other] = True
                    if component[other] < 0:
                        component[other] = n_components
                    stack[top] = other
                    top += 1
        n_components += 1
    return component, n_components


@numba.njit(cache=True)
def _min_account(umis, members, threshold):  # noqa: ANN001, ANN202
    """Fewest top UMIs of a component whose neighbourhoods cover it (UMI-tools' adjacency)."""
    size = members.size
    if size == 1:
        return 1
    covered = np.zeros(size, dtype=np.bool_)
    n_covered = 0
    for i in range(size):
        for j in range(size):
            if not covered[j] and (i == j or hamming(umis[members[i]], umis[members[j]]) <= threshold):
                covered[j] = True
                n_covered += 1
        if n_covered == size:
            return i + 1
    return size


@numba.njit(cache=True)
def count_group(umis, counts, method, threshold):  # noqa: ANN001, ANN201
    """Molecules in one (cell, gene): UMIs sorted by count (descending), ties by sequence.

    ``method`` indexes :data:`METHODS`.
    """
    n = umis.size
    if method == 0 or n == 1:  # unique
        return n
    if method == 1:  # percentile: UMIs above 1% of the median count
        limit = np.median(counts.astype(np.float64)) / 100.0
        return int((counts > limit).sum())
    component, n_components = _components(umis, counts, threshold, method == 4)
    if method != 3:  # cluster, directional: one molecule per component
        return n_components
    total = 0
    for c in range(n_components):
        total += _min_account(umis, np.flatnonzero(component == c), threshold)
    return total


@numba.njit(cache=True, parallel=True)
def count_groups(umis, counts, starts, method, threshold):  # noqa: ANN001, ANN201
    """Molecules in every group; group g spans ``starts[g]:starts[g + 1]``."""
    n_groups = starts.size - 1
    molecules = np.empty(n_groups, dtype=np.int64)
    for g in numba.prange(n_groups):
        lo, hi = starts[g], starts[g + 1]
        molecules[g] = count_group(umis[lo:hi], counts[lo:hi], method, threshold)
    return molecules


def collapse_reads(reads: pd.DataFrame) -> pd.DataFrame:
    """Reads (``cell``, ``gene`` codes and packed ``umi``) to sorted molecules.

    A ``reads`` column, where present, says how many reads each row stands for (molecule
    tables that are already aggregated); otherwise each row is one read.

    Returns
    -------
    One row per (cell, gene, umi) with ``count`` (reads), sorted by cell, gene, count
    descending and UMI sequence.
    """
    groups = reads.groupby(["cell", "gene", "umi"], sort=False, observed=True)
    counts = groups["reads"].sum() if "reads" in reads else groups.size()
    molecules = counts.rename("count").reset_index()
    order = np.lexsort(
        (molecules["umi"].to_numpy(), -molecules["count"].to_numpy(),
         molecules["gene"].to_numpy(), molecules["cell"].to_numpy())
    )
    return molecules.iloc[order].reset_index(drop=True)


def count_molecules(molecules: pd.DataFrame, *, method: Method, threshold: int = 1) -> pd.DataFrame:
    """Deduplicated molecules per (cell, gene) from :func:`collapse_reads`'s table.

    Parameters
    ----------
    molecules
        Sorted molecules with ``cell``, ``gene``, ``umi`` (packed) and ``count``.
    method
        One of :data:`METHODS`, with UMI-tools' semantics.
    threshold
        Largest Hamming distance between UMIs of one molecule (network methods).

    Returns
    -------
    Columns ``cell``, ``gene``, ``count``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if molecules.empty:
        return pd.DataFrame({"cell": [], "gene": [], "count": []}, dtype=np.int64)
    keys = molecules[["cell", "gene"]].to_numpy()
    boundary = np.flatnonzero((keys[1:] != keys[:-1]).any(axis=1)) + 1
    starts = np.concatenate([[0], boundary, [len(molecules)]]).astype(np.int64)
    counts = count_groups(
        molecules["umi"].to_numpy(np.uint64), molecules["count"].to_numpy(np.int64), starts,
        METHODS.index(method), threshold,
    )
    groups = molecules.iloc[starts[:-1]]
    return pd.DataFrame({"cell": groups["cell"].to_numpy(), "gene": groups["gene"].to_numpy(), "count": counts})
