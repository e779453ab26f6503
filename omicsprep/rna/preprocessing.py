"""Normalization, highly variable genes and PCA, on either backend."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import (
    Backend,
    asnumpy,
    column_entries,
    copy_blocks,
    gather,
    in_row_blocks,
    is_dask_array,
    joined_rows,
    keep_columns,
    materialize,
    max_gpu_sparse_entries,
    rapids_singlecell,
    single_cell_api,
    sparse_entries,
)
from omicsprep.options import HvgFlavor

log = logging.getLogger(__name__)


def holds_counts(adata: AnnData) -> bool:
    """Whether ``X`` looks like raw counts (non-negative integers), judged on a sample."""
    values = adata.X.data if sparse.issparse(adata.X) else np.asarray(adata.X).ravel()
    sample = values[:100_000]
    return bool(sample.size) and bool((sample >= 0).all() and (np.mod(sample, 1) == 0).all())


def normalize(adata: AnnData, *, target_sum: float | None, backend: Backend) -> None:
    """Keep raw counts in ``layers["counts"]``, then library-size normalize and log1p ``X``.

    Parameters
    ----------
    adata
        Raw counts in ``X`` (on the GPU backend, also a Dask array of CuPy blocks).
    target_sum
        Counts per cell after scaling; ``None`` uses the median library size.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    api = single_cell_api(backend)
    adata.layers["counts"] = adata.X
    adata.X = copy_blocks(adata.X)  # normalized in place
    api.pp.normalize_total(adata, target_sum=target_sum)
    api.pp.log1p(adata)
    adata.X = materialize(adata.X)


def highly_variable_genes(
    adata: AnnData, *, flavor: HvgFlavor, n_top_genes: int, backend: Backend, batch_key: str | None = None
) -> None:
    """Flag highly variable genes in ``var["highly_variable"]``.

    Parameters
    ----------
    adata
        Log-normalized ``X`` and raw ``layers["counts"]`` (from :func:`normalize`).
    flavor
        ``"seurat_v3"`` ranks genes on the raw counts; the others on log-normalized values.
        Where the flavour fails on the data (seurat_v3's loess fit or cell_ranger's bins of
        mean expression, on a handful of cells or genes), ``"seurat"`` ranks them instead,
        logged and recorded in ``uns["hvg"]["flavor"]``.
    n_top_genes
        How many genes to flag; capped at the number of genes.
    backend
        ``"cpu"`` or ``"gpu"``.
    batch_key
        ``obs`` column of batches: genes are ranked within each batch and the ranks
        combined (scanpy's batch-aware selection), so one batch's differences do not
        pass for biology.
    """
    n_top = min(n_top_genes, adata.n_vars)
    select = single_cell_api(backend).pp.highly_variable_genes
    layer = "counts" if flavor == "seurat_v3" else None
    try:
        select(adata, flavor=flavor, n_top_genes=n_top, layer=layer, batch_key=batch_key)
    except ValueError as exc:  # seurat_v3's loess or cell_ranger's quantile bins, on few cells or genes
        if flavor == "seurat":
            raise
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc).splitlines()[0]
        log.info(
            "hvg: %s failed on %d cells and %d genes (%s): seurat's dispersion ranks them", flavor, *adata.shape, reason
        )
        flavor = "seurat"
        select(adata, flavor=flavor, n_top_genes=n_top, batch_key=batch_key)
    if n_top == adata.n_vars:  # every gene flagged: rapids-singlecell flags those no cell expresses too
        adata.var["highly_variable"] &= _expressed(adata.layers["counts"])  # PCA refuses them on the GPU
    adata.uns["hvg"] = {"flavor": flavor}  # as scanpy records it: the flavour used
    log.info("highly variable genes: %d of %d", int(adata.var["highly_variable"].sum()), adata.n_vars)


def _expressed(counts: Any) -> np.ndarray:
    """Genes with a count in some cell, for a matrix on either device or row blocks of one.

    (Recorded means will not do: scanpy and rapids-singlecell give a gene without counts a mean
    of 1e-12, to divide by.)
    """
    if is_dask_array(counts):
        return column_entries(counts) > 0  # Dask's sum asks sparse blocks for keepdims, which they lack
    return np.asarray(asnumpy(counts.sum(axis=0))).ravel() > 0


def pca(adata: AnnData, *, n_comps: int, seed: int, backend: Backend) -> None:
    """PCA of the highly variable genes into ``obsm["X_pca"]``.

    Parameters
    ----------
    adata
        Log-normalized ``X`` with ``var["highly_variable"]``.
    n_comps
        Number of components; capped by the data's dimensions.
    seed
        Seed for randomized solvers.
    backend
        ``"cpu"`` (scanpy, ARPACK) or ``"gpu"`` (cuML).
    """
    n_hvg = int(adata.var["highly_variable"].sum())
    if n_comps > (most := min(adata.n_obs - 1, n_hvg - 1)):
        log.info("pca: %d components, not the %d asked: %d cells, %d variable genes", most, n_comps, adata.n_obs, n_hvg)
        n_comps = most
    if backend == "gpu" and in_row_blocks(adata.X):
        _pca_of_row_blocks(adata, n_comps=n_comps, seed=seed)
    elif backend == "gpu":
        rapids_singlecell().pp.pca(adata, n_comps=n_comps, mask_var="highly_variable", rng=seed)
        adata.obsm["X_pca"] = gather(adata.obsm["X_pca"])  # from Dask's workers, if X is sharded
    else:
        import scanpy as sc

        sc.pp.pca(adata, n_comps=n_comps, mask_var="highly_variable", svd_solver="arpack", random_state=seed)


def _pca_of_row_blocks(adata: AnnData, *, n_comps: int, seed: int) -> None:
    """rapids-singlecell's PCA of row blocks' highly variable genes, stored as for one matrix.

    The genes are taken from the blocks once, and joined into one matrix where they fit
    CuPy's 32-bit indices (a few hundred million entries at millions of cells): given the
    blocks, rapids-singlecell's Dask PCA would select them twice (for the covariance, then the
    projection) and multiply block by block.
    """
    variable = adata.var["highly_variable"].to_numpy()
    selected = keep_columns(adata.X, variable)
    if sparse_entries(selected) <= max_gpu_sparse_entries():
        selected = joined_rows(selected)
    embedding, components, variance_ratio, variance = rapids_singlecell().pp.pca(
        selected, n_comps=n_comps, rng=seed, return_info=True
    )
    adata.obsm["X_pca"] = gather(embedding)
    loadings = np.zeros((adata.n_vars, n_comps))
    loadings[variable] = asnumpy(components).T
    adata.varm["PCs"] = loadings
    adata.uns["pca"] = {
        "params": {"zero_center": True, "mask_var": "highly_variable"},
        "variance": asnumpy(variance),
        "variance_ratio": asnumpy(variance_ratio),
    }
