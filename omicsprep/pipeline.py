"""The workflow's fused steps: each runs a whole rule's chain on one backend.

A rule is a process, and on the GPU every process pays for importing RAPIDS and compiling
kernels; chaining the steps of a stage in one call moves the data to the device once and
pays those costs once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.atac import lsi
from omicsprep.backend import Backend, gpu_workers, is_dask_array, keep_rows, shard_to_gpus, to_device, to_host
from omicsprep.cells import ambient, calling
from omicsprep.errors import InputError
from omicsprep.multiome import wnn
from omicsprep.network import coexpression
from omicsprep.options import (
    AtacOptions,
    CellOptions,
    ClusteringOptions,
    CoexpressionOptions,
    DoubletOptions,
    EmbeddingOptions,
    LeidenOptions,
    MergeOptions,
    MultiomeOptions,
    NeighborsOptions,
    ProteinOptions,
    QcOptions,
    UmapOptions,
    cluster_key,
    parse_cluster_key,
)
from omicsprep.protein import normalization
from omicsprep.provenance import StepTimer, record_provenance
from omicsprep.rna import clustering, integration, preprocessing, qc

if TYPE_CHECKING:
    from mudata import MuData

log = logging.getLogger(__name__)

CELL_METRICS = (
    "total_counts",
    "n_genes_by_counts",
    "pct_counts_mt",
    "pct_counts_ribo",
    "pct_counts_hb",
)


def run_qc(
    adata: AnnData,
    *,
    options: QcOptions,
    doublet_options: DoubletOptions,
    seed: int,
    backend: Backend,
    keep_on_device: bool = False,
) -> tuple[AnnData, pd.DataFrame]:
    """QC metrics, cell filtering, gene filtering and doublet scoring.

    Parameters
    ----------
    adata
        Raw counts, cells x genes, in host memory.
    options
        Gene groups, the cell filter (:func:`omicsprep.rna.qc.qc_pass_mask`), the gene
        filter and the fewest cells left.
    doublet_options
        Whether doublets are scored (Scrublet) and removed.
    seed
        Seed for doublet simulation.
    backend
        ``"cpu"`` or ``"gpu"``.
    keep_on_device
        Leave the cells that passed on the GPU, for the next step of the same process
        (:func:`run_clustering`), rather than bring them back.

    Returns
    -------
    The cells that passed (in host memory, unless ``keep_on_device``) and a table of every
    input cell's metrics with ``passed`` and ``fail_reason`` columns.
    """
    timer = StepTimer(backend=backend)
    n_input = adata.n_obs
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("qc_metrics"):
        qc.annotate_gene_groups(adata, patterns=dict(options.gene_groups))
        qc.calculate_qc_metrics(adata, qc_vars=list(options.gene_groups), backend=backend)
    with timer.step("filter"):
        limits = options.filter
        reasons = qc.qc_pass_mask(
            adata,
            method=limits.method,
            min_genes=limits.min_genes,
            max_genes=limits.max_genes,
            min_counts=limits.min_counts,
            max_counts=limits.max_counts,
            max_pct_mt=limits.max_pct_mt,
            n_mads=limits.n_mads,
            n_mads_mt=limits.n_mads_mt,
        )
        metrics = adata.obs[[c for c in CELL_METRICS if c in adata.obs]].copy()
        metrics["fail_reason"] = reasons
        adata = _kept_cells(adata, (reasons == "").to_numpy())
        settings = qc.filter_settings(limits)
        qc.require_cells(
            adata, minimum=options.min_cells_left, after="cell filtering", metrics=metrics, settings=settings
        )
        qc.filter_genes(adata, min_cells=options.min_cells_per_gene, backend=backend)
    if doublet_options.enabled:
        with timer.step("doublets"):
            qc.score_doublets(
                adata,
                expected_rate=doublet_options.expected_rate,
                max_cells_per_run=doublet_options.max_cells_per_run,
                seed=seed,
                backend=backend,
            )
            metrics["doublet_score"] = adata.obs["doublet_score"].reindex(metrics.index)
            doublets = adata.obs["predicted_doublet"].to_numpy()
            if doublet_options.remove:
                metrics.loc[adata.obs_names[doublets], "fail_reason"] = "doublet"
                adata = _kept_cells(adata, ~doublets)
                settings["doublet"] = f"(Scrublet, expected rate {doublet_options.expected_rate})"
                qc.require_cells(
                    adata, minimum=options.min_cells_left, after="doublet removal", metrics=metrics, settings=settings
                )
    metrics["passed"] = metrics["fail_reason"] == ""
    if not keep_on_device:
        with timer.step("to_host"):
            to_host(adata)
    log.info("qc: kept %d of %d cells, %d genes", adata.n_obs, n_input, adata.n_vars)
    params = {"qc": asdict(options), "doublets": asdict(doublet_options), "seed": seed}
    record_provenance(adata, rule="qc", backend=backend, params=params, timings=timer.seconds)
    return adata, metrics


def _kept_cells(adata: AnnData, keep: np.ndarray) -> AnnData:
    """A new AnnData of the cells where ``keep`` is true; ``X`` in row blocks stays in blocks (:func:`keep_rows`)."""
    if not is_dask_array(adata.X):
        return adata[keep].copy()
    matrix, adata.X = adata.X, None  # anndata would index each block itself
    kept = adata[keep].copy()
    kept.X = keep_rows(matrix, keep)
    adata.X = matrix
    return kept


def run_call_cells(
    raw: AnnData,
    *,
    filtered: AnnData | None,
    cellbender: AnnData | None,
    options: CellOptions,
    backend: Backend,
) -> tuple[AnnData, calling.CellCalls]:
    """Call the cells among a sample's raw droplets and remove ambient RNA from them.

    Parameters
    ----------
    raw
        Every barcode x genes, raw counts.
    filtered
        The sample's already called cells (a filtered matrix), or ``None``: then
        ``options.method`` calls them.
    cellbender
        CellBender's corrected counts, for ``options.ambient.method`` ``cellbender``.
    options
        Section ``cells``: the calling method and the ambient removal.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The cells (ambient-corrected counts in ``X`` when a method removes them, the raw ones in
    ``layers["counts_uncorrected"]``) and the calls of every barcode, whose table gets each
    cell's ``ambient_fraction``.

    Raises
    ------
    InputError
        ``filtered`` with other genes than ``raw``, or what :func:`omicsprep.cells.calling.call_cells`
        raises.
    """
    timer = StepTimer(backend=backend)
    if filtered is not None and not filtered.var_names.equals(raw.var_names):
        differ = filtered.var_names.symmetric_difference(raw.var_names)
        raise InputError(
            f"the raw matrix's genes differ from the input's ({raw.n_vars} vs {filtered.n_vars} genes; "
            f"{len(differ)} in one only, e.g. {differ[0]!r})"
            if len(differ)
            else "the raw matrix's genes are in another order than the input's"
        )
    with timer.step("call_cells"):
        calls = calling.call_cells(
            raw, options=options, given=None if filtered is None else filtered.obs_names, backend=backend
        )
    cells = raw[calls.table["is_cell"].to_numpy()].copy()
    with timer.step("ambient"):
        ambient.remove_ambient(
            cells,
            raw=raw,
            options=options.ambient,
            cellbender_output=cellbender,
            seed=options.seed,
            backend=backend,
        )
    calls.table["ambient_fraction"] = np.nan
    if "ambient_fraction" in cells.obs:
        calls.table.loc[cells.obs_names, "ambient_fraction"] = cells.obs["ambient_fraction"].to_numpy()
    cells.uns["cells"] = {
        "method": str(calls.table["method"].iloc[0]),
        "n_cells": int(cells.n_obs),
        "n_barcodes": int(raw.n_obs),
        "knee": float(calls.ranks.knee),
        "inflection": float(calls.ranks.inflection),
    }
    record_provenance(cells, rule="call_cells", backend=backend, params=asdict(options), timings=timer.seconds)
    return cells, calls


def run_clustering(
    adata: AnnData,
    *,
    options: ClusteringOptions,
    seed: int,
    backend: Backend,
    after_step: Callable[[str, AnnData], None] | None = None,
) -> pd.DataFrame:
    """Normalization, HVG, PCA, neighbours, UMAP, Leiden, Louvain and markers, in place.

    Parameters
    ----------
    adata
        QC'd raw counts, in host memory or on the GPU; comes back in host memory.
    options
        Each step's options.
    seed
        Seed for PCA, UMAP and clustering.
    backend
        ``"cpu"`` or ``"gpu"``.
    after_step
        Called with each step's name and ``adata`` as the step ends, so that a rule can
        write or draw what is final meanwhile: after ``normalize``, ``X`` (log-normalized)
        and ``layers["counts"]``; after ``umap``, ``obsm["X_umap"]``.

    Returns
    -------
    The marker genes table.
    """
    timer = StepTimer(backend=backend)

    @contextmanager
    def step(name: str) -> Iterator[None]:
        with timer.step(name):
            yield
        if after_step is not None:
            after_step(name, adata)

    with step("to_device"):
        to_device(adata, backend=backend)
    with step("normalize"):
        preprocessing.normalize(adata, target_sum=options.normalize.target_sum, backend=backend)
    with step("hvg"):
        preprocessing.highly_variable_genes(
            adata, flavor=options.hvg.flavor, n_top_genes=options.hvg.n_top_genes, backend=backend
        )
    with step("pca"):
        preprocessing.pca(adata, n_comps=options.pca.n_comps, seed=seed, backend=backend)
    with step("neighbors"):
        _neighbors(adata, options=options.neighbors, use_rep="X_pca", backend=backend)
    with step("umap"):
        clustering.umap(adata, min_dist=options.umap.min_dist, seed=seed, backend=backend)
    clusterings: dict[clustering.Algorithm, tuple[float, ...]] = {
        "leiden": options.leiden.resolutions,
        "louvain": options.louvain.resolutions,
    }
    for algorithm, resolutions in clusterings.items():
        with step(algorithm):
            clustering.cluster_graph(adata, algorithm=algorithm, resolutions=resolutions, seed=seed, backend=backend)
    markers = options.markers
    with step("markers"):
        groupby = cluster_key(markers.algorithm, markers.resolution)
        clustering.rank_markers(adata, groupby=groupby, method=markers.method, backend=backend)
    with timer.step("to_host"):
        to_host(adata)
    params = {**asdict(options), "seed": seed}
    adapted = _values_used(params, adata)
    record_provenance(adata, rule="cluster", backend=backend, params=params, timings=timer.seconds, adapted=adapted)
    return clustering.markers_table(adata, n_genes=markers.n_genes)


def _values_used(params: dict[str, Any], adata: AnnData) -> dict[str, dict[str, Any]]:
    """Put the values the steps used (they adapt to small samples) into ``params``.

    Returns those that differ from the ones asked, as ``{"section.key": {"asked", "used"}}``.
    """
    used = {
        ("hvg", "flavor"): adata.uns["hvg"]["flavor"],
        ("pca", "n_comps"): adata.obsm["X_pca"].shape[1],
        ("neighbors", "n_neighbors"): adata.uns["neighbors"]["params"]["n_neighbors"],
        ("neighbors", "n_pcs"): adata.uns["neighbors"]["params"]["n_pcs"],
    }
    adapted = {}
    for (section, key), value in used.items():
        if (asked := params[section][key]) != value:
            adapted[f"{section}.{key}"] = {"asked": asked, "used": value}
            params[section][key] = value
    return adapted


def _neighbors(adata: AnnData, *, options: NeighborsOptions, use_rep: str, backend: Backend) -> None:
    clustering.neighbors(
        adata,
        n_neighbors=options.n_neighbors,
        n_pcs=options.n_pcs,
        metric=options.metric,
        use_rep=use_rep,
        backend=backend,
    )


def run_coexpression(
    adata: AnnData, *, options: CoexpressionOptions, seed: int, backend: Backend
) -> dict[str, pd.DataFrame]:
    """Gene co-expression network, modules, hub genes and per-cell module eigengenes.

    Parameters
    ----------
    adata
        Cells with log-normalized ``X`` (the ``cluster`` rule's output); gains
        ``obsm["module_eigengenes"]`` and ``uns["coexpression"]``.
    options
        The network's genes, correlation and modules (``enabled`` and ``per_cluster`` are
        not used here).
    seed
        Seed of k-means metacells and of the community search.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    ``edges`` (``gene_a``, ``gene_b``, ``weight``), ``modules`` (``gene``, ``module``,
    ``hub_score``) and ``eigengenes`` (cells x modules).

    Raises
    ------
    InputError
        Too few cells, NaN values, or too few usable genes for ``top_k``.
    """
    timer = StepTimer(backend=backend)
    network = _gene_network(adata, options=options, seed=seed, backend=backend, timer=timer)
    with timer.step("eigengenes"):
        coexpression.module_eigengenes(adata, modules=network.modules, backend=backend)
    graph, genes = network.graph, network.genes
    upper = graph.tocoo()
    upper_edges = upper.row < upper.col
    edges = pd.DataFrame(
        {
            "gene_a": genes[upper.row[upper_edges]],
            "gene_b": genes[upper.col[upper_edges]],
            "weight": upper.data[upper_edges],
        }
    )
    adata.uns["coexpression"] = {
        "genes": len(genes),
        "genes_skipped": network.genes_skipped,
        "samples": network.samples,
        "edges": len(edges),
        "modules": adata.obsm["module_eigengenes"].shape[1],
    }
    log.info("coexpression: %s", adata.uns["coexpression"])
    record_provenance(
        adata, rule="coexpression", backend=backend, params={**asdict(options), "seed": seed}, timings=timer.seconds
    )
    return {"edges": edges, "modules": network.modules, "eigengenes": adata.obsm["module_eigengenes"]}


def skipped_coexpression(
    adata: AnnData, *, reason: str, options: CoexpressionOptions, seed: int, backend: Backend
) -> dict[str, pd.DataFrame]:
    """Empty co-expression results for a sample whose network cannot be built.

    The reason goes to ``uns["coexpression"]["skipped"]`` and the rule's provenance, with
    ``options`` and ``seed``.

    Returns
    -------
    :func:`run_coexpression`'s tables, without rows (eigengenes: one row per cell, no
    columns).
    """
    log.warning("coexpression skipped: %s", reason)
    adata.obsm["module_eigengenes"] = pd.DataFrame(index=adata.obs_names)
    adata.uns["coexpression"] = {"skipped": reason}
    params = {**asdict(options), "seed": seed}
    record_provenance(adata, rule="coexpression", backend=backend, params=params, timings={})
    return {
        "edges": pd.DataFrame(columns=["gene_a", "gene_b", "weight"]),
        "modules": pd.DataFrame(columns=["gene", "module", "hub_score"]),
        "eigengenes": adata.obsm["module_eigengenes"],
    }


class GeneNetwork(NamedTuple):
    """A co-expression network.

    Its genes, how many selected genes were left out, the samples (cells or metacells)
    correlated, the graph and its modules.
    """

    genes: pd.Index
    genes_skipped: int
    samples: int
    graph: sparse.csr_matrix
    modules: pd.DataFrame


def _gene_network(
    adata: AnnData, *, options: CoexpressionOptions, seed: int, backend: Backend, timer: StepTimer
) -> GeneNetwork:
    """Genes, metacells, correlation graph and modules (the eigengenes are the caller's)."""
    with timer.step("select_genes"):
        selected = coexpression.select_genes(adata, n_genes=options.n_genes)
        genes = coexpression.check_expression(
            adata,
            genes=selected,
            top_k=options.top_k,
            min_cells=options.min_cells,
            min_expressing_cells=options.min_expressing_cells,
        )
    with timer.step("metacells"):
        pooled = coexpression.pool_metacells(
            adata,
            method=options.metacells.method,
            n_metacells=options.metacells.n_metacells,
            seed=seed,
            backend=backend,
        )
    with timer.step("standardize"):
        standardized = coexpression.standardize(pooled[:, genes].X, method=options.correlation, backend=backend)
    with timer.step("correlation"):
        graph = coexpression.correlation_graph(
            standardized,
            top_k=options.top_k,
            min_correlation=options.min_correlation,
            power=options.power,
            backend=backend,
        )
        del standardized  # the device copy, before the community search
    with timer.step("modules"):
        modules = coexpression.find_modules(
            graph,
            genes=genes,
            algorithm=options.algorithm,
            resolution=options.resolution,
            min_module_size=options.min_module_size,
            seed=seed,
            backend=backend,
        )
    return GeneNetwork(genes, len(selected) - len(genes), pooled.n_obs, graph, modules)


def run_coexpression_per_cluster(
    adata: AnnData, *, options: CoexpressionOptions, clusters: str, seed: int, backend: Backend
) -> pd.DataFrame:
    """Modules of each cluster's own co-expression network.

    Clusters with fewer cells than ``options.per_cluster.min_cells``, or whose network
    cannot be built (e.g. too few usable genes), are skipped and listed in
    ``uns["coexpression"]["clusters_skipped"]``.

    Parameters
    ----------
    adata
        As for :func:`run_coexpression`, with clusters in ``obs[clusters]``.
    options
        As for :func:`run_coexpression`; ``per_cluster.min_cells`` too.
    clusters
        Column of ``obs`` with the clusters.
    seed, backend
        As for :func:`run_coexpression`.

    Returns
    -------
    Columns ``cluster``, ``gene``, ``module``, ``hub_score``.
    """
    tables, skipped = [], {}
    for cluster in adata.obs[clusters].astype("category").cat.categories:
        cells = adata[(adata.obs[clusters] == cluster).to_numpy()].copy()
        if cells.n_obs < options.per_cluster.min_cells:
            skipped[str(cluster)] = f"{cells.n_obs} cells"
            continue
        try:
            modules = _gene_network(
                cells, options=options, seed=seed, backend=backend, timer=StepTimer(backend=backend)
            ).modules
        except InputError as exc:
            skipped[str(cluster)] = exc.problem
            continue
        tables.append(modules.astype({"module": str}).assign(cluster=str(cluster)))
    adata.uns.setdefault("coexpression", {})["clusters_skipped"] = skipped
    log.info("coexpression per cluster: %d networks, skipped %s", len(tables), skipped or "none")
    columns = ["cluster", "gene", "module", "hub_score"]
    return pd.concat(tables, ignore_index=True)[columns] if tables else pd.DataFrame(columns=columns)


def _embed_and_cluster(
    adata: AnnData, *, use_rep: str, options: EmbeddingOptions, seed: int, backend: Backend, timer: StepTimer
) -> None:
    """Neighbours on an embedding, UMAP and Leiden at each configured resolution."""
    with timer.step("neighbors"):
        _neighbors(adata, options=options.neighbors, use_rep=use_rep, backend=backend)
    _umap_and_leiden(adata, umap=options.umap, leiden=options.leiden, seed=seed, backend=backend, timer=timer)


def _umap_and_leiden(
    adata: AnnData, *, umap: UmapOptions, leiden: LeidenOptions, seed: int, backend: Backend, timer: StepTimer
) -> None:
    """UMAP and Leiden at each configured resolution, on the neighbour graph in ``obsp``."""
    with timer.step("umap"):
        clustering.umap(adata, min_dist=umap.min_dist, seed=seed, backend=backend)
    with timer.step("leiden"):
        clustering.cluster_graph(adata, algorithm="leiden", resolutions=leiden.resolutions, seed=seed, backend=backend)


def run_protein(
    adata: AnnData,
    *,
    empty: AnnData | None,
    options: ProteinOptions,
    embedding_options: EmbeddingOptions,
    seed: int,
    backend: Backend,
) -> None:
    """Antibody tags (CITE-seq): QC metrics, CLR or dsb, PCA, neighbours, UMAP and Leiden.

    Parameters
    ----------
    adata
        Cells x antibodies, raw counts; normalized in place (counts kept in a layer).
    empty
        Empty droplets x antibodies, raw counts (dsb's background), or ``None``.
    options
        ``normalization`` (``auto``: dsb when empty droplets are given, else CLR),
        ``isotype_pattern``, ``dsb`` and ``n_comps``.
    embedding_options
        Neighbours, UMAP and Leiden of the tags' PCs.
    seed
        Seed for PCA, UMAP and Leiden.
    backend
        ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    InputError
        dsb asked for without empty droplets, or its denoising without isotype controls.
    """
    timer = StepTimer(backend=backend)
    isotypes = normalization.isotype_controls(adata, pattern=options.isotype_pattern)
    method = options.normalization
    if method == "auto":
        method = "dsb" if empty is not None else "clr"
    with timer.step("normalize"):
        normalization.protein_qc(adata, isotypes=isotypes)
        if method == "clr":
            normalization.clr(adata, backend=backend)
        elif empty is None:
            raise InputError("protein.normalization is dsb, which needs empty droplets (sample sheet column adt_empty)")
        elif options.dsb.denoise and not isotypes:
            raise InputError(
                f"dsb's denoising asks for isotype controls, and none of the {adata.n_vars} antibodies "
                f"matches protein.isotype_pattern {options.isotype_pattern!r}"
            )
        else:
            normalization.dsb(
                adata,
                empty=empty,
                isotypes=isotypes,
                pseudocount=options.dsb.pseudocount,
                denoise=options.dsb.denoise,
                backend=backend,
            )
    adata.var["isotype_control"] = adata.var_names.isin(isotypes)
    adata.var["highly_variable"] = ~adata.var["isotype_control"]  # the PCA leaves isotypes out
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("pca"):
        preprocessing.pca(adata, n_comps=options.n_comps, seed=seed, backend=backend)
    _embed_and_cluster(adata, use_rep="X_pca", options=embedding_options, seed=seed, backend=backend, timer=timer)
    with timer.step("to_host"):
        to_host(adata)
    record_provenance(
        adata,
        rule="protein",
        backend=backend,
        params={**asdict(options), "normalization": method, "seed": seed},
        timings=timer.seconds,
    )


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
    _embed_and_cluster(adata, use_rep="X_lsi", options=embedding_options, seed=seed, backend=backend, timer=timer)
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


EMBEDDINGS = {"rna": "X_pca", "protein": "X_pca", "atac": "X_lsi"}


def run_multiome(
    modalities: Mapping[str, AnnData],
    *,
    options: MultiomeOptions,
    embedding_options: EmbeddingOptions,
    seed: int,
    backend: Backend,
) -> MuData:
    """Modalities joined by barcode, with a joint graph, UMAP and clusters.

    Weighted nearest neighbours, a joint UMAP and joint Leiden clusters.

    Parameters
    ----------
    modalities
        Two or more of ``rna`` (with ``obsm["X_pca"]``), ``protein`` (``X_pca``) and
        ``atac`` (``X_lsi``), each already processed by its own rule.
    options
        ``min_overlap`` and ``wnn`` (``n_neighbors``, ``n_bandwidth_neighbors``,
        ``n_candidates``).
    embedding_options
        ``neighbors.n_pcs`` (the RNA PCs used), ``umap`` and ``leiden``.
    seed
        Seed for UMAP and Leiden.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The MuData: per-modality results in its modalities; the joint graph, ``X_umap``,
    ``obs["wnn_leiden_<resolution>"]`` and ``obs["<modality>:mod_weight"]`` at the top.

    Raises
    ------
    InputError
        The modalities share too few cells (``min_overlap``).
    """
    timer = StepTimer(backend=backend)
    mdata, _ = wnn.join_modalities(dict(modalities), min_overlap=options.min_overlap)
    with timer.step("wnn"):
        wnn.weighted_nearest_neighbors(
            mdata,
            representations={name: EMBEDDINGS[name] for name in mdata.mod},
            n_dims={"rna": embedding_options.neighbors.n_pcs},
            n_neighbors=options.wnn.n_neighbors,
            n_bandwidth_neighbors=options.wnn.n_bandwidth_neighbors,
            n_candidates=options.wnn.n_candidates,
            backend=backend,
        )
    joint = AnnData(
        obs=pd.DataFrame(index=mdata.obs_names),
        obsm={"X_wnn_input": mdata.obsm["X_wnn_input"]},
        obsp={key: mdata.obsp[key] for key in ("connectivities", "distances")},
        uns={"neighbors": mdata.uns["neighbors"]},
    )
    _umap_and_leiden(
        joint, umap=embedding_options.umap, leiden=embedding_options.leiden, seed=seed, backend=backend, timer=timer
    )
    to_host(joint)
    mdata.obsm["X_umap"] = joint.obsm["X_umap"]
    for key in joint.obs:
        mdata.obs[f"wnn_{key}"] = joint.obs[key].array  # categories kept: plotted as clusters
    params = {**asdict(options), "seed": seed}
    record_provenance(mdata, rule="multiome", backend=backend, params=params, timings=timer.seconds)
    return mdata


def run_merge(
    samples: Mapping[str, AnnData],
    *,
    options: MergeOptions,
    clustering_options: ClusteringOptions,
    labels: str,
    seed: int,
    backend: Backend,
    n_gpus: int = 1,
) -> tuple[AnnData, pd.DataFrame]:
    """Samples merged and integrated with Harmony.

    Normalized, batch-aware HVGs, PCA, Harmony, neighbours, UMAP and Leiden on the
    corrected embedding, with integration metrics before and after Harmony, and markers of
    the merged Leiden clusters at the resolution of ``labels`` (``uns["rank_genes_groups"]``).

    With ``options.dask`` on the GPU backend, the merged counts are spread over
    ``n_gpus`` GPUs (a Dask worker each) for normalization, HVGs and PCA; Harmony,
    neighbours, UMAP and Leiden then run on this process's GPU (a million cells' PCs take
    200 MB).

    Parameters
    ----------
    samples
        Sample name to its ``cluster`` rule output (counts in ``layers["counts"]``, its
        own clusters in ``obs[labels]``).
    options
        ``batch_key`` (``sample``, or ``batch`` for the sample sheet's column), ``harmony``
        (``theta``, ``max_iter``) and ``dask`` (``enabled`` and ``allow_partial`` are the
        workflow's).
    clustering_options
        ``normalize``, ``hvg``, ``pca``, ``neighbors``, ``umap``, ``leiden`` and the
        markers' ``method`` (not ``louvain``).
    labels
        The per-sample cluster column whose conservation is measured (a
        :func:`omicsprep.options.cluster_key`); the merged cells are clustered by
        Leiden at its resolution, before and after Harmony, to measure it.
    seed
        Seed for PCA, Harmony, UMAP and Leiden.
    backend
        ``"cpu"`` or ``"gpu"``.
    n_gpus
        GPUs for the Dask workers (the rule's ``gpu`` resource).

    Returns
    -------
    The merged cells (host memory), and a table of ``batch_mixing`` and
    ``label_conservation`` (see :mod:`omicsprep.rna.integration`) before and after Harmony.

    Raises
    ------
    InputError
        Fewer than two samples, samples that share no gene, or ``batch_key`` is ``batch``
        and some samples have none.
    ValueError
        ``labels`` is not a cluster column name.
    BackendUnavailableError
        ``options.dask`` on the GPU backend, and fewer than ``n_gpus`` GPUs or no
        dask-cuda.
    """
    if len(samples) < 2:  # batch mixing and label conservation of one sample say nothing
        raise InputError(f"a merge needs two samples or more; given {len(samples)}: {list(samples)}")
    parsed_labels = parse_cluster_key(labels)
    if parsed_labels is None:
        raise ValueError(f"labels {labels!r} is not a cluster column name (such as leiden_1.0)")
    _, resolution = parsed_labels
    timer = StepTimer(backend=backend)
    key = options.batch_key
    sharded = options.dask and backend == "gpu"
    if options.dask and not sharded:
        log.warning("merge.dask applies to the GPU backend; the CPU backend runs in this process")
    if sharded and n_gpus < 2:
        log.warning(
            "merge.dask with one GPU (the rule's gpu resource is 1): one Dask worker, slower than none; "
            "give the rule more, e.g. --set-resources merge:gpu=2"
        )
    with timer.step("concatenate"):
        # Sharded, the Dask workers take their shares of the host's matrix.
        adata = integration.concatenate_samples(samples, labels=labels, backend="cpu" if sharded else backend)
        if key != "sample":
            batches = adata.obs[key].astype(str) if key in adata.obs else pd.Series("", index=adata.obs_names)
            unlabelled = sorted(set(adata.obs.loc[batches.isin(["", "nan"]), "sample"]))
            if unlabelled:
                raise InputError(f"merge.batch_key is {key!r}, and samples {unlabelled} have no {key} in the sheet")
    with ExitStack() as workers:
        if sharded:
            with timer.step("start_workers"):
                client = workers.enter_context(gpu_workers(n_gpus))
        with timer.step("to_device"):
            if sharded:
                shard_to_gpus(adata, client=client)
            else:
                to_device(adata, backend=backend)
        with timer.step("normalize"):
            preprocessing.normalize(adata, target_sum=clustering_options.normalize.target_sum, backend=backend)
        with timer.step("hvg"):
            preprocessing.highly_variable_genes(
                adata,
                flavor=clustering_options.hvg.flavor,
                n_top_genes=clustering_options.hvg.n_top_genes,
                batch_key=key,
                backend=backend,
            )
        with timer.step("pca"):
            preprocessing.pca(adata, n_comps=clustering_options.pca.n_comps, seed=seed, backend=backend)
        with timer.step("matrices_to_host"):  # not needed from here on; the Dask workers stop here
            to_host(adata)
    rows = []
    for stage, embedding in (("before", "X_pca"), ("after", "X_pca_harmony")):
        if stage == "after":
            with timer.step("harmony"):
                integration.harmony(
                    adata,
                    key=key,
                    theta=options.harmony.theta,
                    max_iter=options.harmony.max_iter,
                    seed=seed,
                    backend=backend,
                )
        with timer.step(f"neighbors_{stage}"):
            _neighbors(adata, options=clustering_options.neighbors, use_rep=embedding, backend=backend)
            clustering.cluster_graph(adata, algorithm="leiden", resolutions=[resolution], seed=seed, backend=backend)
        rows.append(
            {
                "stage": stage,
                "embedding": embedding,
                "batch_mixing": round(integration.batch_mixing(adata, key=key), 4),
                "label_conservation": round(
                    integration.label_conservation(adata, clusters=cluster_key("leiden", resolution)), 4
                ),
            }
        )
    _umap_and_leiden(
        adata, umap=clustering_options.umap, leiden=clustering_options.leiden, seed=seed, backend=backend, timer=timer
    )
    with timer.step("markers"):
        if sharded:  # the Dask workers' matrix came back to this host
            to_device(adata, backend=backend)
        markers = cluster_key("leiden", resolution)
        clustering.rank_markers(adata, groupby=markers, method=clustering_options.markers.method, backend=backend)
    with timer.step("to_host"):
        to_host(adata)
    metrics = pd.DataFrame(rows)
    log.info("integration:\n%s", metrics.to_string(index=False))
    adata.uns["merge"]["integration"] = metrics.to_dict(orient="list")
    params = {**asdict(options), "seed": seed}
    record_provenance(adata, rule="merge", backend=backend, params=params, timings=timer.seconds)
    return adata, metrics
