"""The backend seam: the only module that imports GPU libraries.

CuPy, cuDF, cuML, cuGraph and rapids-singlecell are imported lazily, on first use, so that
every other module of omicsprep imports on machines without a GPU. The backend is always
explicit: ``"auto"`` resolves to ``"gpu"`` only when CuPy finds a CUDA device *and* the
other RAPIDS libraries are installed; an explicit ``"gpu"`` that cannot be honoured raises
:class:`~omicsprep.errors.BackendUnavailableError` instead of falling back to the CPU. The
other libraries are imported when first used, not when the backend is chosen, so one that
is installed but cannot be imported (a CUDA or driver mismatch) stops the rule with that
error, under ``"auto"`` too, rather than sending it to the CPU.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import importlib.util
import logging
import math
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from functools import cache
from itertools import pairwise
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from omicsprep.errors import BackendUnavailableError
from omicsprep.timings import phase

if TYPE_CHECKING:
    from anndata import AnnData

Backend = Literal["cpu", "gpu"]

log = logging.getLogger(__name__)

GPU_MODULES = ("cupy", "cudf", "cuml", "pylibcugraph", "rapids_singlecell")
# CuPy's parts that omicsprep's steps import themselves: prepare_gpu's thread imports them
# first, so that a step never imports them while that thread imports a library that does
# too (two threads in one import deadlocked a GPU rule on the H200).
CUPY_PARTS = ("cupyx", "cupyx.scipy.sparse", "cupyx.scipy.sparse.linalg", "cupy._core._routines_linalg")
# Recorded in every output, when imported in the producing process.
RECORDED_MODULES = (
    "omicsprep",
    "anndata",
    "scanpy",
    "numpy",
    "scipy",
    "pandas",
    "sklearn",
    "umap",
    "igraph",
    "leidenalg",
    "numba",
    *GPU_MODULES,
)


@cache
def gpu_unavailable_reason() -> str | None:
    """Say why the GPU backend cannot run here, or return ``None`` when it can.

    CuPy is imported and asked for a device; the other RAPIDS libraries are only looked
    up, and imported when a step first uses them (:func:`gpu_module`), since importing all
    of them takes a GPU rule's process about 15 s.
    """
    try:
        with phase("gpu_import"):
            n_devices = importlib.import_module("cupy").cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable GPU"
        return f"CuPy/CUDA unusable ({type(exc).__name__}: {exc})"
    if n_devices == 0:
        return "no CUDA device is visible"
    missing = [name for name in GPU_MODULES[1:] if importlib.util.find_spec(name) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


_preparation: list[threading.Thread] = []
_prepared: dict[str, threading.Event] = {}  # set once prepare_gpu's thread is done with the module


def prepare_gpu(backend: Backend, *, modules: tuple[str, ...] = ("rapids_singlecell",)) -> None:
    """Start creating the CUDA context and importing ``modules``, in order, in a background thread.

    A GPU rule calls it right after choosing its backend, so that this start-up (about 1.5 s
    of context and 1-2 s per library) overlaps reading its input, and the imports of
    libraries needed later (cuGraph, for clustering) overlap the first steps too; a
    :func:`gpu_module` call for one of ``modules`` waits for that one only. The thread
    imports :data:`CUPY_PARTS` before ``modules``. A failure is left to that call to
    report. A no-op on the CPU backend, and after the first call.

    Parameters
    ----------
    backend
        ``"cpu"`` or ``"gpu"``.
    modules
        GPU libraries the rule will use, in the order it first uses them.
    """
    if backend != "gpu" or _preparation:
        return
    imported = {name: threading.Event() for name in (*CUPY_PARTS, *modules)}
    _prepared.update(imported)

    def prepare() -> None:
        seconds, start = {}, time.perf_counter()
        try:
            sys.modules["cupy"].cuda.runtime.free(0)  # creates the context without the GIL
            seconds["context"] = time.perf_counter() - start
            for name in imported:
                with suppress(Exception):  # gpu_module imports it again, and reports it
                    importlib.import_module(name)
                imported[name].set()
                seconds[name] = time.perf_counter() - start - sum(seconds.values())
        except Exception:  # noqa: BLE001 - the context: gpu_module's imports report it
            pass
        finally:
            for event in imported.values():
                event.set()
        # Which part of the start-up a rule waited for (benchmarks/run.py's timelines).
        log.info("GPU start-up beside the rule: %s", ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items()))

    thread = threading.Thread(target=prepare, name="omicsprep-prepare-gpu", daemon=True)
    _preparation.append(thread)
    thread.start()


def gpu_module(name: str) -> ModuleType:
    """Import a GPU library (its seconds count as phase ``gpu_import``).

    A library that :func:`prepare_gpu`'s thread imports is waited for; before any other
    is imported, that thread is waited for whole, so that a module is never imported by
    two threads at once.

    Raises
    ------
    BackendUnavailableError
        It is installed but cannot be imported (a CUDA or driver mismatch, say).
    """
    imported = sys.modules.get(name)
    # A module being imported is in sys.modules already, marked as initializing.
    if imported is not None and not getattr(imported.__spec__, "_initializing", False):
        return imported
    if threading.current_thread() not in _preparation:
        with phase("gpu_import"):
            if name in _prepared:
                _prepared[name].wait()
            else:
                for thread in _preparation:
                    thread.join()
    imported = sys.modules.get(name)
    if imported is not None:
        return imported
    try:
        with phase("gpu_import"):
            return importlib.import_module(name)
    except Exception as exc:  # a driver or CUDA mismatch raises CUDA's own errors, not only ImportError
        msg = f"the GPU backend cannot import {name} ({type(exc).__name__}: {exc})"
        raise BackendUnavailableError(msg) from exc


def resolve_backend(choice: str) -> Backend:
    """Turn a configured backend (``auto``, ``cpu`` or ``gpu``) into the one to use.

    Parameters
    ----------
    choice
        ``"auto"`` picks the GPU when it is usable, ``"cpu"`` and ``"gpu"`` are taken as
        given.

    Returns
    -------
    ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    BackendUnavailableError
        ``choice`` is ``"gpu"`` and no usable GPU with RAPIDS is present.
    ValueError
        ``choice`` is none of the three.
    """
    if choice == "cpu":
        return "cpu"
    if choice not in ("auto", "gpu"):
        msg = f"backend must be 'auto', 'cpu' or 'gpu', not {choice!r}"
        raise ValueError(msg)
    reason = gpu_unavailable_reason()
    if reason is None:
        return "gpu"
    if choice == "gpu":
        msg = f"backend 'gpu' was requested but cannot be used: {reason}"
        raise BackendUnavailableError(msg)
    return "cpu"


def rapids_singlecell() -> ModuleType:
    """Return the imported ``rapids_singlecell`` module."""
    return gpu_module("rapids_singlecell")


def single_cell_api(backend: Backend) -> ModuleType:
    """Scanpy on the CPU, rapids-singlecell on the GPU: the ``pp``/``tl`` calls both spell alike."""
    if backend == "gpu":
        return rapids_singlecell()
    return importlib.import_module("scanpy")


def cupy() -> ModuleType:
    """Return the imported ``cupy`` module."""
    return gpu_module("cupy")


def release_device_memory() -> None:
    """Give back to the driver the device and pinned host memory that CuPy's pools keep for reuse."""
    gc.collect()  # arrays no longer referenced, but in cycles, still hold their blocks
    cupy().get_default_memory_pool().free_all_blocks()
    cupy().get_default_pinned_memory_pool().free_all_blocks()


def array_module(backend: Backend) -> ModuleType:
    """NumPy on the CPU, CuPy on the GPU: array code written once runs on either."""
    if backend == "gpu":
        return cupy()
    import numpy as np

    return np


def asnumpy(array: Any) -> Any:
    """``array`` in host memory: a CuPy array or sparse matrix copied back, anything else as it is."""
    if "cupy" not in sys.modules:
        return array
    cp = sys.modules["cupy"]
    if isinstance(array, cp.ndarray):
        return device_to_host(array)
    if not cupyx_sparse().issparse(array):
        return array
    if array.format not in COMPRESSED_FORMATS:
        return array.get()
    from scipy import sparse

    parts = (device_to_host(array.data), device_to_host(array.indices), device_to_host(array.indptr))
    return COMPRESSED_FORMATS[array.format](sparse)(parts, shape=array.shape)


# Sparse formats copied between host and GPU part by part, by name: their classes, given
# the module (scipy.sparse or cupyx.scipy.sparse).
COMPRESSED_FORMATS = {"csr": attrgetter("csr_matrix"), "csc": attrgetter("csc_matrix")}

# Arrays of at least STAGED_MIN_BYTES cross between host and GPU through pinned buffers of
# STAGING_CHUNK_BYTES, one per thread: CUDA copies pageable host memory through a single
# staging buffer of its own, at a fraction of the bus's speed (1.3 GB/s for a 1M-cell
# matrix on the H200 machine); in threads, the host-side copies run beside the transfers.
STAGED_MIN_BYTES = 1 << 26
STAGING_CHUNK_BYTES = 1 << 25
STAGING_THREADS = 8


def host_to_device(array: Any, *, threads: int = STAGING_THREADS) -> Any:
    """A NumPy array copied to the current GPU, large ones through pinned buffers in ``threads`` threads.

    Parameters
    ----------
    array
        Array in host memory.
    threads
        Threads copying chunks at once.

    Returns
    -------
    The CuPy array, its copy complete.
    """
    import numpy as np

    cp = cupy()
    if array.nbytes < STAGED_MIN_BYTES:
        return cp.asarray(array)
    source = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    device = cp.empty(array.shape, dtype=array.dtype)
    target = device.reshape(-1).view(cp.uint8)

    def copy_chunk(chunk: slice, buffer: Any, stream: Any) -> None:
        np.copyto(buffer, source[chunk])
        target[chunk].set(buffer, stream=stream)
        stream.synchronize()  # the buffer is free again

    _staged_copy(source.nbytes, copy_chunk, threads=threads)
    return device


def device_to_host(array: Any, *, threads: int = STAGING_THREADS) -> Any:
    """A CuPy array copied to host memory, large ones through pinned buffers in ``threads`` threads.

    Parameters
    ----------
    array
        Array on the current GPU.
    threads
        Threads copying chunks at once.

    Returns
    -------
    The NumPy array.
    """
    import numpy as np

    cp = cupy()
    if array.nbytes < STAGED_MIN_BYTES:
        return cp.asnumpy(array)
    source = cp.ascontiguousarray(array).reshape(-1).view(cp.uint8)
    host = np.empty(array.shape, dtype=array.dtype)
    target = host.reshape(-1).view(np.uint8)

    def copy_chunk(chunk: slice, buffer: Any, stream: Any) -> None:
        source[chunk].get(stream=stream, out=buffer)
        stream.synchronize()
        np.copyto(target[chunk], buffer)

    _staged_copy(source.nbytes, copy_chunk, threads=threads)
    return host


def _staged_copy(n_bytes: int, copy_chunk: Callable[[slice, Any, Any], None], *, threads: int) -> None:
    """Call ``copy_chunk(chunk, pinned_buffer, stream)`` for every chunk of ``n_bytes``, in ``threads`` threads.

    Each thread has its own pinned buffer and non-blocking stream; the current stream is
    synchronized first, since such streams do not wait for it.
    """
    import numpy as np

    cp = cupy()
    device = cp.cuda.Device()
    cp.cuda.get_current_stream().synchronize()
    starts = range(0, n_bytes, STAGING_CHUNK_BYTES)
    cupyx = gpu_module("cupyx")

    def copy_part(part: range) -> None:
        with device:
            stream = cp.cuda.Stream(non_blocking=True)
            buffer = cupyx.empty_pinned(STAGING_CHUNK_BYTES, dtype=np.uint8)
            for start in part:
                stop = min(start + STAGING_CHUNK_BYTES, n_bytes)
                copy_chunk(slice(start, stop), buffer[: stop - start], stream)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(copy_part, [starts[i::threads] for i in range(threads)]))


@contextmanager
def tf32_products() -> Iterator[None]:
    """CuPy's float32 matrix products on TF32 tensor cores inside the ``with`` block.

    The setting is process-wide: it is restored on leaving.
    """
    import numpy as np

    linalg = gpu_module("cupy._core._routines_linalg")
    previous = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
    try:
        yield
    finally:
        linalg.set_compute_type(np.float32, previous)


def cupy_compiler() -> ModuleType:
    """Return the imported ``cupy.cuda.compiler`` module (CuPy's NVRTC front and kernel cache)."""
    return importlib.import_module("cupy.cuda.compiler")


def cupyx_sparse() -> ModuleType:
    """Return the imported ``cupyx.scipy.sparse`` module."""
    return gpu_module("cupyx.scipy.sparse")


def cupyx_sparse_linalg() -> ModuleType:
    """Return the imported ``cupyx.scipy.sparse.linalg`` module (not imported with ``cupyx.scipy.sparse``)."""
    return gpu_module("cupyx.scipy.sparse.linalg")


def cudf() -> ModuleType:
    """Return the imported ``cudf`` module."""
    return gpu_module("cudf")


def pylibcugraph() -> ModuleType:
    """Return the imported ``pylibcugraph`` module: cuGraph's algorithms, without its Python layer.

    ``cugraph`` itself imports Dask's distributed scheduler, its communicators and NetworkX
    (1.5-2 s of a GPU rule's start-up, on the critical path); omicsprep needs none of them.
    """
    return gpu_module("pylibcugraph")


def cuml() -> ModuleType:
    """Return the imported ``cuml`` module."""
    return gpu_module("cuml")


def to_device(adata: AnnData, *, backend: Backend) -> None:
    """Move ``X`` and every layer to the GPU, in place; a no-op on the CPU backend.

    Call once per rule, right after reading.

    Parameters
    ----------
    adata
        Data in host memory.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    if backend == "gpu":
        adata.X = matrix_to_device(adata.X)
        for key in list(adata.layers.keys()):
            adata.layers[key] = matrix_to_device(adata.layers[key])


# CuPy's sparse matrices index with 32 bits: it would wrap larger index pointers silently.
# A matrix with more entries goes to the GPU in row blocks (a Dask array, computed in
# this process), each of at most BLOCK_ENTRIES: rapids-singlecell's steps take such arrays,
# and a block crosses between host and GPU on its own, so that host memory holds one
# block's copy at a time (its indices narrowed to 32 bits: 1 GB).
GPU_SPARSE_MAX_ENTRIES = 2**31 - 1
BLOCK_ENTRIES = 1 << 28


def max_gpu_sparse_entries() -> int:
    """The most entries one CuPy sparse matrix holds (:data:`GPU_SPARSE_MAX_ENTRIES`, read when called)."""
    return GPU_SPARSE_MAX_ENTRIES


def matrix_to_device(matrix: Any) -> Any:
    """A NumPy array or SciPy CSR/CSC matrix copied to the GPU (a matrix already there as it is).

    A CSR or CSC matrix of more than :data:`GPU_SPARSE_MAX_ENTRIES` entries becomes row blocks
    (:func:`row_blocks`) of at most :data:`BLOCK_ENTRIES` entries (a CSC matrix converted to
    CSR on the host first).

    Raises
    ------
    BackendUnavailableError
        A dimension longer than CuPy's 32-bit indices reach.
    """
    import numpy as np
    from scipy import sparse

    if sparse.issparse(matrix) and max(matrix.shape) > GPU_SPARSE_MAX_ENTRIES:
        msg = (
            f"the GPU backend cannot hold a {matrix.shape[0]:,} x {matrix.shape[1]:,} matrix: CuPy's sparse "
            f"matrices index with 32 bits (at most {GPU_SPARSE_MAX_ENTRIES:,}); run this sample with backend: cpu"
        )
        raise BackendUnavailableError(msg)
    if sparse.issparse(matrix) and matrix.format in COMPRESSED_FORMATS and matrix.nnz > GPU_SPARSE_MAX_ENTRIES:
        if matrix.format == "csc":  # the steps take blocks of cells (rows): a copy on the host, by SciPy
            log.info("%d x %d CSC matrix, %d entries: converted to CSR for row blocks", *matrix.shape, matrix.nnz)
            matrix = matrix.tocsr()
        bounds = row_block_bounds(matrix.indptr, max_entries=BLOCK_ENTRIES)
        log.info("%d x %d matrix, %d entries: to the GPU in %d row blocks", *matrix.shape, matrix.nnz, len(bounds) - 1)
        return row_blocks([_compressed_to_device(matrix, start, stop) for start, stop in pairwise(bounds)])
    if sparse.issparse(matrix) and matrix.format in COMPRESSED_FORMATS:
        return _compressed_to_device(matrix, 0, len(matrix.indptr) - 1)
    if sparse.issparse(matrix):
        msg = f"a {matrix.format.upper()} matrix cannot go to the GPU; CSR, CSC or dense only"
        raise TypeError(msg)
    return host_to_device(matrix) if isinstance(matrix, np.ndarray) else matrix


def _compressed_to_device(matrix: Any, start: int, stop: int) -> Any:
    """Rows (CSR) or columns (CSC) ``start:stop`` of a SciPy matrix, copied to the GPU with 32-bit indices."""
    import numpy as np

    first, last = int(matrix.indptr[start]), int(matrix.indptr[stop])
    parts = (
        host_to_device(matrix.data[first:last]),
        host_to_device(matrix.indices[first:last].astype(np.int32, copy=False)),
        host_to_device((matrix.indptr[start : stop + 1] - first).astype(np.int32)),
    )
    minor = matrix.shape[1] if matrix.format == "csr" else matrix.shape[0]
    shape = (stop - start, minor) if matrix.format == "csr" else (minor, stop - start)
    return COMPRESSED_FORMATS[matrix.format](cupyx_sparse())(parts, shape=shape)


def row_block_bounds(indptr: Any, *, max_entries: int) -> list[int]:
    """Bounds of consecutive row blocks of a CSR matrix, each of at most ``max_entries`` entries (or one row).

    Parameters
    ----------
    indptr
        The matrix's index pointers (host memory).
    max_entries
        Most entries per block.

    Returns
    -------
    0, the first row of each later block, and the number of rows.
    """
    import numpy as np

    n_rows = len(indptr) - 1
    bounds = [0]
    while bounds[-1] < n_rows:
        start = bounds[-1]
        stop = int(np.searchsorted(indptr, indptr[start] + max_entries, side="right")) - 1
        bounds.append(min(n_rows, max(stop, start + 1)))
    return bounds


def row_blocks(blocks: list[Any]) -> Any:
    """A Dask array of CSR matrices (SciPy's or CuPy's) stacked by rows, one block each, held in this process.

    Parameters
    ----------
    blocks
        The blocks, in order, with the same number of columns.
    """
    import dask.array

    name = f"row-blocks-{uuid.uuid4().hex}"
    graph = {(name, index, 0): block for index, block in enumerate(blocks)}
    n_cols = blocks[0].shape[1]
    chunks = (tuple(block.shape[0] for block in blocks), (n_cols,))
    meta = type(blocks[0])((0, n_cols), dtype=blocks[0].dtype)
    return dask.array.Array(graph, name, chunks, meta=meta)


def blocks_of(matrix: Any) -> Iterator[Any]:
    """Each row block of a Dask array of sparse matrices, computed in turn (one in memory at a time, unless held)."""
    if len(matrix.chunks[1]) > 1:
        matrix = matrix.rechunk({1: -1})
    for block in matrix.to_delayed().ravel():
        yield block.compute()


def sparse_entries(matrix: Any) -> int:
    """Stored entries of a SciPy or CuPy sparse matrix, or of a Dask array of them."""
    if is_dask_array(matrix):
        import dask

        return sum(dask.compute(*(dask.delayed(_entries)(block) for block in matrix.to_delayed().ravel())))
    return int(matrix.nnz)


def _entries(block: Any) -> int:
    return int(block.nnz)


def _index_array(block: Any, positions: Any) -> Any:
    """``positions`` (NumPy) on the block's device: CuPy's sparse matrices take CuPy indices."""
    return cupy().asarray(positions) if not _on_host(block) else positions


def _on_host(block: Any) -> bool:
    return type(block).__module__.split(".")[0] in ("scipy", "numpy")


def _stacked(parts: list[Any]) -> Any:
    """CSR matrices stacked by rows, on the host or the GPU as they are."""
    from scipy import sparse

    return (sparse if _on_host(parts[0]) else cupyx_sparse()).vstack(parts, format="csr")


def keep_rows(matrix: Any, keep: Any) -> Any:
    """The rows of row blocks (:func:`row_blocks`) where ``keep`` (a boolean per row, host memory) is true."""
    import numpy as np

    bounds = np.cumsum((0, *matrix.chunks[0]))
    kept = [
        block[_index_array(block, np.flatnonzero(keep[start:stop]))]
        for block, start, stop in zip(blocks_of(matrix), bounds[:-1], bounds[1:], strict=True)
    ]
    return row_blocks([block for block in kept if block.shape[0]] or kept[:1])


def keep_columns(matrix: Any, keep: Any) -> Any:
    """The columns of row blocks where ``keep`` (one boolean per column, host memory) is true, as blocks."""
    import numpy as np

    columns = np.flatnonzero(keep)
    return row_blocks([block[:, _index_array(block, columns)] for block in blocks_of(matrix)])


def take_rows(matrix: Any, rows: Any) -> Any:
    """Rows ``rows`` (ascending positions, host memory) of ``matrix``, as one matrix (row blocks joined).

    For a group of rows with fewer entries than :data:`GPU_SPARSE_MAX_ENTRIES`.
    """
    import numpy as np

    if not is_dask_array(matrix):
        return matrix[_index_array(matrix, rows)]
    bounds = np.cumsum((0, *matrix.chunks[0]))
    cut = np.searchsorted(rows, bounds)
    parts = [
        block[_index_array(block, rows[cut[index] : cut[index + 1]] - bounds[index])]
        for index, block in enumerate(blocks_of(matrix))
        if cut[index + 1] > cut[index]
    ]
    return _stacked(parts)


def with_columns_at(matrix: Any, positions: Any, *, n_columns: int) -> Any:
    """A CSR matrix (SciPy's or CuPy's) or row blocks with column ``j`` moved to ``positions[j]`` of ``n_columns``.

    ``positions`` (host memory) are distinct; the indices come back sorted.
    """
    if is_dask_array(matrix):
        return row_blocks([with_columns_at(block, positions, n_columns=n_columns) for block in blocks_of(matrix)])
    from scipy import sparse

    indices = _index_array(matrix, positions)[matrix.indices].astype(matrix.indices.dtype)
    module = sparse if _on_host(matrix) else cupyx_sparse()
    moved = module.csr_matrix((matrix.data, indices, matrix.indptr), shape=(matrix.shape[0], n_columns))
    if not moved.has_sorted_indices:  # sorted in place: the values copied, the caller's left as they are
        moved = module.csr_matrix((matrix.data.copy(), indices, matrix.indptr), shape=moved.shape)
        moved.sort_indices()
    return moved


def stacked_rows(matrices: list[Any]) -> Any:
    """CSR matrices (SciPy's or CuPy's) or row blocks stacked by rows; ``matrices`` is emptied.

    On the host one matrix; on the GPU one matrix where it fits CuPy's 32-bit indices, else
    row blocks (:func:`row_blocks`) of at most :data:`BLOCK_ENTRIES` entries. Each block is
    freed once copied (or cut into row blocks). On the host the stack's pages are taken as
    it fills, so memory holds about the stack and one block; on the GPU one matrix is
    allocated whole while the blocks are held, up to twice the stack (17 GB each at 2^31
    entries), and row blocks hold the blocks and one block's pieces.
    """
    blocks = [block for matrix in matrices for block in (blocks_of(matrix) if is_dask_array(matrix) else [matrix])]
    matrices.clear()
    entries = sum(map(_entries, blocks))
    if _on_host(blocks[0]) or entries <= GPU_SPARSE_MAX_ENTRIES:
        return _copied_into_one(blocks, entries=entries)
    pieces = []
    while blocks:
        block = blocks.pop(0)
        cuts = row_block_bounds(asnumpy(block.indptr), max_entries=BLOCK_ENTRIES)
        pieces += [block[start:stop] for start, stop in pairwise(cuts)]
    return row_blocks(pieces)


def _copied_into_one(blocks: list[Any], *, entries: int) -> Any:
    """CSR blocks (all on the host or all on the GPU) copied into one matrix, each taken from ``blocks`` once copied."""
    import numpy as np
    from scipy import sparse

    on_host = _on_host(blocks[0])
    xp = np if on_host else cupy()
    index_type = xp.int32 if entries <= GPU_SPARSE_MAX_ENTRIES else xp.int64
    shape = (sum(block.shape[0] for block in blocks), blocks[0].shape[1])
    data, indices = xp.empty(entries, dtype=blocks[0].dtype), xp.empty(entries, dtype=index_type)
    indptr = xp.zeros(shape[0] + 1, dtype=index_type)
    entry = row = 0
    while blocks:
        block = blocks.pop(0)
        n_entries, n_rows = _entries(block), block.shape[0]
        data[entry : entry + n_entries] = block.data[:n_entries]
        indices[entry : entry + n_entries] = block.indices[:n_entries]
        indptr[row + 1 : row + n_rows + 1] = block.indptr[1:].astype(index_type) + entry
        entry, row = entry + n_entries, row + n_rows
    return (sparse if on_host else cupyx_sparse()).csr_matrix((data, indices, indptr), shape=shape)


def joined_rows(matrix: Any) -> Any:
    """Row blocks as one CSR matrix, for fewer entries than :data:`GPU_SPARSE_MAX_ENTRIES`."""
    return _stacked(list(blocks_of(matrix)))


def column_entries(matrix: Any) -> Any:
    """Stored entries per column of row blocks, in host memory."""
    import numpy as np

    counts = np.zeros(matrix.shape[1], dtype=np.int64)
    for block in blocks_of(matrix):
        xp = np if _on_host(block) else cupy()
        counts += asnumpy(xp.bincount(block.indices, minlength=matrix.shape[1]))
    return counts


def take_columns(matrix: Any, start: int, stop: int) -> Any:
    """Columns ``start:stop`` of row blocks, as one CSR matrix (the blocks' parts joined).

    For columns with fewer entries than :data:`GPU_SPARSE_MAX_ENTRIES` (:func:`column_entries`).
    """
    return _stacked([block[:, start:stop] for block in blocks_of(matrix)])


# The largest temporary of a blocked computation on either backend (a block of gene-gene
# correlations, of gathered neighbour embeddings): 256 MB.
BLOCK_BYTES = 1 << 28

# Rows per Dask block: rapids-singlecell advises blocks of about 20,000 rows; larger ones
# cost fewer tasks, and 50,000 cells of 2,000 genes each stay far below CuPy's 2^31 entries.
SHARD_ROWS = 50_000


@contextmanager
def gpu_workers(n_gpus: int) -> Iterator[Any]:
    """A Dask cluster of one worker per GPU on this node (dask-cuda) for the ``with`` block; yields its client.

    The GPUs are the first ``n_gpus`` of ``CUDA_VISIBLE_DEVICES`` (SLURM sets it to the
    job's GPUs). This process keeps using its own current GPU for what is not sharded.

    Parameters
    ----------
    n_gpus
        Workers to start, one per GPU.

    Raises
    ------
    BackendUnavailableError
        No usable GPU, fewer than ``n_gpus`` visible, or dask-cuda missing.
    """
    reason = gpu_unavailable_reason()
    if reason is None:
        visible = cupy().cuda.runtime.getDeviceCount()
        if visible < n_gpus:
            reason = f"{n_gpus} GPUs were asked for and {visible} are visible"
    if reason is None:
        try:
            dask_cuda = importlib.import_module("dask_cuda")
            distributed = importlib.import_module("distributed")
        except ImportError as exc:
            reason = f"cannot import {exc.name} (pip install dask-cuda)"
    if reason is not None:
        msg = f"multi-GPU (Dask) was requested but cannot be used: {reason}"
        raise BackendUnavailableError(msg)
    with (
        dask_cuda.LocalCUDACluster(
            n_workers=n_gpus, threads_per_worker=1, protocol="tcp", dashboard_address=None, silence_logs=logging.WARNING
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        log.info("Dask workers on %d GPUs: %s", n_gpus, list(client.nthreads()))
        yield client


def _csr_to_device(block: Any) -> Any:
    return cupyx_sparse().csr_matrix(block)


def shard_to_gpus(adata: AnnData, *, client: Any) -> None:
    """Spread ``X`` (CSR, host memory) over the client's GPU workers, in place.

    ``X`` becomes a Dask array of CuPy CSR blocks of :data:`SHARD_ROWS` rows, held in the workers' memory.

    Parameters
    ----------
    adata
        Cells with ``X`` in host memory and no layers yet.
    client
        A client of :func:`gpu_workers`.
    """
    import dask.array

    matrix = adata.X
    n_workers = len(client.nthreads())
    n_blocks = math.ceil(math.ceil(matrix.shape[0] / SHARD_ROWS) / n_workers) * n_workers  # as many per GPU
    bounds = [round(i * matrix.shape[0] / n_blocks) for i in range(n_blocks + 1)]
    host_blocks = client.scatter([matrix[start:stop] for start, stop in pairwise(bounds)])
    device_blocks = client.map(_csr_to_device, host_blocks)
    meta = cupyx_sparse().csr_matrix((1, matrix.shape[1]), dtype=matrix.dtype)
    adata.X = _persisted(
        dask.array.concatenate(
            [
                dask.array.from_delayed(block, shape=(stop - start, matrix.shape[1]), dtype=matrix.dtype, meta=meta)
                for block, (start, stop) in zip(device_blocks, pairwise(bounds), strict=True)
            ]
        )
    )


def is_dask_array(value: Any) -> bool:
    """Whether ``value`` is a Dask array (without importing Dask where it is not in use)."""
    return "dask.array" in sys.modules and isinstance(value, sys.modules["dask.array"].Array)


def _copy_block(block: Any) -> Any:
    return block.copy()


def copy_blocks(array: Any) -> Any:
    """A copy of ``array``; for a Dask array, one whose blocks are copies.

    Dask's own ``copy`` shares them, and rapids-singlecell scales blocks in place.
    """
    if is_dask_array(array):
        return array.map_blocks(_copy_block, meta=array._meta)  # noqa: SLF001 - Dask's block type, as Dask passes it
    return array.copy()


def _persisted(array: Any) -> Any:
    array = array.persist()
    if _distributed_client() is not None:
        importlib.import_module("distributed").wait(array)  # persist returns at once; steps are timed
    return array


def _distributed_client() -> Any:
    """The Dask client in use (``merge.dask``'s workers), or ``None``: Dask arrays are then this process's."""
    if "distributed" not in sys.modules:
        return None
    try:
        return sys.modules["distributed"].default_client()
    except ValueError:
        return None


def in_row_blocks(value: Any) -> bool:
    """Whether ``value`` is sparse row blocks held in this process (:func:`row_blocks`).

    Such blocks hold a matrix beyond CuPy's 32-bit indices; Dask workers' shards are not these.
    """
    return is_dask_array(value) and _distributed_client() is None and hasattr(value._meta, "indptr")  # noqa: SLF001


def materialize(array: Any) -> Any:
    """Run a lazy Dask array's graph, waiting for it; any other array is returned as it is.

    The blocks are kept in the workers' memory, so later steps do not repeat the graph.
    """
    return _persisted(array) if is_dask_array(array) else array


def gather(array: Any) -> Any:
    """A Dask array's blocks brought into this process and joined; any other array as it is.

    CuPy blocks land on this process's GPU.
    """
    return array.compute() if is_dask_array(array) else array


def _to_host_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_host_value(v) for k, v in value.items()}
    if in_row_blocks(value):
        return value  # written block by block (omicsprep.io)
    if is_dask_array(value):
        import dask
        import numpy as np
        from scipy import sparse

        if len(value.chunks) > 1 and len(value.chunks[1]) > 1:
            value = value.rechunk({1: -1})  # blocks of whole rows, stacked below
        blocks = dask.compute(*(dask.delayed(asnumpy)(block) for block in value.to_delayed().ravel()))
        return sparse.vstack(blocks, format="csr") if sparse.issparse(blocks[0]) else np.concatenate(blocks)
    return asnumpy(value)


def to_host(adata: AnnData) -> None:
    """Bring every array of ``adata`` back to host memory, in place, before writing.

    A sparse matrix in row blocks of this process (:func:`row_blocks`: more entries than
    CuPy's 32-bit indices reach) stays where it is: :mod:`omicsprep.io` writes it block by
    block, each brought back as it is written, so that host memory holds one block at a time.
    """
    adata.X = _to_host_value(adata.X)
    for mapping in (adata.layers, adata.obsm, adata.varm, adata.obsp, adata.varp):
        for key in list(mapping.keys()):
            mapping[key] = _to_host_value(mapping[key])
    for key in list(adata.uns.keys()):
        adata.uns[key] = _to_host_value(adata.uns[key])


@cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _version_of(module_name: str) -> str:
    # Distribution metadata first (some packages deprecate __version__), then __version__
    # for modules whose distribution is named otherwise (sklearn, cudf-cu13); the scan of
    # every installed distribution (slow where RAPIDS is installed) only as a last resort.
    try:
        return importlib.metadata.version(module_name)
    except importlib.metadata.PackageNotFoundError:
        pass
    version = getattr(sys.modules[module_name], "__version__", None)
    if isinstance(version, str):
        return version
    distribution = _distributions().get(module_name, [module_name])[0]
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def module_versions(*, backend: Backend) -> dict[str, str]:
    """Versions of the analysis libraries imported by this process; on the GPU backend, the GPU's name too.

    A worker of the GPU pool (:mod:`omicsprep.pool`) imports the GPU libraries before it knows its
    rule's backend: a CPU rule records them neither there nor in its own process.
    """
    recorded = [name for name in RECORDED_MODULES if backend == "gpu" or name not in GPU_MODULES]
    versions = {name: _version_of(name) for name in recorded if name in sys.modules}
    versions["python"] = sys.version.split()[0]
    if backend == "gpu" and "cupy" in sys.modules:
        cp = sys.modules["cupy"]
        try:
            props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
            versions["gpu"] = props["name"].decode()
        except Exception:  # noqa: BLE001 - only informative
            pass
    return versions


def synchronize(*, backend: Backend) -> None:
    """Wait for queued GPU work (so timings are honest); a no-op on the CPU."""
    if backend == "gpu":
        cupy().cuda.get_current_stream().synchronize()
