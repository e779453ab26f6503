"""The workflow's fused steps: each runs a whole rule's chain on one backend.

A rule is a process, and on the GPU every process pays for importing RAPIDS and compiling
kernels; chaining the steps of a stage in one call moves the data to the device once and
pays those costs once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.atac import lsi
from omicsprep.backend import Backend, gpu_workers, shard_to_gpus, to_device, to_host
from omicsprep.errors import InputError
from omicsprep.multiome import wnn
from omicsprep.network import coexpression
from omicsprep.protein import normalization
from omicsprep.provenance import StepTimer, record_provenance
from omicsprep.rna import clustering, integration, preprocessing, qc

if TYPE_CHECKING:
    from mudata import MuData

log = logging.getLogger(__name__)

# The configuration sections that run_clustering reads.
CLUSTER_SECTIONS = ("normalize", "hvg", "pca", "neighbors", "umap", "leiden", "louvain", "markers")
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
    qc_params: Mapping[str, Any],
    doublet_params: Mapping[str, Any],
    seed: int,
    backend: Backend,
) -> tuple[AnnData, pd.DataFrame]:
    """QC metrics, cell filtering, gene filtering and doublet scoring.

    Parameters
    ----------
    adata
        Raw counts, cells x genes, in host memory.
    qc_params
        The ``qc`` section of the configuration: ``gene_groups``, ``filter`` (keyword
        arguments of :func:`omicsprep.rna.qc.qc_pass_mask`), ``min_cells_per_gene`` and
        ``min_cells_left``.
    doublet_params
        The ``doublets`` section: ``enabled``, ``expected_rate``, ``remove``,
        ``max_cells_per_run``.
    seed
        Seed for doublet simulation.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The cells that passed (in host memory) and a table of every input cell's metrics with
    ``passed`` and ``fail_reason`` columns.
    """
    timer = StepTimer(backend=backend)
    n_input = adata.n_obs
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("qc_metrics"):
        qc.annotate_gene_groups(adata, patterns=qc_params["gene_groups"])
        qc.calculate_qc_metrics(adata, qc_vars=list(qc_params["gene_groups"]), backend=backend)
    with timer.step("filter"):
        reasons = qc.qc_pass_mask(adata, **qc_params["filter"])
        metrics = adata.obs[[c for c in CELL_METRICS if c in adata.obs]].copy()
        metrics["fail_reason"] = reasons
        adata = adata[(reasons == "").to_numpy()].copy()
        qc.require_cells(adata, minimum=qc_params["min_cells_left"], after="cell filtering")
        qc.filter_genes(adata, min_cells=qc_params["min_cells_per_gene"], backend=backend)
    if doublet_params["enabled"]:
        with timer.step("doublets"):
            qc.score_doublets(
                adata,
                expected_rate=doublet_params["expected_rate"],
                max_cells_per_run=doublet_params["max_cells_per_run"],
                seed=seed,
                backend=backend,
            )
            metrics["doublet_score"] = adata.obs["doublet_score"].reindex(metrics.index)
            doublets = adata.obs["predicted_doublet"].to_numpy()
            if doublet_params["remove"]:
                metrics.loc[adata.obs_names[doublets], "fail_reason"] = "doublet"
                adata = adata[~doublets].copy()
                qc.require_cells(adata, minimum=qc_params["min_cells_left"], after="doublet removal")
    metrics["passed"] = metrics["fail_reason"] == ""
    with timer.step("to_host"):
        to_host(adata)
    log.info("qc: kept %d of %d cells, %d genes", adata.n_obs, n_input, adata.n_vars)
    params = {"qc": qc_params, "doublets": doublet_params, "seed": seed}
    record_provenance(adata, rule="qc", backend=backend, params=params, timings=timer.seconds)
    return adata, metrics


def run_clustering(adata: AnnData, *, params: Mapping[str, Any], seed: int, backend: Backend) -> pd.DataFrame:
    """Normalization, HVG, PCA, neighbours, UMAP, Leiden, Louvain and markers, in place.

    Parameters
    ----------
    adata
        QC'd raw counts in host memory; comes back in host memory.
    params
        Configuration sections ``normalize``, ``hvg``, ``pca``, ``neighbors``, ``umap``,
        ``leiden``, ``louvain`` and ``markers``.
    seed
        Seed for PCA, UMAP and clustering.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The marker genes table.
    """
    timer = StepTimer(backend=backend)
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("normalize"):
        preprocessing.normalize(adata, target_sum=params["normalize"]["target_sum"], backend=backend)
    with timer.step("hvg"):
        preprocessing.highly_variable_genes(adata, **params["hvg"], backend=backend)
    with timer.step("pca"):
        preprocessing.pca(adata, n_comps=params["pca"]["n_comps"], seed=seed, backend=backend)
    with timer.step("neighbors"):
        clustering.neighbors(adata, **params["neighbors"], backend=backend)
    with timer.step("umap"):
        clustering.umap(adata, min_dist=params["umap"]["min_dist"], seed=seed, backend=backend)
    for algorithm in ("leiden", "louvain"):
        with timer.step(algorithm):
            clustering.cluster_graph(
                adata, algorithm=algorithm, resolutions=params[algorithm]["resolutions"], seed=seed, backend=backend
            )
    markers = params["markers"]
    with timer.step("markers"):
        groupby = clustering.cluster_key(markers["algorithm"], markers["resolution"])
        clustering.rank_markers(adata, groupby=groupby, method=markers["method"], backend=backend)
    with timer.step("to_host"):
        to_host(adata)
    record_provenance(adata, rule="cluster", backend=backend, params={**params, "seed": seed}, timings=timer.seconds)
    return clustering.markers_table(adata, n_genes=markers["n_genes"])


def run_coexpression(
    adata: AnnData, *, params: Mapping[str, Any], seed: int, backend: Backend
) -> dict[str, pd.DataFrame]:
    """Gene co-expression network, modules, hub genes and per-cell module eigengenes.

    Parameters
    ----------
    adata
        Cells with log-normalized ``X`` (the ``cluster`` rule's output); gains
        ``obsm["module_eigengenes"]`` and ``uns["coexpression"]``.
    params
        The ``coexpression`` configuration section.
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
    network = _gene_network(adata, params=params, seed=seed, backend=backend, timer=timer)
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
        adata, rule="coexpression", backend=backend, params={**params, "seed": seed}, timings=timer.seconds
    )
    return {"edges": edges, "modules": network.modules, "eigengenes": adata.obsm["module_eigengenes"]}


def skipped_coexpression(
    adata: AnnData, *, reason: str, params: Mapping[str, Any], seed: int, backend: Backend
) -> dict[str, pd.DataFrame]:
    """Empty co-expression results for a sample whose network cannot be built.

    The reason goes to ``uns["coexpression"]["skipped"]`` and the rule's provenance.

    Returns
    -------
    :func:`run_coexpression`'s tables, without rows (eigengenes: one row per cell, no
    columns).
    """
    log.warning("coexpression skipped: %s", reason)
    adata.obsm["module_eigengenes"] = pd.DataFrame(index=adata.obs_names)
    adata.uns["coexpression"] = {"skipped": reason}
    record_provenance(adata, rule="coexpression", backend=backend, params={**params, "seed": seed}, timings={})
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
    adata: AnnData, *, params: Mapping[str, Any], seed: int, backend: Backend, timer: StepTimer
) -> GeneNetwork:
    """Genes, metacells, correlation graph and modules (the eigengenes are the caller's)."""
    with timer.step("select_genes"):
        selected = coexpression.select_genes(adata, n_genes=params["n_genes"])
        genes = coexpression.check_expression(
            adata,
            genes=selected,
            top_k=params["top_k"],
            min_cells=params["min_cells"],
            min_expressing_cells=params["min_expressing_cells"],
        )
    with timer.step("metacells"):
        pooled = coexpression.pool_metacells(adata, **params["metacells"], seed=seed, backend=backend)
    with timer.step("standardize"):
        standardized = coexpression.standardize(pooled[:, genes].X, method=params["correlation"], backend=backend)
    with timer.step("correlation"):
        graph = coexpression.correlation_graph(
            standardized,
            top_k=params["top_k"],
            min_correlation=params["min_correlation"],
            power=params["power"],
            backend=backend,
        )
        del standardized  # the device copy, before the community search
    with timer.step("modules"):
        modules = coexpression.find_modules(
            graph,
            genes=genes,
            algorithm=params["algorithm"],
            resolution=params["resolution"],
            min_module_size=params["min_module_size"],
            seed=seed,
            backend=backend,
        )
    return GeneNetwork(genes, len(selected) - len(genes), pooled.n_obs, graph, modules)


def run_coexpression_per_cluster(
    adata: AnnData, *, params: Mapping[str, Any], clusters: str, seed: int, backend: Backend
) -> pd.DataFrame:
    """Modules of each cluster's own co-expression network.

    Clusters with fewer cells than ``params["per_cluster"]["min_cells"]``, or whose network
    cannot be built (e.g. too few usable genes), are skipped and listed in
    ``uns["coexpression"]["clusters_skipped"]``.

    Parameters
    ----------
    adata
        As for :func:`run_coexpression`, with clusters in ``obs[clusters]``.
    params
        The ``coexpression`` configuration section.
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
        if cells.n_obs < params["per_cluster"]["min_cells"]:
            skipped[str(cluster)] = f"{cells.n_obs} cells"
            continue
        try:
            modules = _gene_network(
                cells, params=params, seed=seed, backend=backend, timer=StepTimer(backend=backend)
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
    adata: AnnData, *, use_rep: str, params: Mapping[str, Any], seed: int, backend: Backend, timer: StepTimer
) -> None:
    """Neighbours on an embedding, UMAP and Leiden at each configured resolution."""
    with timer.step("neighbors"):
        clustering.neighbors(adata, **params["neighbors"], use_rep=use_rep, backend=backend)
    _umap_and_leiden(adata, params=params, seed=seed, backend=backend, timer=timer)


def _umap_and_leiden(
    adata: AnnData, *, params: Mapping[str, Any], seed: int, backend: Backend, timer: StepTimer
) -> None:
    """UMAP and Leiden at each configured resolution, on the neighbour graph in ``obsp``."""
    with timer.step("umap"):
        clustering.umap(adata, min_dist=params["umap"]["min_dist"], seed=seed, backend=backend)
    with timer.step("leiden"):
        clustering.cluster_graph(
            adata, algorithm="leiden", resolutions=params["leiden"]["resolutions"], seed=seed, backend=backend
        )


def run_protein(
    adata: AnnData,
    *,
    empty: AnnData | None,
    params: Mapping[str, Any],
    clustering_params: Mapping[str, Any],
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
    params
        The ``protein`` configuration section: ``normalization`` (``auto``: dsb when
        empty droplets are given, else CLR), ``isotype_pattern``, ``dsb`` and
        ``n_comps``.
    clustering_params
        Sections ``neighbors``, ``umap`` and ``leiden``.
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
    isotypes = normalization.isotype_controls(adata, pattern=params["isotype_pattern"])
    method = params["normalization"]
    if method == "auto":
        method = "dsb" if empty is not None else "clr"
    with timer.step("normalize"):
        normalization.protein_qc(adata, isotypes=isotypes)
        if method == "clr":
            normalization.clr(adata, backend=backend)
        elif empty is None:
            raise InputError("protein.normalization is dsb, which needs empty droplets (sample sheet column adt_empty)")
        elif params["dsb"]["denoise"] and not isotypes:
            raise InputError(
                f"dsb's denoising asks for isotype controls, and none of the {adata.n_vars} antibodies "
                f"matches protein.isotype_pattern {params['isotype_pattern']!r}"
            )
        else:
            normalization.dsb(adata, empty=empty, isotypes=isotypes, **params["dsb"], backend=backend)
    adata.var["isotype_control"] = adata.var_names.isin(isotypes)
    adata.var["highly_variable"] = ~adata.var["isotype_control"]  # the PCA leaves isotypes out
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("pca"):
        preprocessing.pca(adata, n_comps=params["n_comps"], seed=seed, backend=backend)
    _embed_and_cluster(adata, use_rep="X_pca", params=clustering_params, seed=seed, backend=backend, timer=timer)
    with timer.step("to_host"):
        to_host(adata)
    record_provenance(
        adata,
        rule="protein",
        backend=backend,
        params={**params, "normalization": method, "seed": seed},
        timings=timer.seconds,
    )


def run_chromatin(
    adata: AnnData, *, params: Mapping[str, Any], clustering_params: Mapping[str, Any], seed: int, backend: Backend
) -> None:
    """Chromatin accessibility: feature filter, TF-IDF, LSI, neighbours, UMAP and Leiden.

    Parameters
    ----------
    adata
        Cells x peaks or tiles with fragment counts and QC in ``obs``
        (:func:`omicsprep.atac.fragments.count_fragments`); transformed in place (counts kept
        in a layer).
    params
        The ``chromatin`` configuration section: ``min_cells_per_feature`` and ``lsi``
        (``n_comps``, ``max_depth_correlation``).
    clustering_params
        Sections ``neighbors``, ``umap`` and ``leiden``.
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
        in_cells = np.asarray((adata.X > 0).sum(axis=0)).ravel()
        kept = in_cells >= params["min_cells_per_feature"]
        if kept.sum() < 2:
            raise InputError(
                f"{int(kept.sum())} of {adata.n_vars} chromatin features are seen in "
                f"{params['min_cells_per_feature']} cells or more: too few for LSI"
            )
        adata._inplace_subset_var(kept)  # noqa: SLF001 - anndata's in-place subset, no copy of X
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("lsi"):
        lsi.tfidf(adata, backend=backend)
        lsi.lsi(adata, **params["lsi"], backend=backend)
    _embed_and_cluster(adata, use_rep="X_lsi", params=clustering_params, seed=seed, backend=backend, timer=timer)
    with timer.step("to_host"):
        to_host(adata)
    record_provenance(adata, rule="chromatin", backend=backend, params={**params, "seed": seed}, timings=timer.seconds)


EMBEDDINGS = {"rna": "X_pca", "prot": "X_pca", "atac": "X_lsi"}


def run_multiome(
    modalities: Mapping[str, AnnData],
    *,
    params: Mapping[str, Any],
    clustering_params: Mapping[str, Any],
    seed: int,
    backend: Backend,
) -> MuData:
    """Modalities joined by barcode, with a joint graph, UMAP and clusters.

    Weighted nearest neighbours, a joint UMAP and joint Leiden clusters.

    Parameters
    ----------
    modalities
        Two or more of ``rna`` (with ``obsm["X_pca"]``), ``prot`` (``X_pca``) and
        ``atac`` (``X_lsi``), each already processed by its own rule.
    params
        The ``multiome`` configuration section: ``min_overlap`` and ``wnn``
        (``n_neighbors``, ``n_bandwidth_neighbors``, ``n_candidates``).
    clustering_params
        Sections ``neighbors`` (``n_pcs``: the RNA PCs used), ``umap`` and ``leiden``.
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
    mdata, _ = wnn.join_modalities(dict(modalities), min_overlap=params["min_overlap"])
    with timer.step("wnn"):
        wnn.weighted_nearest_neighbors(
            mdata,
            representations={name: EMBEDDINGS[name] for name in mdata.mod},
            n_dims={"rna": clustering_params["neighbors"]["n_pcs"]},
            **params["wnn"],
            backend=backend,
        )
    joint = AnnData(
        obs=pd.DataFrame(index=mdata.obs_names),
        obsm={"X_wnn_input": mdata.obsm["X_wnn_input"]},
        obsp={key: mdata.obsp[key] for key in ("connectivities", "distances")},
        uns={"neighbors": mdata.uns["neighbors"]},
    )
    _umap_and_leiden(joint, params=clustering_params, seed=seed, backend=backend, timer=timer)
    to_host(joint)
    mdata.obsm["X_umap"] = joint.obsm["X_umap"]
    for key in joint.obs:
        mdata.obs[f"wnn_{key}"] = joint.obs[key].array  # categories kept: plotted as clusters
    record_provenance(mdata, rule="multiome", backend=backend, params={**params, "seed": seed}, timings=timer.seconds)
    return mdata


def run_merge(
    samples: Mapping[str, AnnData],
    *,
    params: Mapping[str, Any],
    clustering_params: Mapping[str, Any],
    labels: str,
    seed: int,
    backend: Backend,
    n_gpus: int = 1,
) -> tuple[AnnData, pd.DataFrame]:
    """Samples merged and integrated with Harmony.

    Normalized, batch-aware HVGs, PCA, Harmony, neighbours, UMAP and Leiden on the
    corrected embedding, with integration metrics before and after Harmony.

    With ``params["dask"]`` on the GPU backend, the merged counts are spread over
    ``n_gpus`` GPUs (a Dask worker each) for normalization, HVGs and PCA; Harmony,
    neighbours, UMAP and Leiden then run on this process's GPU (a million cells' PCs take
    200 MB).

    Parameters
    ----------
    samples
        Sample name to its ``cluster`` rule output (counts in ``layers["counts"]``, its
        own clusters in ``obs[labels]``).
    params
        The ``merge`` configuration section: ``batch_key`` (``sample``, or ``batch`` for
        the sample sheet's column), ``harmony`` (``theta``, ``max_iter``) and ``dask``.
    clustering_params
        Sections ``normalize``, ``hvg``, ``pca``, ``neighbors``, ``umap`` and ``leiden``.
    labels
        The per-sample cluster column whose conservation is measured (a
        :func:`omicsprep.rna.clustering.cluster_key`); the merged cells are clustered by
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
        ``batch_key`` is ``batch`` and some samples have none.
    ValueError
        ``labels`` is not a cluster column name.
    BackendUnavailableError
        ``params["dask"]`` on the GPU backend, and fewer than ``n_gpus`` GPUs or no
        dask-cuda.
    """
    parsed_labels = clustering.parse_cluster_key(labels)
    if parsed_labels is None:
        raise ValueError(f"labels {labels!r} is not a cluster column name (such as leiden_1.0)")
    _, resolution = parsed_labels
    timer = StepTimer(backend=backend)
    key = params["batch_key"]
    sharded = params.get("dask", False) and backend == "gpu"
    if params.get("dask", False) and not sharded:
        log.warning("merge.dask applies to the GPU backend; the CPU backend runs in this process")
    if sharded and n_gpus < 2:
        log.warning(
            "merge.dask with one GPU (the rule's gpu resource is 1): one Dask worker, slower than none; "
            "give the rule more, e.g. --set-resources merge:gpu=2"
        )
    with timer.step("concatenate"):
        adata = integration.concatenate_samples(samples, labels=labels)
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
            preprocessing.normalize(adata, target_sum=clustering_params["normalize"]["target_sum"], backend=backend)
        with timer.step("hvg"):
            preprocessing.highly_variable_genes(adata, **clustering_params["hvg"], batch_key=key, backend=backend)
        with timer.step("pca"):
            preprocessing.pca(adata, n_comps=clustering_params["pca"]["n_comps"], seed=seed, backend=backend)
        with timer.step("matrices_to_host"):  # not needed from here on; the Dask workers stop here
            to_host(adata)
    rows = []
    for stage, embedding in (("before", "X_pca"), ("after", "X_pca_harmony")):
        if stage == "after":
            with timer.step("harmony"):
                integration.harmony(adata, key=key, **params["harmony"], seed=seed, backend=backend)
        with timer.step(f"neighbors_{stage}"):
            clustering.neighbors(adata, **clustering_params["neighbors"], use_rep=embedding, backend=backend)
            clustering.cluster_graph(adata, algorithm="leiden", resolutions=[resolution], seed=seed, backend=backend)
        rows.append(
            {
                "stage": stage,
                "embedding": embedding,
                "batch_mixing": round(integration.batch_mixing(adata, key=key), 4),
                "label_conservation": round(
                    integration.label_conservation(adata, clusters=clustering.cluster_key("leiden", resolution)), 4
                ),
            }
        )
    _umap_and_leiden(adata, params=clustering_params, seed=seed, backend=backend, timer=timer)
    with timer.step("to_host"):
        to_host(adata)
    metrics = pd.DataFrame(rows)
    log.info("integration:\n%s", metrics.to_string(index=False))
    adata.uns["merge"]["integration"] = metrics.to_dict(orient="list")
    record_provenance(adata, rule="merge", backend=backend, params={**params, "seed": seed}, timings=timer.seconds)
    return adata, metrics
