"""Where an AnnData's matrices live, and the operations on row blocks.

They move to the GPU once per rule (in row blocks beyond CuPy's 32-bit indices) and back
before writing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from omicsprep.backend.copies import COMPRESSED_FORMATS, asnumpy, host_to_device
from omicsprep.backend.dask_arrays import in_row_blocks, is_dask_array
from omicsprep.backend.libraries import Backend, cupy, cupyx_sparse
from omicsprep.errors import BackendUnavailableError

if TYPE_CHECKING:
    from anndata import AnnData

log = logging.getLogger(__name__)


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
