"""Neighbour graph, UMAP, Leiden and Louvain clustering, and marker genes."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import (
    BLOCK_ENTRIES,
    Backend,
    asnumpy,
    column_entries,
    cupy,
    cupyx_sparse,
    is_dask_array,
    pylibcugraph,
    rapids_singlecell,
    row_block_bounds,
    take_columns,
)
from omicsprep.jit_cache import cache_umap_kernels
from omicsprep.options import Algorithm, MarkerMethod, cluster_key

log = logging.getLogger(__name__)


def neighbors(
    adata: AnnData, *, n_neighbors: int, n_pcs: int, metric: str, backend: Backend, use_rep: str = "X_pca"
) -> None:
    """Exact k-nearest-neighbour graph on an embedding with UMAP connectivities.

    Exact search on both backends (brute force on the GPU, scikit-learn on the CPU) gives
    the same graph on both and avoids pynndescent's long compilation in every new process.

    Parameters
    ----------
    adata
        Cells with the embedding in ``obsm[use_rep]``.
    n_neighbors
        Neighbours per cell, the cell itself included (scanpy's convention); capped below
        the number of cells.
    n_pcs
        Leading dimensions of the embedding used; capped by those present. The values used
        go to ``uns["neighbors"]["params"]``, each cap to the log.
    metric
        Distance, e.g. ``"euclidean"`` or ``"cosine"``.
    backend
        ``"cpu"`` or ``"gpu"``.
    use_rep
        The embedding: ``X_pca``, or e.g. ``X_lsi`` for chromatin.
    """
    if n_pcs > (available := adata.obsm[use_rep].shape[1]):
        log.info("neighbors: %d components of %s, not the %d asked: it has %d", available, use_rep, n_pcs, available)
        n_pcs = available
    if n_neighbors >= adata.n_obs:
        log.info("neighbors: %d neighbours, not the %d asked: %d cells", adata.n_obs - 1, n_neighbors, adata.n_obs)
        n_neighbors = adata.n_obs - 1
    if backend == "gpu":
        rapids_singlecell().pp.neighbors(
            adata, n_neighbors=n_neighbors, n_pcs=n_pcs, use_rep=use_rep, metric=metric, algorithm="brute"
        )
    else:
        import scanpy as sc

        cache_umap_kernels()
        sc.pp.neighbors(
            adata, n_neighbors=n_neighbors, n_pcs=n_pcs, use_rep=use_rep, metric=metric, transformer="sklearn"
        )
    adata.uns["neighbors"]["params"].update(n_neighbors=n_neighbors, n_pcs=n_pcs)  # the values used


def umap(adata: AnnData, *, min_dist: float, seed: int, backend: Backend) -> None:
    """Two-dimensional UMAP of the neighbour graph into ``obsm["X_umap"]``.

    The neighbour graph in ``obsp["connectivities"]`` is left unchanged.
    """
    if backend == "gpu":
        rapids_singlecell().tl.umap(adata, min_dist=min_dist, rng=seed)
    else:
        import scanpy as sc

        cache_umap_kernels()
        # umap-learn prunes weak edges of the graph it is given in place; keep the
        # neighbour graph intact for clustering.
        graph = adata.obsp["connectivities"].copy()
        sc.tl.umap(adata, min_dist=min_dist, random_state=seed)
        adata.obsp["connectivities"] = graph


def cluster_graph(
    adata: AnnData, *, algorithm: Algorithm, resolutions: Sequence[float], seed: int, backend: Backend
) -> None:
    """Leiden or Louvain clusters at each resolution, in ``obs["<algorithm>_<resolution>"]``.

    GPU: cuGraph's engine (:func:`partition_graph`; Leiden for at most 100 iterations;
    Louvain takes no seed). CPU: igraph, Leiden until the partition is stable, Louvain by
    its multilevel algorithm (scanpy's igraph flavour ignores the resolution, its default
    flavour needs the unmaintained ``louvain`` package). Clusters are numbered by
    decreasing size on both backends; ``uns[<key>]`` holds the parameters (and on the GPU
    the partition's modularity), as scanpy and rapids-singlecell record them.

    Parameters
    ----------
    adata
        Cells with a neighbour graph in ``obsp["connectivities"]``.
    algorithm
        ``"leiden"`` or ``"louvain"``.
    resolutions
        One clustering per resolution (higher: more, smaller clusters).
    seed
        Seed of the optimisation.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    for resolution in resolutions:
        key = cluster_key(algorithm, resolution)
        if backend == "gpu":
            labels, modularity = _partition_gpu(
                adata.obsp["connectivities"], algorithm=algorithm, resolution=resolution, seed=seed
            )
            adata.obs[key] = _ordered_categories(labels)
            seeded = {"random_state": seed} if algorithm == "leiden" else {}
            params = {"resolution": resolution, **seeded, "n_iterations": GPU_MAX_LEVELS}
            adata.uns[key] = {"params": params, "modularity": modularity}
        elif algorithm == "leiden":
            import scanpy as sc

            sc.tl.leiden(
                adata,
                resolution=resolution,
                flavor="igraph",
                n_iterations=-1,
                directed=False,
                random_state=seed,
                key_added=key,
            )
            adata.obs[key] = _ordered_categories(adata.obs[key].to_numpy())
        else:
            labels = partition_graph(
                adata.obsp["connectivities"], algorithm="louvain", resolution=resolution, seed=seed, backend="cpu"
            )
            adata.obs[key] = _ordered_categories(labels)


def partition_graph(
    adjacency: sparse.spmatrix, *, algorithm: Algorithm, resolution: float, seed: int, backend: Backend
) -> np.ndarray:
    """Communities of a weighted undirected graph, by modularity at ``resolution``.

    CPU: igraph (Leiden until stable; Louvain by its multilevel algorithm). GPU: cuGraph's
    engine, pylibcugraph (Leiden for at most 100 levels; Louvain takes no seed).

    Parameters
    ----------
    adjacency
        Symmetric weights (host memory; on the GPU backend also GPU memory); only the
        upper triangle is read.
    algorithm
        ``"leiden"`` or ``"louvain"``.
    resolution
        Higher: more, smaller communities.
    seed
        Seed of the optimisation.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    A community number per vertex; vertices without edges are each their own community.
    """
    if backend == "gpu":
        return _partition_gpu(adjacency, algorithm=algorithm, resolution=resolution, seed=seed)[0]
    upper = sparse.triu(adjacency, k=1).tocoo()
    import igraph

    graph = igraph.Graph(n=adjacency.shape[0], edges=np.column_stack([upper.row, upper.col]).tolist())
    weights = upper.data.tolist()
    # igraph draws from Python's `random`: seed a private generator, then restore.
    igraph.set_random_number_generator(random.Random(seed))
    try:
        if algorithm == "leiden":
            partition = graph.community_leiden(
                objective_function="modularity", weights=weights, resolution=resolution, n_iterations=-1
            )
        else:
            partition = graph.community_multilevel(weights=weights, resolution=resolution)
    finally:
        igraph.set_random_number_generator(random)
    return np.asarray(partition.membership)


GPU_MAX_LEVELS = 100  # Leiden's and Louvain's levels on the GPU (rapids-singlecell's default)


def _partition_gpu(
    adjacency: sparse.spmatrix, *, algorithm: Algorithm, resolution: float, seed: int
) -> tuple[np.ndarray, float]:
    """Communities and their modularity by pylibcugraph, as cuGraph's ``leiden`` and ``louvain`` run them.

    The graph is built as ``cugraph.Graph.from_cudf_edgelist`` builds an undirected one
    (symmetrized, duplicate edges dropped, renumbered), on every vertex, with weights in
    single precision as rapids-singlecell passes them.
    """
    cp, plc = cupy(), pylibcugraph()
    on_device = adjacency if cupyx_sparse().issparse(adjacency) else cupyx_sparse().csr_matrix(adjacency)
    upper = cupyx_sparse().triu(on_device, k=1).tocoo()
    handle = plc.ResourceHandle()
    graph = plc.SGGraph(
        resource_handle=handle,
        graph_properties=plc.GraphProperties(is_symmetric=True, is_multigraph=False),
        src_or_offset_array=upper.row.astype(cp.int32),
        dst_or_index_array=upper.col.astype(cp.int32),
        weight_array=upper.data.astype(cp.float32),
        store_transposed=False,
        renumber=True,
        vertices_array=cp.arange(adjacency.shape[0], dtype=cp.int32),
        drop_multi_edges=True,
        symmetrize=True,
    )
    if algorithm == "leiden":
        vertices, parts, modularity = plc.leiden(
            resource_handle=handle,
            random_state=seed,
            graph=graph,
            max_level=GPU_MAX_LEVELS,
            resolution=resolution,
            theta=1.0,
            do_expensive_check=False,
        )
    else:
        vertices, parts, modularity = plc.louvain(
            resource_handle=handle,
            graph=graph,
            max_level=GPU_MAX_LEVELS,
            threshold=1e-7,
            resolution=resolution,
            do_expensive_check=False,
        )
    labels = np.full(adjacency.shape[0], -1, dtype=np.int64)
    labels[asnumpy(vertices)] = asnumpy(parts)
    return labels, float(modularity)


def _ordered_categories(labels: np.ndarray) -> pd.Categorical:
    """Relabel clusters 0, 1, ... by decreasing size, as scanpy does."""
    values, counts = np.unique(labels, return_counts=True)
    rank = {value: str(i) for i, value in enumerate(values[np.argsort(-counts, kind="stable")])}
    names = [rank[value] for value in labels]
    return pd.Categorical(names, categories=[str(i) for i in range(len(values))])


def rank_markers(adata: AnnData, *, groupby: str, method: MarkerMethod, backend: Backend) -> None:
    """Rank marker genes of each cluster against the rest into ``uns["rank_genes_groups"]``.

    Clusters of one cell (a very high resolution) have no statistics and are left out, with a
    log line; nothing is ranked (and a warning logged) when fewer than two clusters are left.

    Parameters
    ----------
    adata
        Log-normalized ``X`` and clusters in ``obs[groupby]``.
    groupby
        Column of ``obs`` with the clusters.
    method
        Test: ``"wilcoxon"``, ``"t-test"`` or ``"logreg"``.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    sizes = adata.obs[groupby].value_counts()
    ranked = sizes.index[sizes >= 2]
    if len(ranked) < 2:
        log.warning("only %d cluster(s) of two cells or more in %s: no markers", len(ranked), groupby)
        return
    groups = "all" if len(ranked) == len(sizes) else [str(group) for group in sizes.index if group in set(ranked)]
    if groups != "all":
        log.info("markers: %d clusters of one cell in %s left out", len(sizes) - len(ranked), groupby)
    if backend == "gpu" and is_dask_array(adata.X):
        _rank_markers_by_gene_group(adata, groupby=groupby, method=method, groups=groups)
    elif backend == "gpu":
        rapids_singlecell().tl.rank_genes_groups(adata, groupby, groups=groups, method=method, use_raw=False, pts=True)
    else:
        import scanpy as sc

        sc.tl.rank_genes_groups(adata, groupby, groups=groups, method=method, use_raw=False, pts=True)


# Most entries of X ranked at once when X is in row blocks (8 GB on the GPU): rapids-singlecell's
# Wilcoxon test takes no Dask array, so genes are ranked in groups, each gathered into one matrix.
MARKER_GROUP_ENTRIES = 4 * BLOCK_ENTRIES


def _rank_markers_by_gene_group(adata: AnnData, *, groupby: str, method: MarkerMethod, groups: str | list[str]) -> None:
    """:func:`rank_markers` on the GPU for ``X`` in row blocks: genes in groups, then joined.

    Each gene's test is its own; only the Benjamini-Hochberg correction spans all genes, so it
    is made again over the joined p-values, as rapids-singlecell makes it (NaN counted as 1).
    """
    pointers = np.concatenate(([0], np.cumsum(column_entries(adata.X))))
    bounds = row_block_bounds(pointers, max_entries=MARKER_GROUP_ENTRIES)
    log.info("markers: %d genes ranked in %d groups", adata.n_vars, len(bounds) - 1)
    rankings = []
    for start, stop in pairwise(bounds):
        var = pd.DataFrame(index=adata.var_names[start:stop])
        genes = AnnData(take_columns(adata.X, start, stop), obs=adata.obs[[groupby]], var=var)
        rapids_singlecell().tl.rank_genes_groups(genes, groupby, groups=groups, method=method, use_raw=False, pts=True)
        rankings.append(genes.uns["rank_genes_groups"])
    adata.uns["rank_genes_groups"] = _joined_rankings(rankings)


def _joined_rankings(rankings: list[dict]) -> dict:
    """Rankings of groups of genes (``uns["rank_genes_groups"]`` each) as one, every cluster's genes by score."""
    from scipy.stats import false_discovery_control

    first = rankings[0]
    clusters = first["names"].dtype.names
    fields = [key for key in ("names", "scores", "pvals", "logfoldchanges") if key in first]
    columns: dict[str, list[np.ndarray]] = {key: [] for key in [*fields, "pvals_adj"] if key in first}
    for cluster in clusters:
        values = {key: np.concatenate([ranking[key][cluster] for ranking in rankings]) for key in fields}
        order = np.argsort(-values["scores"], kind="stable")
        for key in fields:
            columns[key].append(values[key][order])
        if "pvals_adj" in columns:
            pvals = np.nan_to_num(values["pvals"][order], nan=1.0)
            columns["pvals_adj"].append(false_discovery_control(pvals, method="bh"))
    joined = {"params": first["params"]}
    for key, per_cluster in columns.items():
        dtype = [(cluster, first[key].dtype[cluster]) for cluster in clusters]
        joined[key] = np.rec.fromarrays(per_cluster, dtype=dtype)
    for key in ("pts", "pts_rest"):
        if key in first:
            joined[key] = pd.concat([ranking[key] for ranking in rankings])
    return joined


def markers_table(adata: AnnData, *, n_genes: int) -> pd.DataFrame:
    """Top ``n_genes`` markers per cluster as a long table (from :func:`rank_markers`)."""
    import scanpy as sc

    columns = ["group", "gene", "scores", "logfoldchanges", "pvals", "pvals_adj", "pct_nz_group", "pct_nz_reference"]
    if "rank_genes_groups" not in adata.uns:
        return pd.DataFrame(columns=columns)
    table = sc.get.rank_genes_groups_df(adata, group=None).rename(columns={"names": "gene"})
    if "group" not in table:  # scanpy drops it for one group (logreg of two clusters ranks one)
        table.insert(0, "group", adata.uns["rank_genes_groups"]["names"].dtype.names[0])
    table = table.groupby("group", observed=True, sort=False).head(n_genes)
    return table[[c for c in columns if c in table.columns]]
