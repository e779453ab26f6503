"""Copies between host and GPU memory: through pinned buffers in threads, and back to NumPy and SciPy."""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from typing import Any

from omicsprep.backend.libraries import cupy, cupyx_sparse, gpu_module


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
