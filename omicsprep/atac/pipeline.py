"""Rule atac as one chain: feature filter, TF-IDF, LSI, neighbours, UMAP and Leiden."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import numpy as np
from anndata import AnnData
from scipy import sparse

from omicsprep.atac import lsi
from omicsprep.backend import Backend, to_device, to_host
from omicsprep.errors import InputError
from omicsprep.options import (
    AtacOptions,
    EmbeddingOptions,
)
from omicsprep.provenance import StepTimer, record_provenance
from omicsprep.rna.embedding import embed_and_cluster

log = logging.getLogger(__name__)


def run_atac(
    adata: AnnData, *, options: AtacOptions, embedding_options: EmbeddingOptions, seed: int, backend: Backend
) -> None:
    """Chromatin accessibility: feature filter, TF-IDF, LSI, neighbours, UMAP and Leiden.

    Parameters
    ----------
    adata
        Cells x peaks or tiles with fragment counts and QC in ``obs``
        (:func:`omicsprep.atac.fragments.count_fragments`); transformed in place (counts kept
        in a layer).
    options
        ``min_cells_per_feature`` and ``lsi`` (its other fields are the counting's).
    embedding_options
        Neighbours, UMAP and Leiden of the LSI components.
    seed
        Seed for UMAP and Leiden.
    backend
        ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    InputError
        Fewer than two features seen in ``min_cells_per_feature`` cells.
    """
    timer = StepTimer(backend=backend)
    with timer.step("filter_features"):  # on the host, so that only the kept features move
        in_cells = _cells_per_feature(adata.X)
        kept = in_cells >= options.min_cells_per_feature
        if kept.sum() < 2:
            raise InputError(
                f"{int(kept.sum())} of {adata.n_vars} chromatin features are seen in "
                f"{options.min_cells_per_feature} cells or more: too few for LSI"
            )
        adata._inplace_subset_var(kept)  # noqa: SLF001 - anndata's in-place subset, no copy of X
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("lsi"):
        lsi.tfidf(adata, backend=backend)
        lsi.lsi(
            adata,
            n_comps=options.lsi.n_comps,
            max_depth_correlation=options.lsi.max_depth_correlation,
            backend=backend,
        )
    embed_and_cluster(adata, use_rep="X_lsi", options=embedding_options, seed=seed, backend=backend, timer=timer)
    with timer.step("to_host"):
        to_host(adata)
    params = {**asdict(options), "seed": seed}
    record_provenance(adata, rule="atac", backend=backend, params=params, timings=timer.seconds)


# Entries looked at a time by _cells_per_feature: 16M, their temporaries about 200 MB.
FEATURE_CHUNK_ENTRIES = 1 << 24


def _cells_per_feature(matrix: Any) -> np.ndarray:
    """Cells with a count above zero in each feature (column), a chunk of entries at a time.

    ``(X > 0).sum(axis=0)`` would copy the matrix's indices and widen its values: tens of GB
    at billions of fragment counts.
    """
    if not sparse.issparse(matrix):
        return np.asarray((matrix > 0).sum(axis=0)).ravel()
    compressed: Any = matrix if matrix.format in ("csr", "csc") else matrix.tocsr()
    cells = np.zeros(compressed.shape[1], dtype=np.int64)
    for start in range(0, compressed.nnz, FEATURE_CHUNK_ENTRIES):
        entries = np.arange(start, min(start + FEATURE_CHUNK_ENTRIES, compressed.nnz))
        if compressed.format == "csc":  # each entry's column from the index pointers
            features = np.searchsorted(compressed.indptr, entries, side="right") - 1
        else:
            features = compressed.indices[entries]
        cells += np.bincount(features[compressed.data[entries] > 0], minlength=compressed.shape[1])
    return cells
