"""TF-IDF and latent semantic indexing (LSI) of chromatin counts, on either backend.

On the GPU both work in device memory and leave their results there, so that a rule moves
its data to the device once and back once (:func:`omicsprep.backend.to_device`,
:func:`omicsprep.backend.to_host`).
"""

from __future__ import annotations

import numpy as np
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend, array_module, asnumpy, cupyx_sparse, cupyx_sparse_linalg


def tfidf(adata: AnnData, *, scale_factor: float = 1e4, backend: Backend) -> None:
    """TF-IDF of counts in ``X``, as muon's defaults (and Signac's method 1 with logs).

    ``log1p(x / cell total * scale_factor) * log1p(n_cells / feature total)``.

    Raw counts are kept in ``layers["counts"]``; features without counts get zeros. On the
    GPU, ``X`` may be in host or device memory; the TF-IDF is left in device memory.
    """
    xp = array_module(backend)
    sp = cupyx_sparse() if backend == "gpu" else sparse
    matrix = sp.csr_matrix(adata.X, dtype=np.float64)
    cell_totals = xp.asarray(matrix.sum(axis=1)).ravel()
    feature_totals = xp.asarray(matrix.sum(axis=0)).ravel()
    idf = xp.log1p(adata.n_obs / xp.where(feature_totals > 0, feature_totals, xp.inf))
    term = (sp.diags(1 / xp.maximum(cell_totals, 1)) @ matrix).tocsr()
    term.data = xp.log1p(term.data * scale_factor)
    adata.layers["counts"] = adata.X
    adata.X = (term @ sp.diags(idf)).tocsr()


def lsi(adata: AnnData, *, n_comps: int = 50, max_depth_correlation: float = 0.9, backend: Backend) -> None:
    """Latent semantic indexing: truncated SVD of the TF-IDF in ``X``.

    Components are ordered by singular value and scaled to zero mean and unit variance (as
    muon does); those whose correlation with log fragment depth exceeds
    ``max_depth_correlation`` in absolute value (usually the first) are dropped from
    ``obsm["X_lsi"]``. ``uns["lsi"]`` records each component's depth correlation and
    which were kept. On the GPU, ``obsm["X_lsi"]`` is left in device memory.
    """
    xp = array_module(backend)
    matrix = cupyx_sparse().csr_matrix(adata.X) if backend == "gpu" else sparse.csr_matrix(adata.X)
    n_comps = min(n_comps, min(adata.shape) - 1)
    if backend == "gpu":
        embedding, singular, _ = cupyx_sparse_linalg().svds(matrix, k=n_comps)
    else:
        from scipy.sparse.linalg import svds

        embedding, singular, _ = svds(matrix, k=n_comps, random_state=0)
    order = xp.argsort(-singular)
    embedding = embedding[:, order]
    embedding = (embedding - embedding.mean(axis=0)) / embedding.std(axis=0)
    counts = adata.layers.get("counts", adata.X)
    depth = np.log1p(np.asarray(asnumpy(counts.sum(axis=1))).ravel())  # a number per cell, to the host
    host = asnumpy(embedding)
    correlation = np.array([np.corrcoef(host[:, k], depth)[0, 1] for k in range(host.shape[1])])
    kept = np.abs(correlation) <= max_depth_correlation
    adata.obsm["X_lsi"] = embedding[:, xp.asarray(kept)]
    adata.uns["lsi"] = {"depth_correlation": correlation, "kept": kept}
