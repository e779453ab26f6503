"""Persistent compilation caches for the CPU path.

umap-learn compiles its Numba kernels (connectivities, layout optimisation) in every new
process because they are not declared ``cache=True``; a workflow rule is a new process, so
that cost would recur in every run. Turning caching on before
their first call stores the machine code in Numba's cache directory (``NUMBA_CACHE_DIR``
or ``__pycache__``), where later processes find it.
"""

from __future__ import annotations

import importlib
from functools import cache

UMAP_MODULES = ("umap.umap_", "umap.layouts", "umap.utils", "umap.spectral")


@cache
def cache_umap_kernels() -> int:
    """Enable on-disk caching of umap-learn's Numba kernels; returns how many."""
    from numba.core.dispatcher import Dispatcher

    enabled = 0
    for name in UMAP_MODULES:
        for kernel in vars(importlib.import_module(name)).values():
            # Numba offers no public test of whether a kernel caches (and its stubs omit _cache).
            if isinstance(kernel, Dispatcher) and type(kernel._cache).__name__ == "NullCache":  # type: ignore[attr-defined]  # noqa: SLF001
                kernel.enable_caching()
                enabled += 1
    return enabled
