"""Rule coexpression as one chain: the gene network, its modules and hubs, per sample and per cluster."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import NamedTuple

import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend
from omicsprep.errors import InputError
from omicsprep.network import coexpression
from omicsprep.options import (
    CoexpressionOptions,
)
from omicsprep.provenance import StepTimer, record_provenance

log = logging.getLogger(__name__)


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
