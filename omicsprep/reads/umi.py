"""UMI deduplication with UMI-tools' semantics, as Numba kernels.

Reads become molecules: one row per (cell, gene, UMI) with its read count. Within each
(cell, gene) the UMIs are ordered by count, ties by sequence (as UMI-tools 1.1 orders them:
it sorts each component's UMIs before ranking them by count), and counted by one of
UMI-tools' methods; UMIs are 2-bit packed (A<C<G<T, so sequence order is numeric order) and
a Hamming distance is a popcount.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from omicsprep.backend import Backend, cudf, cupy
from omicsprep.errors import InputError
from omicsprep.jit_cache import track_sources
from omicsprep.options import METHODS, Method
from omicsprep.reads import umi_kernels
from omicsprep.resources import usable_cores

track_sources()  # before the functions below are compiled and cached (cache=True)

if TYPE_CHECKING:
    from pandas import DataFrame  # or cudf.DataFrame

MAX_UMI_LENGTH = 32  # 2 bits a base in a uint64
_BASE_CODES = np.full(256, 255, dtype=np.uint8)
for _code, _base in enumerate(b"ACGT"):
    _BASE_CODES[_base] = _code


@contextlib.contextmanager
def numba_threads(threads: int | None) -> Iterator[None]:
    """Numba's parallel kernels on ``threads`` threads (every core when ``None``) within the block.

    At most the threads Numba started with; the number before is restored after.
    """
    before = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads or usable_cores(), numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(before)


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
    lengths = pc.binary_length(umis)  # bytes: the kernel walks bytes (a non-ASCII base is a mixed length)
    shortest, longest = (pc.min(lengths).as_py() or 0), (pc.max(lengths).as_py() or 0)
    check_umi_lengths(shortest, longest)
    # Equal lengths: the string data is one contiguous block of n x length bytes.
    offsets = np.frombuffer(umis.buffers()[1], dtype=np.int32)[umis.offset : umis.offset + len(umis) + 1]
    data = np.frombuffer(umis.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return _pack_equal_length(data, len(umis), longest, _BASE_CODES)


def check_umi_lengths(shortest: int, longest: int) -> None:
    """Refuse UMIs of mixed lengths or longer than :data:`MAX_UMI_LENGTH`.

    Raises
    ------
    InputError
        As :func:`pack_umis` says.
    """
    if shortest != longest:
        raise InputError(f"UMIs of mixed lengths ({shortest} to {longest} bases)")
    if longest > MAX_UMI_LENGTH:
        raise InputError(f"UMIs of {longest} bases; at most {MAX_UMI_LENGTH} are supported")


@numba.njit(cache=True, parallel=True)
def _pack_equal_length(data, n, length, base_codes):
    """:func:`pack_umis` on the contiguous bytes of ``n`` UMIs of ``length`` bases."""
    packed = np.zeros(n, dtype=np.uint64)
    valid = np.ones(n, dtype=np.bool_)
    for i in numba.prange(n):
        value = np.uint64(0)
        for position in range(i * length, (i + 1) * length):
            code = base_codes[data[position]]
            if code == 255:
                valid[i] = False
            value = (value << np.uint64(2)) | np.uint64(code & 3)
        packed[i] = value
    return packed, valid


_count_group = umi_kernels.build(numba.njit(cache=True))


@numba.njit(cache=True, parallel=True)
def count_groups(umis, counts, starts, method, threshold):
    """Molecules in every group (one cell and gene), on the CPU's cores.

    Group g spans ``starts[g]:starts[g + 1]`` of the sorted molecules; ``method`` indexes
    :data:`METHODS`.
    """
    n_groups = starts.size - 1
    molecules = np.empty(n_groups, dtype=np.int64)
    component = np.empty(umis.size, dtype=np.int32)
    stack = np.empty(umis.size, dtype=np.int32)
    mark = np.empty(umis.size, dtype=np.int32)
    covered = np.empty(umis.size, dtype=np.uint8)
    for g in numba.prange(n_groups):
        molecules[g] = _count_group(
            umis, counts, starts[g], starts[g + 1], method, threshold, component, stack, mark, covered
        )
    return molecules


def collapse_reads(reads: DataFrame) -> DataFrame:
    """Reads (``cell``, ``gene`` codes and packed ``umi``) to sorted molecules.

    A ``reads`` column, where present, says how many reads each row stands for (molecule
    tables that are already aggregated); otherwise each row is one read.

    Parameters
    ----------
    reads
        A pandas DataFrame, or a cuDF one on the GPU (the calls are common to both).

    Returns
    -------
    One row per (cell, gene, umi) with ``count`` (reads), sorted by cell, gene, count
    descending and UMI sequence.
    """
    groups = reads.groupby(["cell", "gene", "umi"], sort=False)
    counts = groups["reads"].sum() if "reads" in reads else groups.size()
    molecules = counts.rename("count").reset_index()
    return molecules.sort_values(
        ["cell", "gene", "count", "umi"], ascending=[True, True, False, True], ignore_index=True
    )


SMALL_GROUP = 32  # molecules of a (cell, gene) ordered by insertion sort up to this many


@numba.njit(cache=True, parallel=True)
def collapse_codes(cell, gene, umi, weight):
    """Reads to molecules sorted as :func:`collapse_reads` sorts them, in Numba on the CPU's cores.

    Parameters
    ----------
    cell, gene
        Non-negative integer codes per read.
    umi
        Packed UMIs (uint64).
    weight
        Reads each row stands for (int64), or an empty array: one each.

    Returns
    -------
    ``cell``, ``gene``, ``umi`` and ``count`` per molecule, and the group starts, as
    :func:`molecule_groups` returns them.
    """
    n = cell.size
    n_cells = np.int64(cell.max()) + 1 if n else 0
    # Reads bucketed by cell (a counting sort), then each cell's sorted by gene and UMI.
    cell_starts = np.zeros(n_cells + 1, np.int64)
    for i in range(n):
        cell_starts[cell[i] + 1] += 1
    for c in range(n_cells):
        cell_starts[c + 1] += cell_starts[c]
    fill = cell_starts[:-1].copy()
    order = np.empty(n, np.int64)
    for i in range(n):
        order[fill[cell[i]]] = i
        fill[cell[i]] += 1
    # One sort key, gene above UMI, where both fit in 64 bits; two stable sorts otherwise.
    umi_bits = _bit_length(np.uint64(umi.max())) if n else 0
    one_key = umi_bits + _bit_length(np.uint64(gene.max() if n else 0)) <= 64
    umi_mask = (np.uint64(1) << np.uint64(umi_bits)) - np.uint64(1) if umi_bits < 64 else ~np.uint64(0)
    out_gene = np.empty(n, np.int64)
    out_umi = np.empty(n, np.uint64)
    out_count = np.empty(n, np.int64)
    n_molecules = np.zeros(n_cells, np.int64)
    for c in numba.prange(n_cells):
        lo, hi = cell_starts[c], cell_starts[c + 1]
        if lo == hi:
            continue
        rows = order[lo:hi]
        k = lo - 1
        if one_key:  # sorted keys counted in runs; gene and UMI taken back from the key
            keys = np.empty(rows.size, np.uint64)
            for j in range(rows.size):
                keys[j] = (np.uint64(gene[rows[j]]) << np.uint64(umi_bits)) | umi[rows[j]]
            by_key = np.argsort(keys) if weight.size else np.arange(0)
            if not weight.size:
                keys.sort()
            previous = np.uint64(0)
            for j in range(rows.size):
                key = keys[by_key[j]] if weight.size else keys[j]
                reads = weight[rows[by_key[j]]] if weight.size else 1
                if k >= lo and key == previous:
                    out_count[k] += reads
                else:
                    k += 1
                    previous = key
                    out_gene[k], out_umi[k], out_count[k] = key >> np.uint64(umi_bits), key & umi_mask, reads
        else:
            rows = rows[np.argsort(umi[rows], kind="mergesort")]
            rows = rows[np.argsort(gene[rows], kind="mergesort")]
            for j in range(rows.size):
                r = rows[j]
                reads = weight[r] if weight.size else 1
                if k >= lo and gene[r] == out_gene[k] and umi[r] == out_umi[k]:
                    out_count[k] += reads
                else:
                    k += 1
                    out_gene[k], out_umi[k], out_count[k] = gene[r], umi[r], reads
        n_molecules[c] = k + 1 - lo
        start = lo
        for j in range(lo + 1, k + 2):  # each (cell, gene): count descending, then UMI
            if j == k + 1 or out_gene[j] != out_gene[start]:
                _order_molecules(out_umi, out_count, start, j)
                start = j
    ends = np.cumsum(n_molecules)
    total = ends[-1] if n_cells else 0
    molecule_cell = np.empty(total, np.int64)
    molecule_gene = np.empty(total, np.int64)
    molecule_umi = np.empty(total, np.uint64)
    molecule_count = np.empty(total, np.int64)
    new_group = np.zeros(total, np.bool_)
    for c in numba.prange(n_cells):
        at, lo = ends[c] - n_molecules[c], cell_starts[c]
        for j in range(n_molecules[c]):
            molecule_cell[at + j] = c
            molecule_gene[at + j] = out_gene[lo + j]
            molecule_umi[at + j] = out_umi[lo + j]
            molecule_count[at + j] = out_count[lo + j]
            new_group[at + j] = j == 0 or out_gene[lo + j] != out_gene[lo + j - 1]
    starts = np.append(np.flatnonzero(new_group).astype(np.int64), np.int64(total))
    return molecule_cell, molecule_gene, molecule_umi, molecule_count, starts


@numba.njit(cache=True)
def _bit_length(value):
    bits = 0
    while value:
        value >>= np.uint64(1)
        bits += 1
    return bits


@numba.njit(cache=True)
def _order_molecules(umis, counts, lo, hi):
    """Sort ``lo:hi`` by count descending, ties by UMI (insertion sort for small groups)."""
    if hi - lo > SMALL_GROUP:
        order = np.argsort(umis[lo:hi], kind="mergesort")
        order = order[np.argsort(-counts[lo:hi][order], kind="mergesort")]
        umis[lo:hi], counts[lo:hi] = umis[lo:hi][order], counts[lo:hi][order]
        return
    for i in range(lo + 1, hi):
        u, c = umis[i], counts[i]
        j = i - 1
        while j >= lo and (counts[j] < c or (counts[j] == c and umis[j] > u)):
            umis[j + 1], counts[j + 1] = umis[j], counts[j]
            j -= 1
        umis[j + 1], counts[j + 1] = u, c


def dedup_reads(reads: pd.DataFrame, *, method: Method, threshold: int = 1, backend: Backend = "cpu") -> pd.DataFrame:
    """Deduplicated molecules per (cell, gene) of a table of reads.

    Parameters
    ----------
    reads
        ``cell`` and ``gene`` codes, packed ``umi`` and optionally ``reads`` (reads a row
        stands for), in host memory.
    method
        One of :data:`METHODS`, with UMI-tools' semantics.
    threshold
        Largest Hamming distance between UMIs of one molecule (network methods).
    backend
        ``"cpu"`` (Numba's parallel collapse and kernel) or ``"gpu"`` (cuDF's collapse and
        the CUDA kernel, compiled from the same source); the counts are the same.

    Returns
    -------
    Columns ``cell``, ``gene``, ``count`` (molecules), in host memory.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if reads.empty:
        return pd.DataFrame({"cell": [], "gene": [], "count": []}, dtype=np.int64)
    if backend == "gpu":
        from omicsprep.reads.umi_cuda import count_groups_gpu

        xp = cupy()
        frame = cudf().DataFrame({name: xp.asarray(reads[name].to_numpy()) for name in reads.columns})
        cell, gene, umis, counts, starts = molecule_groups(collapse_reads(frame), xp=xp)
        molecule_counts = count_groups_gpu(umis, counts, starts, METHODS.index(method), threshold, xp=xp).get()
        starts, cell, gene = starts.get(), cell.get(), gene.get()
    else:
        weight = reads["reads"].to_numpy(np.int64) if "reads" in reads else np.empty(0, np.int64)
        cell, gene, umis, counts, starts = collapse_codes(
            reads["cell"].to_numpy(np.int64), reads["gene"].to_numpy(np.int64), reads["umi"].to_numpy(np.uint64), weight
        )
        molecule_counts = count_groups(umis, counts, starts, METHODS.index(method), threshold)
    return pd.DataFrame({"cell": cell[starts[:-1]], "gene": gene[starts[:-1]], "count": molecule_counts})


def molecule_groups(molecules: DataFrame, *, xp: ModuleType) -> tuple[Any, Any, Any, Any, Any]:
    """The arrays the kernels take, from :func:`collapse_reads`'s sorted molecules.

    Returns
    -------
    ``cell``, ``gene``, ``umi`` (uint64) and ``count`` (int64) per molecule, and the start
    of every (cell, gene) group followed by the number of molecules, as ``xp`` arrays.
    """
    cell, gene = molecules["cell"].values, molecules["gene"].values
    boundary = ((cell[1:] != cell[:-1]) | (gene[1:] != gene[:-1])).nonzero()[0] + 1
    starts = xp.concatenate(
        [xp.zeros(1, dtype=xp.int64), boundary.astype(xp.int64), xp.full(1, len(molecules), dtype=xp.int64)]
    )
    return cell, gene, molecules["umi"].values.astype(xp.uint64), molecules["count"].values.astype(xp.int64), starts
