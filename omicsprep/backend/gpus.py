"""Several GPUs of one node: a Dask worker per GPU (dask-cuda), and counts spread over them."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from omicsprep.backend.dask_arrays import _persisted
from omicsprep.backend.libraries import cupy, cupyx_sparse, gpu_unavailable_reason
from omicsprep.errors import BackendUnavailableError

if TYPE_CHECKING:
    from anndata import AnnData

log = logging.getLogger(__name__)

# Rows per Dask block: rapids-singlecell advises blocks of about 20,000 rows; larger ones
# cost fewer tasks, and 50,000 cells of 2,000 genes each stay far below CuPy's 2^31 entries.
SHARD_ROWS = 50_000


@contextmanager
def dask_gpu_cluster(n_gpus: int) -> Iterator[Any]:
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
        A client of :func:`dask_gpu_cluster`.
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
