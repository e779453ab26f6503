"""The backend seam: choosing the backend, the GPU libraries and the data on the GPU.

CuPy, cuDF, cuML, cuGraph and rapids-singlecell are imported lazily, on first use, and only
by :mod:`omicsprep.backend.libraries`, so that every other module of omicsprep imports on
machines without a GPU. The backend is always explicit: ``"auto"`` resolves to ``"gpu"``
only when CuPy finds a CUDA device *and* the other RAPIDS libraries are installed; an
explicit ``"gpu"`` that cannot be honoured raises
:class:`~omicsprep.errors.BackendUnavailableError` instead of falling back to the CPU.

Its modules, one concern each: :mod:`~omicsprep.backend.libraries` (which backend, the GPU
libraries), :mod:`~omicsprep.backend.copies` (host and GPU memory),
:mod:`~omicsprep.backend.dask_arrays`, :mod:`~omicsprep.backend.placement` (an AnnData to the
GPU and back; row blocks beyond 32-bit indices), :mod:`~omicsprep.backend.gpus` (Dask over
several GPUs) and :mod:`~omicsprep.backend.versions`. Their functions are imported from here.
"""

from __future__ import annotations

from omicsprep.backend.copies import (
    COMPRESSED_FORMATS,
    STAGED_MIN_BYTES,
    STAGING_CHUNK_BYTES,
    STAGING_THREADS,
    asnumpy,
    device_to_host,
    host_to_device,
)
from omicsprep.backend.dask_arrays import (
    copy_blocks,
    gather,
    in_row_blocks,
    is_dask_array,
    materialize,
)
from omicsprep.backend.gpus import (
    SHARD_ROWS,
    dask_gpu_cluster,
    shard_to_gpus,
)
from omicsprep.backend.libraries import (
    CUPY_PARTS,
    GPU_MODULES,
    Backend,
    array_module,
    cudf,
    cuml,
    cupy,
    cupy_compiler,
    cupyx_sparse,
    cupyx_sparse_linalg,
    finish_preparation,
    gpu_module,
    gpu_unavailable_reason,
    prepare_gpu,
    pylibcugraph,
    rapids_singlecell,
    release_device_memory,
    resolve_backend,
    single_cell_api,
    synchronize,
    tf32_products,
)
from omicsprep.backend.placement import (
    BLOCK_BYTES,
    BLOCK_ENTRIES,
    GPU_SPARSE_MAX_ENTRIES,
    blocks_of,
    column_entries,
    joined_rows,
    keep_columns,
    keep_rows,
    matrix_to_device,
    max_gpu_sparse_entries,
    row_block_bounds,
    row_blocks,
    sparse_entries,
    stacked_rows,
    take_columns,
    take_rows,
    to_device,
    to_host,
    with_columns_at,
)
from omicsprep.backend.versions import (
    RECORDED_MODULES,
    module_versions,
)

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_ENTRIES",
    "COMPRESSED_FORMATS",
    "CUPY_PARTS",
    "GPU_MODULES",
    "GPU_SPARSE_MAX_ENTRIES",
    "RECORDED_MODULES",
    "SHARD_ROWS",
    "STAGED_MIN_BYTES",
    "STAGING_CHUNK_BYTES",
    "STAGING_THREADS",
    "Backend",
    "array_module",
    "asnumpy",
    "blocks_of",
    "column_entries",
    "copy_blocks",
    "cudf",
    "cuml",
    "cupy",
    "cupy_compiler",
    "cupyx_sparse",
    "cupyx_sparse_linalg",
    "dask_gpu_cluster",
    "device_to_host",
    "finish_preparation",
    "gather",
    "gpu_module",
    "gpu_unavailable_reason",
    "host_to_device",
    "in_row_blocks",
    "is_dask_array",
    "joined_rows",
    "keep_columns",
    "keep_rows",
    "materialize",
    "matrix_to_device",
    "max_gpu_sparse_entries",
    "module_versions",
    "prepare_gpu",
    "pylibcugraph",
    "rapids_singlecell",
    "release_device_memory",
    "resolve_backend",
    "row_block_bounds",
    "row_blocks",
    "shard_to_gpus",
    "single_cell_api",
    "sparse_entries",
    "stacked_rows",
    "synchronize",
    "take_columns",
    "take_rows",
    "tf32_products",
    "to_device",
    "to_host",
    "with_columns_at",
]
