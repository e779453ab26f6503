"""TF-IDF and latent semantic indexing (LSI) of chromatin counts, on either backend.

On the GPU both work in device memory and leave their results there, so that a rule moves
its data to the device once and back once (:func:`omicsprep.backend.to_device`,
:func:`omicsprep.backend.to_host`).
"""

from __future__ import annotations

from itertools import pairwise
from types import ModuleType
from typing import Any

import numpy as np
from anndata import AnnData
from scipy import sparse
from scipy.sparse import linalg as host_linalg

from omicsprep.backend import (
    Backend,
    array_module,
    asnumpy,
    blocks_of,
    cupyx_sparse,
    cupyx_sparse_linalg,
    is_dask_array,
    row_blocks,
)


def tfidf(adata: AnnData, *, scale_factor: float = 1e4, backend: Backend) -> None:
    """TF-IDF of counts in ``X``, as muon's defaults (and Signac's method 1 with logs).

    ``log1p(x / cell total * scale_factor) * log1p(n_cells / feature total)``.

    Raw counts are kept in ``layers["counts"]``; features without counts get zeros. On the
    GPU, ``X`` may be in host or device memory, or in row blocks beyond 32-bit indices
    (:func:`omicsprep.backend.to_device`), which it keeps; the TF-IDF is left in device memory.
    """
    xp = array_module(backend)
    sp = cupyx_sparse() if backend == "gpu" else sparse
    parts = [sp.csr_matrix(part, dtype=np.float64) for part in _row_parts(adata.X)]
    feature_totals = sum(xp.asarray(part.sum(axis=0)).ravel() for part in parts)
    idf = sp.diags(xp.log1p(adata.n_obs / xp.where(feature_totals > 0, feature_totals, xp.inf)))
    weighted = []
    while parts:  # each float64 copy freed once weighted
        matrix = parts.pop(0)
        cell_totals = xp.asarray(matrix.sum(axis=1)).ravel()
        term = (sp.diags(1 / xp.maximum(cell_totals, 1)) @ matrix).tocsr()
        term.data = xp.log1p(term.data * scale_factor)
        weighted.append((term @ idf).tocsr())
    adata.layers["counts"] = adata.X
    adata.X = row_blocks(weighted) if is_dask_array(adata.X) else weighted[0]


def lsi(adata: AnnData, *, n_comps: int = 50, max_depth_correlation: float = 0.9, backend: Backend) -> None:
    """Latent semantic indexing: truncated SVD of the TF-IDF in ``X``.

    Components are ordered by singular value and scaled to zero mean and unit variance (as
    muon does); those whose correlation with log fragment depth exceeds
    ``max_depth_correlation`` in absolute value (usually the first) are dropped from
    ``obsm["X_lsi"]``. ``uns["lsi"]`` records each component's depth correlation and
    which were kept. On the GPU, ``obsm["X_lsi"]`` is left in device memory; ``X`` in row
    blocks is multiplied block by block.
    """
    xp = array_module(backend)
    n_comps = min(n_comps, min(adata.shape) - 1)
    if is_dask_array(adata.X):
        linalg = cupyx_sparse_linalg() if backend == "gpu" else host_linalg
        matrix = _row_blocks_operator(_row_parts(adata.X), xp=xp, linalg=linalg)
    else:
        matrix = cupyx_sparse().csr_matrix(adata.X) if backend == "gpu" else sparse.csr_matrix(adata.X)
    if backend == "gpu":
        embedding, singular, _ = cupyx_sparse_linalg().svds(matrix, k=n_comps)
    else:
        embedding, singular, _ = host_linalg.svds(matrix, k=n_comps, random_state=0)
    order = xp.argsort(-singular)
    embedding = embedding[:, order]
    embedding = (embedding - embedding.mean(axis=0)) / embedding.std(axis=0)
    counts = adata.layers.get("counts", adata.X)
    cell_totals = [asnumpy(part.sum(axis=1)) for part in _row_parts(counts)]
    depth = np.log1p(np.concatenate([np.asarray(total).ravel() for total in cell_totals]))  # to the host
    host = asnumpy(embedding)
    correlation = np.array([np.corrcoef(host[:, k], depth)[0, 1] for k in range(host.shape[1])])
    kept = np.abs(correlation) <= max_depth_correlation
    adata.obsm["X_lsi"] = embedding[:, xp.asarray(kept)]
    adata.uns["lsi"] = {"depth_correlation": correlation, "kept": kept}


def _row_parts(matrix: Any) -> list[Any]:
    """A matrix's row blocks (computed, in order), or the matrix itself as one part."""
    return list(blocks_of(matrix)) if is_dask_array(matrix) else [matrix]


def _row_blocks_operator(blocks: list[Any], *, xp: ModuleType, linalg: ModuleType) -> Any:
    """Row blocks as one linear operator (SciPy's or CuPy's): products are taken block by block."""
    bounds = np.cumsum([0, *(block.shape[0] for block in blocks)])

    def product(vectors: Any) -> Any:
        return xp.concatenate([block @ vectors for block in blocks])

    def transposed_product(vectors: Any) -> Any:
        return sum(block.T @ vectors[start:stop] for block, (start, stop) in zip(blocks, pairwise(bounds), strict=True))

    return linalg.LinearOperator(
        (int(bounds[-1]), blocks[0].shape[1]),
        matvec=product,
        rmatvec=transposed_product,
        matmat=product,
        rmatmat=transposed_product,
        dtype=blocks[0].dtype,
    )
