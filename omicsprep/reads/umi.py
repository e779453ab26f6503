"""UMI deduplication with UMI-tools' semantics, as Numba kernels.

Reads become molecules: one row per (cell, gene, UMI) with its read count. Within each
(cell, gene) the UMIs are ordered by count, ties by sequence (as UMI-tools 1.1 orders them:
it sorts each component's UMIs before ranking them by count), and counted by one of
UMI-tools' methods; UMIs are 2-bit packed (A<C<G<T, so sequence order is numeric order) and
a Hamming distance is a popcount.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

import numba
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from omicsprep.backend import Backend, cudf, cupy
from omicsprep.errors import InputError
from omicsprep.reads import umi_kernels

if TYPE_CHECKING:
    from pandas import DataFrame  # or cudf.DataFrame

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
    lengths = pc.binary_length(umis)  # bytes: the kernel walks bytes (a non-ASCII base is a mixed length)
    shortest, longest = (pc.min(lengths).as_py() or 0), (pc.max(lengths).as_py() or 0)
    if shortest != longest:
        raise InputError(f"UMIs of mixed lengths ({shortest} to {longest} bases)")
    if longest > MAX_UMI_LENGTH:
        raise InputError(f"UMIs of {longest} bases; at most {MAX_UMI_LENGTH} are supported")
    # Equal lengths: the string data is one contiguous block of n x length bytes.
    offsets = np.frombuffer(umis.buffers()[1], dtype=np.int32)[umis.offset : umis.offset + len(umis) + 1]
    data = np.frombuffer(umis.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return _pack_equal_length(data, len(umis), longest, _BASE_CODES)


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
        ``"cpu"`` (pandas and Numba's parallel kernel) or ``"gpu"`` (cuDF and the CUDA
        kernel, compiled from the same source); the counts are the same.

    Returns
    -------
    Columns ``cell``, ``gene``, ``count`` (molecules), in host memory.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if reads.empty:
        return pd.DataFrame({"cell": [], "gene": [], "count": []}, dtype=np.int64)
    if backend == "gpu":
        xp = cupy()
        frame = cudf().DataFrame({name: xp.asarray(reads[name].to_numpy()) for name in reads.columns})
    else:
        xp, frame = np, reads
    cell, gene, umis, counts, starts = molecule_groups(collapse_reads(frame), xp=xp)
    if backend == "gpu":
        from omicsprep.reads.umi_cuda import count_groups_gpu

        molecule_counts = count_groups_gpu(umis, counts, starts, METHODS.index(method), threshold, xp=xp).get()
        starts, cell, gene = starts.get(), cell.get(), gene.get()
    else:
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
