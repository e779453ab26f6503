"""The backend seam: the only module that imports GPU libraries.

CuPy, cuDF, cuML, cuGraph and rapids-singlecell are imported lazily, on first use, so that
every other module of omicsprep imports on machines without a GPU. The backend is always
explicit: ``"auto"`` resolves to ``"gpu"`` only when the RAPIDS stack imports *and* a CUDA
device is visible; an explicit ``"gpu"`` that cannot be honoured raises
:class:`~omicsprep.errors.BackendUnavailableError` instead of falling back to the CPU.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from functools import cache
from types import ModuleType
from typing import Any, Literal

from anndata import AnnData

from omicsprep.errors import BackendUnavailableError

Backend = Literal["cpu", "gpu"]

GPU_MODULES = ("cupy", "cudf", "cuml", "cugraph", "rapids_singlecell")
# Recorded in every output, when imported in the producing process.
RECORDED_MODULES = (
    "omicsprep", "anndata", "scanpy", "numpy", "scipy", "pandas", "sklearn", "umap",
    "igraph", "leidenalg", "numba", *GPU_MODULES,
)


@cache
def gpu_unavailable_reason() -> str | None:
    """Say why the GPU backend cannot run here, or return ``None`` when it can."""
    try:
        n_devices = cupy().cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable GPU"
        return f"CuPy/CUDA unusable ({type(exc).__name__}: {exc})"
    if n_devices == 0:
        return "no CUDA device is visible"
    for name in GPU_MODULES[1:]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            return f"cannot import {name} ({type(exc).__name__}: {exc})"
    return None


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
    return importlib.import_module("rapids_singlecell")


def rapids_scrublet_class() -> type:
    """rapids-singlecell's (private) ``Scrublet`` class, whose neighbour classifier
    :func:`omicsprep.qc.score_doublets` replaces while it runs."""
    return importlib.import_module("rapids_singlecell.preprocessing._scrublet.core").Scrublet


def cupy() -> ModuleType:
    """Return the imported ``cupy`` module."""
    return importlib.import_module("cupy")


def array_module(backend: Backend) -> ModuleType:
    """NumPy on the CPU, CuPy on the GPU: array code written once runs on either."""
    if backend == "gpu":
        return cupy()
    import numpy

    return numpy


def asnumpy(array: Any) -> Any:
    """``array`` in host memory: a CuPy array or sparse matrix is copied back (to NumPy or
    SciPy); anything else is returned as it is."""
    if "cupy" not in sys.modules:
        return array
    cp = sys.modules["cupy"]
    if isinstance(array, cp.ndarray):
        return cp.asnumpy(array)
    return array.get() if importlib.import_module("cupyx.scipy.sparse").issparse(array) else array


def cupyx_sparse() -> ModuleType:
    """Return the imported ``cupyx.scipy.sparse`` module."""
    return importlib.import_module("cupyx.scipy.sparse")


def cudf() -> ModuleType:
    """Return the imported ``cudf`` module."""
    return importlib.import_module("cudf")


def cugraph() -> ModuleType:
    """Return the imported ``cugraph`` module."""
    return importlib.import_module("cugraph")


def cuml() -> ModuleType:
    """Return the imported ``cuml`` module."""
    return importlib.import_module("cuml")


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
        rapids_singlecell().get.anndata_to_GPU(adata, convert_all=True)


def _to_host_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_host_value(v) for k, v in value.items()}
    return asnumpy(value)


def to_host(adata: AnnData) -> None:
    """Bring every array of ``adata`` back to host memory, in place, before writing."""
    adata.X = _to_host_value(adata.X)
    for mapping in (adata.layers, adata.obsm, adata.varm, adata.obsp, adata.varp):
        for key in list(mapping.keys()):
            mapping[key] = _to_host_value(mapping[key])
    for key in list(adata.uns.keys()):
        adata.uns[key] = _to_host_value(adata.uns[key])


@cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _version_of(module_name: str) -> str:
    # Distribution metadata first (some packages deprecate __version__), then __version__
    # for modules whose distribution is named otherwise (sklearn, cudf-cu13); the scan of
    # every installed distribution (2.6 s where RAPIDS is installed) only as a last resort.
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


def module_versions() -> dict[str, str]:
    """Versions of the analysis libraries imported by this process, and the GPU's name."""
    versions = {name: _version_of(name) for name in RECORDED_MODULES if name in sys.modules}
    versions["python"] = sys.version.split()[0]
    if "cupy" in sys.modules:
        cp = sys.modules["cupy"]
        try:
            props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
            versions["gpu"] = props["name"].decode()
        except Exception:  # noqa: BLE001, S110 - only informative
            pass
    return versions


def synchronize(*, backend: Backend) -> None:
    """Wait for queued GPU work (so timings are honest); a no-op on the CPU."""
    if backend == "gpu":
        cupy().cuda.get_current_stream().synchronize()
