"""HDF5 datasets compressed with deflate (HDF5's gzip filter), on a pool of threads.

HDF5 runs its filters in the calling thread, so a gzip-compressed dataset is written and
read at one core's zlib speed (tens of MB/s; Cell Ranger's matrices are stored so). Here
each chunk is compressed by libdeflate (the ``deflate`` package, which releases the GIL) in
several threads and stored as it is (``write_direct_chunk``), or read from the file as
stored and decompressed in several threads. The datasets carry HDF5's own gzip and shuffle
filters: every HDF5 reader reads them.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import deflate
import numpy as np

from omicsprep.resources import usable_cores

# Bytes per chunk: large enough that per-chunk calls cost little (4 MB wrote and read as
# fast), small enough that a reader of a few rows (anndata's backed mode) inflates little
# beyond them and HDF5 keeps the chunk in its cache (1 MB by default): random rows read
# 1.5x as slowly as from anndata's own gzip file, against 6x with chunks of 4 MB.
CHUNK_BYTES = 512 << 10
# libdeflate's fastest level: at level 4 (Cell Ranger's) files are 5-10% smaller, written 2x slower.
DEFLATE_LEVEL = 1
MAX_THREADS = 16

_DEFLATE = 1  # HDF5's filter identifiers (H5Z_FILTER_DEFLATE, H5Z_FILTER_SHUFFLE)
_SHUFFLE = 2

Item = TypeVar("Item")
Result = TypeVar("Result")


def codec_threads() -> int:
    """Threads that compress or decompress: the cores this process may use, at most :data:`MAX_THREADS`."""
    return min(MAX_THREADS, usable_cores())


def deflatable(array: Any) -> bool:
    """Whether :func:`create_deflated` stores ``array`` (numbers or booleans, at least one value)."""
    return isinstance(array, np.ndarray) and array.dtype.kind in "biuf" and array.ndim >= 1 and array.size > 0


def create_deflated(
    parent: Any, name: str, array: np.ndarray, *, level: int = DEFLATE_LEVEL, chunk_rows: int | None = None
) -> Any:
    """Store ``array`` as dataset ``name`` of HDF5 group ``parent``, deflated in several threads.

    Chunks hold whole rows: ``chunk_rows``, by default about :data:`CHUNK_BYTES`. Integers
    are shuffled first (HDF5's shuffle filter: each value's bytes grouped by position), which
    makes sorted indices about a third smaller; floating-point values compress better unshuffled.

    Returns
    -------
    The new ``h5py.Dataset``.
    """
    array = np.ascontiguousarray(array)
    n_rows, *row_shape = array.shape
    rows = DeflatedRows(
        parent, name, dtype=array.dtype, row_shape=tuple(row_shape), n_rows=n_rows, level=level, chunk_rows=chunk_rows
    )
    rows.append(array)
    return rows.close()


class DeflatedRows:
    """An HDF5 dataset written in pieces of whole rows, deflated in several threads as :func:`create_deflated` writes.

    Without ``n_rows`` the dataset grows with each piece (resizable), so that a matrix
    brought from the GPU block by block is stored without being whole in host memory.

    Parameters
    ----------
    parent, name
        The HDF5 group and the new dataset's name.
    dtype, row_shape
        The values' type and the shape of a row (``()`` for a vector).
    n_rows
        The dataset's length, if known.
    level, chunk_rows
        As for :func:`create_deflated`.
    """

    def __init__(
        self,
        parent: Any,
        name: str,
        *,
        dtype: np.dtype,
        row_shape: tuple[int, ...] = (),
        n_rows: int | None = None,
        level: int = DEFLATE_LEVEL,
        chunk_rows: int | None = None,
    ) -> None:
        dtype = np.dtype(dtype)
        row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        rows = chunk_rows or max(1, CHUNK_BYTES // max(1, row_bytes))
        self._rows = max(1, min(rows, n_rows)) if n_rows is not None else rows
        self._row_shape = tuple(row_shape)
        self._level = level
        self._shuffle = dtype.kind in "iu" and dtype.itemsize > 1
        self._resizable = n_rows is None
        self._stored = 0
        self._tail: np.ndarray | None = None  # rows short of a chunk, until the next piece
        self.dataset = parent.create_dataset(
            name,
            shape=(n_rows or 0, *row_shape),
            maxshape=(None, *row_shape) if self._resizable else None,
            dtype=dtype,
            chunks=(self._rows, *row_shape),
            compression="gzip",
            compression_opts=level,
            shuffle=self._shuffle,
        )

    def append(self, piece: np.ndarray) -> None:
        """Store the rows of ``piece`` after those stored; whole chunks at once, the rest with the next piece."""
        piece = np.ascontiguousarray(piece, dtype=self.dataset.dtype)
        if self._tail is not None:
            head = np.concatenate((self._tail, piece[: self._rows - len(self._tail)]))
            piece = piece[len(head) - len(self._tail) :]
            self._tail = None
            if len(head) < self._rows:
                self._tail = head
                return
            self._store(head)
        whole = len(piece) - len(piece) % self._rows
        self._store(piece[:whole])
        if whole < len(piece):
            self._tail = piece[whole:].copy()  # not a view: the piece's memory is freed

    def close(self) -> Any:
        """Store the last rows (an edge chunk) and return the dataset."""
        if self._tail is not None:
            self._store(self._tail)
            self._tail = None
        return self.dataset

    def _store(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        if self._resizable:
            self.dataset.resize(self._stored + len(rows), axis=0)
        starts = range(0, len(rows), self._rows)
        zero = (0,) * len(self._row_shape)
        for start, stored in zip(starts, _in_order(partial(self._compress, rows), starts), strict=True):
            self.dataset.id.write_direct_chunk((self._stored + start, *zero), stored)
        self._stored += len(rows)

    def _compress(self, rows: np.ndarray, start: int) -> bytearray:
        block = rows[start : start + self._rows]
        if len(block) < self._rows:  # HDF5 stores edge chunks whole
            whole = np.zeros((self._rows, *self._row_shape), dtype=rows.dtype)  # in the array's byte order
            whole[: len(block)] = block
            block = whole
        raw = _shuffled(block) if self._shuffle else block.reshape(-1).view(np.uint8)
        return deflate.zlib_compress(raw, self._level)


def read_deflated(dataset: Any, *, dtype: np.dtype | type | None = None) -> np.ndarray | None:
    """Read a deflated (and maybe shuffled) HDF5 dataset, decompressing its chunks in several threads.

    Parameters
    ----------
    dataset
        An ``h5py.Dataset`` of numbers.
    dtype
        The type to return, converted chunk by chunk (the dataset's by default).

    Returns
    -------
    The values, or ``None`` where this reader does not apply, for HDF5 to read: a dataset
    stored otherwise (contiguous, other filters, chunks that do not span whole rows, chunks
    never written) or in a file not opened from disk.
    """
    filters = _filters_of_row_chunks(dataset)
    if filters is None:
        return None
    # Read here, not in the threads: each h5py call takes h5py's lock, which the caller may
    # hold (anndata 0.11 iterates a group's members under it) while waiting for them.
    rows, stored, shape = dataset.chunks[0], dataset.dtype, dataset.shape
    chunks = _stored_chunks(dataset)
    if chunks is None or len(chunks) != -(-shape[0] // rows):
        return None
    out = np.empty(shape, dtype=stored if dtype is None else dtype)
    chunk_bytes = rows * stored.itemsize * int(np.prod(shape[1:], dtype=np.int64))

    def decompress(chunk: Any) -> None:
        raw: Any = bytearray(chunk.size)
        read_exactly(fd, memoryview(raw), offset=chunk.byte_offset)
        applied = [code for index, code in enumerate(filters) if not chunk.filter_mask & (1 << index)]
        for code in reversed(applied):  # undone in reverse order of the pipeline
            if code == _DEFLATE:
                raw = deflate.zlib_decompress(raw, chunk_bytes)
            elif code == _SHUFFLE:
                raw = _unshuffled(np.frombuffer(raw, dtype=np.uint8), stored.itemsize)
        start = chunk.chunk_offset[0]
        values = np.frombuffer(raw, dtype=stored).reshape(rows, *shape[1:])
        out[start : start + rows] = values[: len(out) - start]

    fd = os.open(dataset.file.filename, os.O_RDONLY)
    try:
        for _ in _in_order(decompress, chunks):
            pass  # raises the first chunk's error
    finally:
        os.close(fd)
    return out


def _filters_of_row_chunks(dataset: Any) -> list[int] | None:
    """The filters of a deflated dataset of numbers stored in chunks of whole rows on disk, else ``None``."""
    if dataset.chunks is None or dataset.dtype.kind not in "biuf" or dataset.size == 0 or dataset.file.driver != "sec2":
        return None
    if tuple(dataset.chunks[1:]) != tuple(dataset.shape[1:]):
        return None
    plist = dataset.id.get_create_plist()
    filters = [plist.get_filter(index)[0] for index in range(plist.get_nfilters())]
    if _DEFLATE not in filters or not set(filters) <= {_DEFLATE, _SHUFFLE}:
        return None
    return filters


def _stored_chunks(dataset: Any) -> list[Any] | None:
    """Each stored chunk's place in the dataset and in the file (``StoreInfo``).

    ``None`` where h5py was built without ``chunk_iter`` (HDF5 before 1.12.3 or 1.10.10).
    """
    if not hasattr(dataset.id, "chunk_iter"):
        return None
    chunks: list[Any] = []
    dataset.id.chunk_iter(chunks.append)
    return chunks


def _shuffled(block: np.ndarray) -> np.ndarray:
    """HDF5's shuffle: the first byte of every value, then every second byte, and so on."""
    return np.ascontiguousarray(block.reshape(-1).view(np.uint8).reshape(-1, block.dtype.itemsize).T).reshape(-1)


def _unshuffled(raw: np.ndarray, itemsize: int) -> np.ndarray:
    return np.ascontiguousarray(raw.reshape(itemsize, -1).T).reshape(-1)


def read_exactly(fd: int, view: memoryview, *, offset: int) -> None:
    """Fill ``view`` (bytes) from file ``fd`` at ``offset``; a file that ends first is an ``OSError``.

    ``preadv`` needs no shared file position, so threads read one file at once.
    """
    done = 0
    while done < view.nbytes:
        n_read = os.preadv(fd, [view[done:]], offset + done)
        if n_read == 0:
            raise OSError(f"file ends before its data does (at byte {offset + done})")
        done += n_read


def _in_order(work: Callable[[Item], Result], items: Iterable[Item]) -> Iterator[Result]:
    """``work`` of each item on :func:`codec_threads` threads, yielded in order.

    At most twice as many items as threads are in flight, so results wait in memory only
    that far ahead of their consumer.
    """
    threads = codec_threads()
    pending: deque[Future[Result]] = deque()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for item in items:
            pending.append(pool.submit(work, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        for future in pending:
            yield future.result()
