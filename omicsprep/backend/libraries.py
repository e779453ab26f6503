"""Which backend runs, and the GPU libraries, imported lazily: the only module that imports them.

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
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from types import ModuleType
from typing import Literal

from omicsprep.errors import BackendUnavailableError
from omicsprep.timings import phase

Backend = Literal["cpu", "gpu"]

log = logging.getLogger(__name__)

GPU_MODULES = ("cupy", "cudf", "cuml", "pylibcugraph", "rapids_singlecell")
# CuPy's parts that omicsprep's steps import themselves: prepare_gpu's thread imports them
# first, so that a step never imports them while that thread imports a library that does
# too (two threads in one import deadlocked a GPU rule on the H200).
CUPY_PARTS = ("cupyx", "cupyx.scipy.sparse", "cupyx.scipy.sparse.linalg", "cupy._core._routines_linalg")


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
        # Which part of the start-up a rule waited for (benchmarks/e2e.py's timelines).
        log.info("GPU start-up beside the rule: %s", ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items()))

    thread = threading.Thread(target=prepare, name="omicsprep-prepare-gpu", daemon=True)
    _preparation.append(thread)
    thread.start()


def finish_preparation() -> None:
    """Wait for :func:`prepare_gpu`'s thread, if one was started, to end (before another thread imports)."""
    for thread in _preparation:
        thread.join()


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
                finish_preparation()
    try:
        with phase("gpu_import"):
            # Not sys.modules' entry: another thread may still be importing it (import_module waits).
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


def synchronize(*, backend: Backend) -> None:
    """Wait for queued GPU work (so timings are honest); a no-op on the CPU."""
    if backend == "gpu":
        cupy().cuda.get_current_stream().synchronize()
