"""BAM records as integer codes: BGZF inflated in parallel, records scanned by Numba.

A BAM file is a series of BGZF blocks (deflate streams of at most 64 KiB each). Blocks are
inflated by libdeflate (the ``deflate`` package, which releases the GIL) on a pool of
threads, a chunk of about :data:`CHUNK_BYTES` at a time; a record cut by the chunk's end is
carried into the next. Numba kernels find every record (a serial walk over the record
lengths, done on the pool for the next chunk while this one is scanned) and read each one's flag, MAPQ, cell,
UMI and gene in parallel over runs of records; each run numbers the cell and gene names it
meets while they are in cache, then the runs' distinct names are numbered in dictionaries
that live as long as the reader, so a code means one name throughout the file. No Python
object is made per read.

The cell and UMI come from tags (``CB``, ``UB``, ... of type ``Z``) or from the read name
(``read_id``: umi_tools extract's ``<read>_<cell>_<umi>``; ``umis``: ``...:CELL_<cell>:UMI_<umi>:...``);
the gene from a tag. A missing tag, a tag of another type and STARsolo's ``-`` are missing
values. UMIs are 2-bit packed (A<C<G<T), with UMIs holding another base (N) flagged.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numba
import numpy as np

from omicsprep.errors import InputError
from omicsprep.jit_cache import track_sources
from omicsprep.reads.bgzf import MAX_BLOCK_BYTES, bgzf_blocks, bgzf_eof_present
from omicsprep.reads.names import NameDictionary, find_name, fnv1a
from omicsprep.reads.umi import numba_threads
from omicsprep.resources import usable_cores

track_sources()  # before the functions below are compiled and cached (cache=True)

CHUNK_BYTES = 16 << 20  # inflated bytes scanned at a time (plus one record carried over)
RAW_READ_BYTES = 4 << 20  # compressed bytes read from the file at a time
HEADROOM = 1 << 20  # bytes before a chunk's inflated bytes, for the record cut by the chunk before
RUNS_PER_THREAD = 4  # runs of records scanned in parallel, for balance
MIN_RUN_RECORDS = 4096  # fewer runs in a small chunk
_MISSING = -1
# umi_source codes of the kernels
SOURCE_CODES = {"tag": 0, "read_id": 1, "umis": 2}
_BASE_CODES = np.full(256, 255, dtype=np.uint8)
for _code, _base in enumerate(b"ACGT"):
    _BASE_CODES[_base] = _code


@dataclass(frozen=True)
class RecordCodes:
    """One chunk of BAM records as codes, one entry per record.

    ``cell``, ``gene``: codes into the reader's :class:`NameDictionary` (-1: missing);
    ``umi``: packed bases; ``umi_length``: bases (-1: missing); ``umi_acgt``: only A, C, G, T.
    """

    flag: np.ndarray
    mapq: np.ndarray
    cell: np.ndarray
    gene: np.ndarray
    umi: np.ndarray
    umi_length: np.ndarray
    umi_acgt: np.ndarray


@numba.njit(cache=True, inline="always")
def _int32(buf, at):
    return np.int64(
        np.int32(
            np.uint32(buf[at])
            | (np.uint32(buf[at + 1]) << 8)
            | (np.uint32(buf[at + 2]) << 16)
            | (np.uint32(buf[at + 3]) << 24)
        )
    )


@numba.njit(cache=True, nogil=True)
def _header_end(buf):
    """Offset of the first record, past the BAM header; -1 while the header is incomplete, -2 if not BAM."""
    if buf.size < 4:
        return -1
    if buf[0] != 66 or buf[1] != 65 or buf[2] != 77 or buf[3] != 1:
        return -2
    if buf.size < 12:
        return -1
    at = 8 + _int32(buf, 4)
    if at + 4 > buf.size:
        return -1
    n_references = _int32(buf, at)
    at += 4
    for _ in range(n_references):
        if at + 4 > buf.size:
            return -1
        at += 4 + _int32(buf, at) + 4
    return at if at <= buf.size else -1


@numba.njit(cache=True, nogil=True)
def _record_offsets(buf, start):
    """Offsets of the whole records from ``start``, and where the first incomplete one begins.

    -1 as that end marks a record shorter than its fixed fields (corrupt).
    """
    offsets = np.empty((buf.size - start) // 36 + 1, np.int64)
    n, at = 0, start
    while at + 4 <= buf.size:
        size = _int32(buf, at)
        if size < 32:
            return offsets[:n], np.int64(-1)
        if at + 4 + size > buf.size:
            break
        offsets[n] = at
        n += 1
        at += 4 + size
    return offsets[:n], np.int64(at)


@numba.njit(cache=True, inline="always")
def _value_after(buf, lo, hi, key):
    """Start and end of the first non-empty value after ``key`` in ``buf[lo:hi]``, up to a ``:`` or ``hi``."""
    k = key.size
    for i in range(lo, hi - k):
        found = True
        for j in range(k):
            if buf[i + j] != key[j]:
                found = False
                break
        if found:
            end = i + k
            while end < hi and buf[end] != 58:  # ':'
                end += 1
            if end > i + k:
                return i + k, end
    return -1, -1


@numba.njit(cache=True, inline="always")
def _tag_value_end(buf, at, kind, end):
    """Offset past a tag value of type ``kind`` starting at ``at``; -1 if malformed."""
    if kind == 90 or kind == 72:  # Z, H: NUL-terminated
        while at < end and buf[at] != 0:
            at += 1
        return at + 1 if at < end else -1
    if kind == 65 or kind == 99 or kind == 67:  # A c C
        return at + 1
    if kind == 115 or kind == 83:  # s S
        return at + 2
    if kind == 105 or kind == 73 or kind == 102:  # i I f
        return at + 4
    if kind == 66 and at + 5 <= end:  # B: subtype, count, values
        sub = buf[at]
        width = (
            1
            if (sub == 99 or sub == 67)
            else 2
            if (sub == 115 or sub == 83)
            else 4
            if (sub == 105 or sub == 73 or sub == 102)
            else 0
        )
        count = _int32(buf, at + 1)
        if width == 0 or count < 0:
            return -1
        return at + 5 + width * count
    return -1


@numba.njit(cache=True, inline="always")
def _parse_record(
    buf,
    i,
    offsets,
    source,
    tags,
    cell_key,
    umi_key,
    base_codes,
    flag,
    mapq,
    starts,
    lengths,
    umi,
    umi_length,
    umi_acgt,
    corrupt,
):
    """Fill entry ``i`` of the arrays of :func:`_scan_records` from record ``i``."""
    record = offsets[i] + 4
    end = record + _int32(buf, offsets[i])
    mapq[i] = buf[record + 9]
    flag[i] = buf[record + 14] | (np.uint16(buf[record + 15]) << 8)
    name_length = np.int64(buf[record + 8])
    n_cigar = np.int64(buf[record + 12]) | (np.int64(buf[record + 13]) << 8)
    n_bases = _int32(buf, record + 16)
    name = record + 32
    at = name + name_length + 4 * n_cigar + (n_bases + 1) // 2 + n_bases
    if at > end or n_bases < 0 or name_length < 1:
        corrupt[i] = True
        return
    umi_start, umi_end = -1, -1
    if source == 2:  # umis: ...:CELL_<cell>:UMI_<umi>:...
        cell_start, cell_end = _value_after(buf, name, name + name_length - 1, cell_key)
        umi_start, umi_end = _value_after(buf, name, name + name_length - 1, umi_key)
        if cell_start >= 0:
            starts[0, i], lengths[0, i] = cell_start, cell_end - cell_start
    elif source == 1:  # read_id: <read>_<cell>_<umi>
        last, before = -1, -1
        for k in range(name, name + name_length - 1):
            if buf[k] == 95:  # '_'
                last, before = k, last
        if last >= 0 and last + 1 < name + name_length - 1:
            umi_start, umi_end = last + 1, name + name_length - 1
            if before >= 0 and last > before + 1:
                starts[0, i], lengths[0, i] = before + 1, last - before - 1
    while at + 3 <= end:
        kind = buf[at + 2]
        which = -1
        for t in range(3):
            if buf[at] == tags[t, 0] and buf[at + 1] == tags[t, 1]:
                which = t
        value_end = _tag_value_end(buf, at + 3, kind, end)
        if value_end < 0 or value_end > end:
            corrupt[i] = True
            break
        if kind == 90 and which >= 0:
            value_start, value_stop = at + 3, value_end - 1  # the NUL excluded
            if not (value_stop - value_start == 1 and buf[value_start] == 45):  # STARsolo's '-': missing
                if which == 1:
                    if source == 0:
                        umi_start, umi_end = value_start, value_stop
                elif which == 2 or source == 0:
                    slot = 0 if which == 0 else 1
                    starts[slot, i], lengths[slot, i] = value_start, value_stop - value_start
        at = value_end
    if at != end and not corrupt[i]:
        corrupt[i] = True
    if umi_start >= 0:
        umi_length[i] = min(umi_end - umi_start, 32767)
        packed = np.uint64(0)
        for k in range(umi_start, min(umi_end, umi_start + 32)):
            code = base_codes[buf[k]]
            if code == 255:
                umi_acgt[i] = False
            packed = (packed << np.uint64(2)) | np.uint64(code & 3)
        umi[i] = packed


@numba.njit(cache=True, parallel=True)
def _scan_records(buf, offsets, source, tags, cell_key, umi_key, base_codes, n_ranges):
    """Flag, MAPQ, cell, UMI and gene of each record, in parallel over ``n_ranges`` runs of records.

    ``tags``: the cell, UMI and gene tag names (2 bytes each). Each run numbers the cell and
    gene names it meets in its own dictionary, searched while the record is in cache, so
    only the distinct names of each run are left to number for the whole file
    (:meth:`NameDictionary.codes`). Returns, per record, flag, MAPQ, the cell's and gene's
    run codes (-1: missing), the UMI packed with its length (-1: missing) and whether it
    holds only A, C, G, T, and ``corrupt`` (the record overruns its length); per run, its
    first record and distinct names; per distinct name (at ``first record + run code``),
    its hash, start and length in ``buf``.
    """
    n = offsets.size
    flag = np.empty(n, np.uint16)
    mapq = np.empty(n, np.uint8)
    starts = np.full((2, n), -1, np.int64)  # cell, gene; then of each run's distinct names
    lengths = np.zeros((2, n), np.int32)
    hashes = np.zeros((2, n), np.uint64)
    codes = np.full((2, n), _MISSING, np.int32)
    umi = np.zeros(n, np.uint64)
    umi_length = np.full(n, -1, np.int16)
    umi_acgt = np.ones(n, np.bool_)
    corrupt = np.zeros(n, np.bool_)
    run_starts = np.linspace(0, n, n_ranges + 1).astype(np.int64)
    distinct = np.zeros((2, n_ranges), np.int64)
    for r in numba.prange(n_ranges):
        lo, hi = run_starts[r], run_starts[r + 1]
        n_slots = 1024
        while n_slots < 2 * (hi - lo):
            n_slots *= 2
        cell_table = (np.full(n_slots, -1, np.int32), hashes[0, lo:hi], starts[0, lo:hi], lengths[0, lo:hi], buf)
        gene_table = (np.full(n_slots, -1, np.int32), hashes[1, lo:hi], starts[1, lo:hi], lengths[1, lo:hi], buf)
        for i in range(lo, hi):
            _parse_record(
                buf, i, offsets, source, tags, cell_key, umi_key, base_codes,
                flag, mapq, starts, lengths, umi, umi_length, umi_acgt, corrupt,
            )  # fmt: skip
            for slot in range(2):
                start = starts[slot, i]
                if start < 0:
                    continue
                length = lengths[slot, i]
                value = fnv1a(buf, start, length)
                table = cell_table if slot == 0 else gene_table
                code = find_name(buf, start, length, value, table)
                if code < 0:  # new to the run: its entry at lo + its code (records up to i are done with theirs)
                    table[0][-code - 2] = distinct[slot, r]
                    code = distinct[slot, r]
                    hashes[slot, lo + code], starts[slot, lo + code], lengths[slot, lo + code] = value, start, length
                    distinct[slot, r] = code + 1
                codes[slot, i] = code
    return flag, mapq, codes, run_starts, distinct, hashes, starts, lengths, umi, umi_length, umi_acgt, corrupt


class BamRecords:
    """Stream the records of a BAM file as :class:`RecordCodes`, chunk by chunk.

    Parameters
    ----------
    path
        A BAM file (BGZF-compressed, with its end-of-file block).
    umi_source
        ``tag``, ``read_id`` or ``umis`` (see the module's docstring).
    cell_tag, umi_tag, gene_tag
        Two-letter tag names.
    threads
        Cores to use, every one when ``None``: half inflate blocks, the others scan records.

    ``cells`` and ``genes`` hold the names behind the codes, growing as chunks are read.

    Raises
    ------
    InputError
        (while iterating) No BGZF end-of-file block (truncated), a malformed or corrupt
        block, a file that is not BAM, or a malformed record.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        umi_source: str = "tag",
        cell_tag: str = "CB",
        umi_tag: str = "UB",
        gene_tag: str = "GX",
        threads: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.source = SOURCE_CODES[umi_source]
        self.tags = np.array([[ord(c) for c in tag] for tag in (cell_tag, umi_tag, gene_tag)], dtype=np.uint8)
        threads = threads or usable_cores()
        # Blocks inflate on the pool while the scan runs: the two share the cores. With a
        # thread of each per core, the scan's threads and the inflaters contend (16 cores:
        # 4.9 s against 2.3 s for 10M reads; 2 cores: 6.7 s against 4.1 s).
        self.inflate_threads = max(1, threads // 2)
        self.scan_threads = max(1, threads - self.inflate_threads)
        self.cells, self.genes = NameDictionary(), NameDictionary()

    def __iter__(self) -> Iterator[RecordCodes]:
        if not bgzf_eof_present(self.path):
            raise InputError("BAM is truncated (no BGZF end-of-file block)", path=self.path)
        with self.path.open("rb") as handle, ThreadPoolExecutor(self.inflate_threads) as pool:
            # Chunk i inflates into buffers[i % 3] (reused: fresh pages cost more than the
            # inflating). While chunk i is scanned, chunk i + 1 is walked on the pool and
            # chunk i + 2 inflated.
            buffers = [np.empty(HEADROOM + CHUNK_BYTES + MAX_BLOCK_BYTES, np.uint8) for _ in range(3)]
            chunks = self._block_chunks(handle)
            inflating = deque(
                self._start_inflating(buffers[i], *blocks, pool=pool)
                for i, blocks in enumerate(itertools.islice(chunks, 2))
            )
            started = len(inflating)
            carried, records_start = np.empty(0, np.uint8), -1
            walking = pool.submit(self._walk, carried, *inflating.popleft(), records_start) if inflating else None
            while walking is not None:
                buf, offsets, rest, records_start = walking.result()
                carried = buf[rest:]
                for blocks in itertools.islice(chunks, 1):
                    inflating.append(self._start_inflating(buffers[started % 3], *blocks, pool=pool))
                    started += 1
                walking = pool.submit(self._walk, carried, *inflating.popleft(), records_start) if inflating else None
                if records_start == 0:  # past the header
                    yield self._codes(buf, offsets)
        if records_start < 0 or carried.size:
            raise InputError("BAM is truncated (ends inside the header or a record)", path=self.path)

    def _walk(
        self, carried: np.ndarray, out: np.ndarray, inflating: list[Future], records_start: int
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """A chunk's bytes (``carried`` then the inflated ones), its whole records' offsets and where the rest begins.

        ``records_start``: where records begin in the chunk (-1: the header is not over yet).
        Returns that for the next chunk: 0, or -1 while the header goes on (the whole chunk is
        then the rest).
        """
        for task in inflating:
            task.result()
        buf = self._after(carried, out)
        if records_start < 0:
            records_start = _header_end(buf)
            if records_start == -2:
                raise InputError("is not a BAM file (no BAM magic after inflating)", path=self.path)
            if records_start < 0:
                return buf, np.empty(0, np.int64), 0, -1
        offsets, rest = _record_offsets(buf, records_start)
        if rest < 0:
            raise InputError("corrupt BAM record (shorter than its fixed fields)", path=self.path)
        return buf, offsets, int(rest), 0

    def _codes(self, buf: np.ndarray, offsets: np.ndarray) -> RecordCodes:
        with numba_threads(self.scan_threads):
            scanned = _scan_records(
                buf,
                offsets,
                self.source,
                self.tags,
                np.frombuffer(b"CELL_", np.uint8),
                np.frombuffer(b"UMI_", np.uint8),
                _BASE_CODES,
                max(1, min(RUNS_PER_THREAD * self.scan_threads, len(offsets) // MIN_RUN_RECORDS)),
            )
        flag, mapq, run_codes, run_starts, distinct, hashes, starts, lengths, umi, umi_length, umi_acgt, corrupt = (
            scanned
        )
        if corrupt.any():
            raise InputError(
                f"corrupt BAM record (its fields overrun its length; record {int(corrupt.argmax()) + 1} of a chunk)",
                path=self.path,
            )
        codes = []
        run_of_record = np.repeat(run_starts[:-1], np.diff(run_starts))
        for slot, dictionary in enumerate((self.cells, self.genes)):
            names = np.concatenate(
                [np.arange(lo, lo + k) for lo, k in zip(run_starts[:-1], distinct[slot], strict=True)]
            )
            of_name = np.empty(len(offsets), np.int32)
            of_name[names] = dictionary.codes(buf, hashes[slot, names], starts[slot, names], lengths[slot, names])
            local = run_codes[slot]
            codes.append(np.where(local >= 0, of_name[run_of_record + np.maximum(local, 0)], _MISSING).astype(np.int32))
        return RecordCodes(flag, mapq, codes[0], codes[1], umi, umi_length, umi_acgt)

    def _block_chunks(self, handle: BinaryIO) -> Iterator[tuple[bytes, np.ndarray, np.ndarray, np.ndarray, int]]:
        """The file's BGZF blocks, about :data:`CHUNK_BYTES` of inflated bytes at a time.

        As compressed bytes, the start and end of each block's deflate data in them, each
        block's inflated size, and the file offset of the bytes.
        """
        raw, offset = b"", 0  # offset: of raw[0] in the file
        while True:
            more = handle.read(RAW_READ_BYTES)
            raw += more
            starts, ends, sizes, used, malformed = bgzf_blocks(np.frombuffer(raw, np.uint8))
            if malformed >= 0:
                raise InputError(f"malformed BGZF block header at byte {offset + malformed}", path=self.path)
            if not more and used < len(raw):
                raise InputError(f"BAM is truncated (a BGZF block cut at byte {offset + used})", path=self.path)
            if more and sizes.sum() < CHUNK_BYTES:
                continue
            chunk = (np.cumsum(sizes) - sizes) // CHUNK_BYTES  # of each block, by where its output starts
            runs = list(itertools.pairwise([0, *(np.flatnonzero(np.diff(chunk)) + 1), len(sizes)]))
            if more:  # the last chunk may fill up with the blocks of the next read
                runs = runs[:-1]
                used = ends[runs[-1][1] - 1] + 8 if runs else 0  # past the block's CRC and size
            for first, last in runs:
                if last > first:
                    yield raw, starts[first:last], ends[first:last], sizes[first:last], offset
            raw, offset = raw[used:], offset + used
            if not more:
                return

    def _start_inflating(
        self,
        buffer: np.ndarray,
        raw: bytes,
        starts: np.ndarray,
        ends: np.ndarray,
        sizes: np.ndarray,
        offset: int,
        *,
        pool: ThreadPoolExecutor,
    ) -> tuple[np.ndarray, list[Future]]:
        """The part of ``buffer`` that ``threads`` tasks fill with the blocks' inflated bytes, and the tasks.

        The bytes start :data:`HEADROOM` into the buffer, room for the record carried over.
        """
        import deflate

        out = buffer[: HEADROOM + int(sizes.sum())]
        out_starts = HEADROOM + np.concatenate([[0], np.cumsum(sizes)])
        view = memoryview(raw)

        def inflate(first: int, last: int) -> None:
            for b in range(first, last):
                if sizes[b] == 0:
                    continue
                try:
                    block = deflate.deflate_decompress(view[starts[b] : ends[b]], int(sizes[b]))
                except deflate.DeflateError as exc:
                    raise InputError(
                        f"corrupt BGZF block (deflate data at byte {offset + starts[b]}: {exc})", path=self.path
                    ) from exc
                out[out_starts[b] : out_starts[b + 1]] = np.frombuffer(block, np.uint8)

        bounds = np.linspace(0, len(sizes), min(self.inflate_threads, len(sizes)) + 1).astype(int)
        return out, [pool.submit(inflate, a, b) for a, b in itertools.pairwise(bounds)]

    @staticmethod
    def _after(carried: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``carried`` followed by the inflated bytes of ``out``: in its headroom where it fits."""
        if carried.size <= HEADROOM:
            out[HEADROOM - carried.size : HEADROOM] = carried
            return out[HEADROOM - carried.size :]
        return np.concatenate([carried, out[HEADROOM:]])
