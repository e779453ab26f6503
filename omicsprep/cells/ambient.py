"""Ambient RNA removal from called cells: SoupX, DecontX, or CellBender's corrected counts.

Whichever method runs, the cells come back the same way: corrected counts in ``X``, the
uncorrected in ``layers["counts_uncorrected"]``, each cell's removed share in
``obs["ambient_fraction"]``, and a summary (method, contamination) in ``uns["ambient"]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend, max_gpu_sparse_entries, to_device, to_host
from omicsprep.cells import decontx, soupx
from omicsprep.errors import InputError
from omicsprep.options import AmbientOptions, cluster_key
from omicsprep.rna import clustering, preprocessing

UNCORRECTED_LAYER = "counts_uncorrected"
# The quick clustering SoupX and DecontX pool cells by.
QUICK_HVG = 2000
QUICK_PCS = 30
QUICK_NEIGHBORS = 15


def quick_clusters(cells: AnnData, *, resolution: float, seed: int, backend: Backend) -> np.ndarray:
    """Leiden clusters of the cells (integer labels), from a copy of their counts.

    Library-size normalization and log1p, 2,000 highly variable genes (Seurat's) among the
    genes with counts, 30 PCs, 15 neighbours: the pooling SoupX and DecontX need, not the
    workflow's clustering.
    """
    # Genes no cell counts carry nothing, and cuML's PCA refuses them.
    expressed = np.asarray((cells.X != 0).sum(axis=0)).ravel() > 0
    work = AnnData(X=cells.X[:, expressed].copy(), obs=cells.obs[[]].copy(), var=cells.var[[]][expressed].copy())
    to_device(work, backend=backend)
    preprocessing.normalize(work, target_sum=None, backend=backend)
    preprocessing.highly_variable_genes(work, flavor="seurat", n_top_genes=QUICK_HVG, backend=backend)
    preprocessing.pca(work, n_comps=QUICK_PCS, seed=seed, backend=backend)
    clustering.neighbors(work, n_neighbors=QUICK_NEIGHBORS, n_pcs=QUICK_PCS, metric="euclidean", backend=backend)
    clustering.cluster_graph(work, algorithm="leiden", resolutions=(resolution,), seed=seed, backend=backend)
    to_host(work)
    return work.obs[cluster_key("leiden", resolution)].cat.codes.to_numpy()


def remove_ambient(
    cells: AnnData,
    *,
    raw: AnnData,
    options: AmbientOptions,
    cellbender_output: AnnData | None = None,
    seed: int,
    backend: Backend,
) -> None:
    """Replace the cells' counts by ambient-corrected ones, in place.

    Parameters
    ----------
    cells
        Called cells x genes, raw counts in ``X`` (host memory).
    raw
        Every barcode of the sample (the soup of SoupX comes from its empty droplets).
    options
        The method and its settings (section ``cells.ambient``); ``none`` changes nothing.
    cellbender_output
        CellBender's output (corrected counts per barcode), for ``method: cellbender``.
    seed
        Seed of the quick clustering.
    backend
        ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    InputError
        CellBender's output lacks called cells, or its genes differ.
    """
    if options.method == "none":
        return
    # SoupX's and DecontX's GPU code holds every count in one CuPy matrix, and several arrays per
    # count beside it: checked before the quick clustering.
    if backend == "gpu" and options.method in ("soupx", "decontx") and cells.X.nnz > max_gpu_sparse_entries():
        raise InputError(
            f"{options.method} on the GPU takes at most {max_gpu_sparse_entries():,} non-zero counts, and the "
            f"{cells.n_obs:,} cells hold {cells.X.nnz:,}: run rule call_cells on the CPU "
            "(backend_per_rule: {call_cells: cpu})"
        )
    counts = sparse.csr_matrix(cells.X)
    summary: dict[str, object] = {"method": options.method}
    if options.method == "cellbender":
        corrected = _cellbender_counts(cells, cellbender_output)
    else:
        clusters = quick_clusters(cells, resolution=options.cluster_resolution, seed=seed, backend=backend)
        summary["n_clusters"] = int(clusters.max()) + 1
        if options.method == "soupx":
            corrected, rho = _soupx(counts, raw=raw, clusters=clusters, options=options, backend=backend)
            summary["contamination"] = rho
        else:
            settings = options.decontx
            result = decontx.decontx(
                counts,
                clusters=clusters,
                max_iter=settings.max_iter,
                delta=settings.delta,
                estimate_delta=settings.estimate_delta,
                convergence=settings.convergence,
                seed=settings.seed,
                backend=backend,
            )
            corrected = result.corrected
            summary["iterations"] = result.iterations
    before = np.asarray(counts.sum(axis=1)).ravel()
    after = np.asarray(corrected.sum(axis=1)).ravel()
    cells.layers[UNCORRECTED_LAYER] = counts
    cells.X = sparse.csr_matrix(corrected, dtype=np.float32)
    cells.obs["ambient_fraction"] = np.where(before > 0, 1 - after / np.maximum(before, 1), 0.0)
    summary["median_ambient_fraction"] = float(np.median(cells.obs["ambient_fraction"]))
    cells.uns["ambient"] = summary


def _soupx(
    counts: sparse.csr_matrix, *, raw: AnnData, clusters: np.ndarray, options: AmbientOptions, backend: Backend
) -> tuple[sparse.csr_matrix, float]:
    settings = options.soupx
    try:
        soup = soupx.soup_profile(sparse.csr_matrix(raw.X), soup_range=settings.soup_range)
        rho = settings.contamination
        if rho is None:
            rho = soupx.estimate_contamination(
                counts,
                soup,
                clusters=clusters,
                tfidf_min=settings.tfidf_min,
                soup_quantile=settings.soup_quantile,
                max_markers=settings.max_markers,
                contamination_range=settings.contamination_range,
                rho_max_fdr=settings.rho_max_fdr,
                prior_rho=settings.prior_rho,
                prior_rho_std_dev=settings.prior_rho_std_dev,
            ).rho
    except ValueError as exc:  # SoupX's own refusals: no soup, no markers
        raise InputError(f"SoupX: {exc} (cells.ambient.soupx; or set its contamination)") from exc
    return soupx.remove_soup(counts, soup, rho=rho, clusters=clusters, backend=backend), float(rho)


def _cellbender_counts(cells: AnnData, corrected: AnnData | None) -> sparse.csr_matrix:
    if corrected is None:
        raise InputError("ambient method cellbender, but no CellBender output was given")
    try:
        return aligned_counts(corrected, barcodes=cells.obs_names, genes=cells.var_names)
    except KeyError as exc:
        raise InputError(
            f"CellBender's output lacks called cells or genes of the raw matrix ({exc.args[0]}): "
            "raise cells.ambient.cellbender.total_droplets"
        ) from exc


def aligned_counts(
    corrected: AnnData, *, barcodes: Sequence[str] | pd.Index, genes: Sequence[str] | pd.Index
) -> sparse.csr_matrix:
    """CellBender's corrected counts for the given barcodes and genes, in their order.

    Parameters
    ----------
    corrected
        What :func:`omicsprep.io.cellbender.read_cellbender` returns: corrected counts of
        every barcode of the raw matrix (zero for barcodes CellBender did not analyse).
    barcodes
        The barcodes wanted (e.g. the called cells), each present in ``corrected``.
    genes
        The genes wanted, by ``corrected.var_names`` (gene names made unique as
        :func:`omicsprep.io.read_counts` makes them).

    Returns
    -------
    ``len(barcodes)`` x ``len(genes)`` counts, float32.

    Raises
    ------
    KeyError
        A barcode or gene is missing from ``corrected`` (it was run on another matrix).
    """
    rows = _positions(corrected.obs_names, barcodes, what="barcode")
    cols = _positions(corrected.var_names, genes, what="gene")
    matrix = sparse.csr_matrix(corrected.X)
    return sparse.csr_matrix(matrix[rows][:, cols], dtype="float32")


def _positions(index: pd.Index, names: Sequence[str] | pd.Index, *, what: str) -> np.ndarray:
    positions = index.get_indexer(pd.Index(names))
    missing = positions < 0
    if missing.any():
        shown = ", ".join(map(repr, pd.Index(names)[missing][:3]))
        raise KeyError(f"{missing.sum()} {what}(s) not in CellBender's output ({shown}): was it run on this matrix?")
    return positions
