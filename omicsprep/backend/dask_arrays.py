"""Dask arrays as the steps meet them: this process's row blocks, or shards on several GPUs' workers."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from typing import Any


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
