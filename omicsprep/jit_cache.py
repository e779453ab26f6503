"""Persistent compilation caches for the CPU path and for scib-metrics.

umap-learn compiles its Numba kernels (connectivities, layout optimisation) in every new
process because they are not declared ``cache=True``; a workflow rule is a new process, so
that cost would recur in every run. Turning caching on before
their first call stores the machine code in Numba's cache directory (``NUMBA_CACHE_DIR``
or ``__pycache__``), where later processes find it. umap-learn and pynndescent also compile
kernels as they are imported (those declared with their types), which nothing can cache after
the import: they are imported with Numba's decorators asking for the cache. scib-metrics
compiles more, on either backend: its metrics through JAX (65 s of a 2,400-cell table on 2
cores, 37 s with these caches filled, when its kBET also compiled pynndescent's kernels, which
it no longer runs: :mod:`omicsprep.rna.integration_scores`). fast-array-utils' kernels over
sparse matrices (scanpy 1.12's) are cached, but were never found again in a new process
(:func:`name_sparse_matrix_types`).

Numba keys a cached function by its own source file only: a function whose machine code
holds another module's function (``umi.count_groups`` calls ``umi_kernels``' kernel) kept
running the old code after that module changed. :func:`track_sources` keys omicsprep's cached
functions by every module of the package instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).parent

UMAP_MODULES = ("umap.umap_", "umap.layouts", "umap.utils", "umap.spectral")


def _enable_caching(modules: tuple[str, ...]) -> int:
    """Enable on-disk caching of the Numba kernels defined in ``modules``; returns how many cache now."""
    from numba.core.dispatcher import Dispatcher

    caching = 0
    for name in modules:
        for kernel in vars(importlib.import_module(name)).values():
            if not isinstance(kernel, Dispatcher):
                continue
            # Numba offers no public test of whether a kernel caches (and its stubs omit _cache).
            if type(kernel._cache).__name__ == "NullCache":  # type: ignore[attr-defined]  # noqa: SLF001
                kernel.enable_caching()
            caching += 1
    return caching


@contextlib.contextmanager
def _decorations_cached() -> Iterator[None]:
    """While inside, ``numba.njit`` and ``numba.jit`` cache what they compile on disk, unless told not to.

    For modules imported inside that compile as they are imported: the decorator is all that
    can ask for the cache, and it is theirs to call.
    """
    import numba

    decorators = {name: getattr(numba, name) for name in ("njit", "jit")}

    def caching(decorator: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(decorator)
        def decorate(*args: Any, **kwargs: Any) -> Any:
            return decorator(*args, **{"cache": True, **kwargs})

        return decorate

    try:
        for name, decorator in decorators.items():
            setattr(numba, name, caching(decorator))
        yield
    finally:
        for name, decorator in decorators.items():
            setattr(numba, name, decorator)


@cache
def cache_umap_kernels() -> int:
    """Import umap-learn with its Numba kernels and pynndescent's cached on disk; returns how many of umap's.

    Importing them compiled 5.5 s of kernels in every process on a 2-core vm (2.2 s with
    them cached, 0.9 s of it scikit-learn's import). A process that imported either before
    compiled them already, uncached: the rest of umap's kernels are still set to cache.
    """
    with _decorations_cached():
        importlib.import_module("umap.umap_")  # and pynndescent, which it imports
    return _enable_caching(UMAP_MODULES)


@cache
def cache_sparse_matrix_kernels() -> bool:
    """Let later processes load scanpy's kernels over SciPy's sparse matrices from Numba's cache.

    Where scanpy uses fast-array-utils (1.12 and later: its normalization and HVGs): see
    :func:`name_sparse_matrix_types`. Elsewhere nothing is imported (fast-array-utils' import
    alone took 1.1-2.4 s on a 2-core vm). Returns whether the types were named.
    """
    try:
        requirements = importlib.metadata.requires("scanpy") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    return (
        any(requirement.startswith("fast-array-utils") for requirement in requirements) and name_sparse_matrix_types()
    )


def name_sparse_matrix_types() -> bool:
    """Set fast-array-utils' Numba types of SciPy's sparse matrices in its module, where pickle finds them.

    fast-array-utils types SciPy's sparse matrices for Numba with classes made at its import
    (``csr_matrixType`` and the others), whose module reads ``abc`` (their metaclass's), where
    pickle cannot find them. Numba's cache index then kept them by value, and in a new process
    the class loaded was another one, unequal to the one in use: no signature over a sparse
    matrix was found again, and every process compiled those kernels anew (7.1 s of a GPU pool
    worker's first co-expression job on an H100). Named, they are pickled by reference.
    Returns whether fast-array-utils is installed.
    """
    if importlib.util.find_spec("fast_array_utils") is None:
        return False
    numba_sparse = importlib.import_module("fast_array_utils._plugins.numba_sparse")
    for numba_type in getattr(numba_sparse, "TYPES", ()):
        numba_type.__module__ = numba_sparse.__name__
        setattr(numba_sparse, numba_type.__qualname__, numba_type)
    return True


@cache
def cache_scib_compilations() -> int:
    """Keep what scib-metrics compiles on disk: JAX's programs and umap-learn's kernels (its connectivities).

    JAX's cache goes to ``JAX_COMPILATION_CACHE_DIR`` where set, else ``omicsprep/jax`` in the
    user's cache folder (``XDG_CACHE_HOME`` or ``~/.cache``), and keeps every program (most of
    scib-metrics' take well under JAX's default second to compile). Returns how many Numba
    kernels were set to cache (umap-learn's through :func:`cache_umap_kernels`, once per process).
    """
    import jax

    if not getattr(jax.config, "jax_compilation_cache_dir", None):  # not in JAX's type stubs
        jax.config.update("jax_compilation_cache_dir", str(user_cache() / "jax"))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    return cache_umap_kernels()


def user_cache() -> Path:
    """The folder of omicsprep's caches: ``omicsprep`` in ``XDG_CACHE_HOME``, else in ``~/.cache``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omicsprep"


@cache
def sources_digest(root: Path) -> str:
    """A digest of the content of every Python module under ``root`` (once per process)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def track_sources(root: Path = PACKAGE) -> None:
    """Key Numba's on-disk cache of each function defined under ``root`` by every module there.

    A change to any of them then compiles those functions anew, rather than running machine
    code built from the old source of a module they call. Call it before the functions are
    defined (``cache=True`` picks its cache as it decorates). Functions elsewhere keep
    Numba's own keys.
    """
    from numba.core import caching

    # Numba's own names, public since 0.61 (underscored before); none found: Numba's keys stay.
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    found = [getattr(caching, name, None) or getattr(caching, f"_{name}", None) for name in LOCATORS]
    bases = [base for base in found if isinstance(base, type)]
    locators = getattr(impl, "_locator_classes", None)
    root = root.resolve()
    if not isinstance(locators, list) or len(bases) < len(LOCATORS):
        return
    if all(getattr(locator, "tracked_root", None) != root for locator in locators):
        locators[:0] = [_tracking(base, root) for base in bases]


# Numba's locators of a regular module's cache: NUMBA_CACHE_DIR, else __pycache__ beside it.
LOCATORS = ("UserProvidedCacheLocator", "InTreeCacheLocator")


def _tracking(base: type, root: Path) -> type:
    """``base``, a Numba cache locator, for functions under ``root``, their cache keyed by all of it too."""

    class TrackingLocator(base):
        tracked_root = root

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if not Path(py_file).resolve().is_relative_to(root):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self) -> Any:
            return (super().get_source_stamp(), sources_digest(root))

    return TrackingLocator
