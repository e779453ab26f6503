"""Rules qc, cluster and merge as chains of steps on one backend.

A rule is a process, and on the GPU every process pays for importing RAPIDS and compiling
kernels; chaining a rule's steps in one call moves the data to the device once and pays
those costs once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.backend import Backend, dask_gpu_cluster, is_dask_array, keep_rows, shard_to_gpus, to_device, to_host
from omicsprep.errors import InputError
from omicsprep.options import (
    ClusteringOptions,
    DoubletOptions,
    MergeOptions,
    QcOptions,
    cluster_key,
    parse_cluster_key,
)
from omicsprep.provenance import StepTimer, record_provenance
from omicsprep.rna import clustering, integration, integration_scores, latent, preprocessing, qc
from omicsprep.rna.embedding import neighbor_graph, umap_and_leiden

log = logging.getLogger(__name__)


class MergeResult(NamedTuple):
    """:func:`run_merge`'s merged cells, integration table, trained models and scIB benchmark."""

    cells: AnnData
    metrics: pd.DataFrame
    models: dict[str, Any]
    scib: Any


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
        neighbor_graph(adata, options=options.neighbors, use_rep="X_pca", backend=backend)
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


def run_merge(
    samples: Mapping[str, AnnData],
    *,
    options: MergeOptions,
    clustering_options: ClusteringOptions,
    labels: str,
    seed: int,
    backend: Backend,
    n_gpus: int = 1,
) -> MergeResult:
    """Samples merged and integrated (PCA, Harmony, scVI, scANVI).

    Normalized, batch-aware HVGs, PCA, then each integration method's embedding
    (``obsm["X_<method>"]``, and its UMAP ``obsm["X_umap_<method>"]``); neighbours, UMAP
    (``X_umap``) and Leiden on the one of ``options.integration.use``; integration metrics of
    every embedding (scIB's too where ``options.integration.label_key`` names known cell
    types), and markers of the merged Leiden clusters at the resolution of ``labels``
    (``uns["rank_genes_groups"]``).

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
        ``batch_key`` (``sample``, or ``batch`` for the sample sheet's column),
        ``integration`` (``methods``, ``use``, ``label_key``), each method's settings
        (``harmony``, ``scvi``, ``scanvi``) and ``dask`` (``enabled`` and ``allow_partial`` are
        the workflow's).
    clustering_options
        ``normalize``, ``hvg``, ``pca``, ``neighbors``, ``umap``, ``leiden`` and the
        markers' ``method`` (not ``louvain``).
    labels
        The per-sample cluster column whose conservation is measured (a
        :func:`omicsprep.options.cluster_key`); the merged cells are clustered by
        Leiden at its resolution on each embedding to measure it.
    seed
        Seed for PCA, Harmony, scVI, scANVI, UMAP and Leiden.
    backend
        ``"cpu"`` or ``"gpu"``.
    n_gpus
        GPUs for the Dask workers (the rule's ``gpu`` resource).

    Returns
    -------
    The merged cells (host memory); a table, a row per method, of ``batch_mixing`` and
    ``label_conservation`` (see :mod:`omicsprep.rna.integration`) and, with known labels,
    scIB's metrics (:mod:`omicsprep.rna.integration_scores`); scVI's and scANVI's trained
    models; the scIB benchmark (``None`` without labels).

    Raises
    ------
    InputError
        Fewer than two samples, samples that share no gene, ``batch_key`` is ``batch``
        and some samples have none, or ``label_key`` is no per-cell column of theirs.
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
    with ExitStack() as cluster:
        if sharded:
            with timer.step("start_workers"):
                client = cluster.enter_context(dask_gpu_cluster(n_gpus))
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
    methods, label_key = options.integration.methods, options.integration.label_key
    if label_key and label_key not in adata.obs:
        raise InputError(
            f"merge.integration.label_key {label_key!r} is not a per-cell column of the samples "
            f"(they have {sorted(adata.obs.columns)})"
        )
    models = correct_batches(adata, options=options, seed=seed, backend=backend, timer=timer)
    rows = []
    for method in sorted(methods, key=lambda name: name == options.integration.use):  # the graph used stays
        with timer.step(f"neighbors_{method}"):
            neighbor_graph(adata, options=clustering_options.neighbors, use_rep=f"X_{method}", backend=backend)
            clustering.cluster_graph(adata, algorithm="leiden", resolutions=[resolution], seed=seed, backend=backend)
        if method != options.integration.use:  # the used one's is X_umap, below
            with timer.step(f"umap_{method}"):
                clustering.umap(adata, min_dist=clustering_options.umap.min_dist, seed=seed, backend=backend)
                adata.obsm[f"X_umap_{method}"] = adata.obsm.pop("X_umap")
        clusters = cluster_key("leiden", resolution)
        rows.append(
            {
                "method": method,
                "embedding": f"X_{method}",
                "batch_mixing": round(integration.batch_mixing(adata, key=key), 4),
                "label_conservation": round(integration.label_conservation(adata, clusters=clusters), 4),
            }
        )
    metrics = pd.DataFrame(rows).set_index("method").loc[list(methods)].reset_index()
    scib = None
    if label_key:
        with timer.step("scib"):
            scib = integration_scores.scib_benchmarker(
                adata, embeddings=metrics["embedding"].tolist(), batch_key=key, label_key=label_key, backend=backend
            )
            metrics = metrics.merge(integration_scores.scib_table(scib), on="embedding")
    umap_and_leiden(
        adata, umap=clustering_options.umap, leiden=clustering_options.leiden, seed=seed, backend=backend, timer=timer
    )
    with timer.step("markers"):
        if sharded:  # the Dask workers' matrix came back to this host
            to_device(adata, backend=backend)
        markers = cluster_key("leiden", resolution)
        clustering.rank_markers(adata, groupby=markers, method=clustering_options.markers.method, backend=backend)
    with timer.step("to_host"):
        to_host(adata)
    log.info("integration:\n%s", metrics.to_string(index=False))
    adata.uns["merge"]["integration"] = metrics.to_dict(orient="list")
    params = {**asdict(options), "seed": seed}
    record_provenance(adata, rule="merge", backend=backend, params=params, timings=timer.seconds)
    return MergeResult(adata, metrics, models, scib)


def correct_batches(
    adata: AnnData, *, options: MergeOptions, seed: int, backend: Backend, timer: StepTimer
) -> dict[str, Any]:
    """Each of ``options.integration.methods``' embedding into ``obsm["X_<method>"]`` (``X_pca`` is there).

    Returns
    -------
    The trained models of scVI and scANVI, by method.
    """
    methods, models = options.integration.methods, {}
    if "harmony" in methods:
        with timer.step("harmony"):
            harmony = options.harmony
            integration.harmony(
                adata, key=options.batch_key, theta=harmony.theta, max_iter=harmony.max_iter, seed=seed, backend=backend
            )
    if "scvi" in methods:
        with timer.step("scvi"):
            models["scvi"] = latent.scvi(
                adata, batch_key=options.batch_key, options=options.scvi, seed=seed, backend=backend
            )
    if "scanvi" in methods:
        with timer.step("scanvi"):
            models["scanvi"] = latent.scanvi(
                adata,
                scvi_model=models["scvi"],
                label_key=options.integration.label_key,
                options=options.scanvi,
                steps=latent.training_steps(options.scvi, n_cells=adata.n_obs, backend=backend),
                seed=seed,
                backend=backend,
            )
    return models
