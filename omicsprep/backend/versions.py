"""The versions of the libraries that produced an output, for its record."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Mapping
from functools import cache

from omicsprep.backend.libraries import GPU_MODULES, Backend

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
