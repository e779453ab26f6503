"""The clustering chain on real data equals a plain scanpy script with the same settings."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import scanpy as sc
import yaml
from conftest import CLUSTER_OPTIONS, MERGE_OPTIONS, NO_DOUBLETS, QC_OPTIONS, SCHEMA, widened
from sklearn.metrics import adjusted_rand_score

from omicsprep import io, options
from omicsprep.network.pipeline import run_coexpression
from omicsprep.rna import clustering
from omicsprep.rna.pipeline import run_clustering, run_merge, run_qc


@pytest.fixture(scope="module")
def mouse_qc(mouse_path):
    adata, _ = run_qc(
        io.read_counts(mouse_path), options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu"
    )
    return adata


@pytest.fixture(scope="module")
def mouse_clustered(mouse_qc):
    adata = mouse_qc.copy()
    markers = run_clustering(adata, options=CLUSTER_OPTIONS, seed=0, backend="cpu")
    return adata, markers


def plain_scanpy(adata):
    """What a user would write with scanpy alone (the peer of the CPU backend)."""
    adata.layers["counts"] = adata.X.copy()
    sc.pp.normalize_total(adata, target_sum=1e4)
    sc.pp.log1p(adata)
    sc.pp.highly_variable_genes(adata, flavor="seurat_v3", n_top_genes=2000, layer="counts")
    sc.pp.pca(adata, n_comps=50, mask_var="highly_variable", svd_solver="arpack", random_state=0)
    sc.pp.neighbors(adata, n_neighbors=15, n_pcs=30, transformer="sklearn")
    sc.tl.leiden(adata, resolution=1.0, flavor="igraph", n_iterations=-1, directed=False, random_state=0)
    return adata


def test_same_as_plain_scanpy(mouse_qc, mouse_clustered):
    ours, _ = mouse_clustered
    peer = plain_scanpy(mouse_qc.copy())
    assert ours.var["highly_variable"].equals(peer.var["highly_variable"])
    np.testing.assert_allclose(np.abs(ours.obsm["X_pca"]), np.abs(peer.obsm["X_pca"]), rtol=1e-3, atol=1e-3)
    assert adjusted_rand_score(ours.obs["leiden_1.0"], peer.obs["leiden"]) == 1.0
    # The reference run in shared/data found 9 clusters with similar settings.
    assert 6 <= ours.obs["leiden_1.0"].nunique() <= 14


def test_outputs_of_the_chain(mouse_clustered):
    adata, markers = mouse_clustered
    assert adata.obsm["X_umap"].shape == (adata.n_obs, 2)
    assert np.isfinite(adata.obsm["X_umap"]).all()
    assert adata.layers["counts"].sum() == pytest.approx(adata.obs["total_counts"].sum(), rel=1e-3)
    louvain = adata.obs["louvain_1.0"]
    assert louvain.nunique() > 3
    assert adjusted_rand_score(louvain, adata.obs["leiden_1.0"]) > 0.5
    assert set(markers["group"].unique()) == set(adata.obs["leiden_1.0"].cat.categories)
    for key in ("leiden_1.0", "louvain_1.0"):  # clusters numbered by decreasing size
        sizes = adata.obs[key].value_counts(sort=False).to_numpy()
        assert list(adata.obs[key].cat.categories) == [str(i) for i in range(len(sizes))]
        assert (np.diff(sizes) <= 0).all()
    assert (markers.groupby("group").size() == CLUSTER_OPTIONS.markers.n_genes).all()
    record = adata.uns["omicsprep"]["cluster"]
    assert record["backend"] == "cpu"
    assert set(record["timings"]) >= {"normalize", "pca", "neighbors", "umap", "leiden", "markers"}


def test_markers_equal_scanpys_rank_genes_groups(mouse_qc, mouse_clustered):
    """The markers table against scanpy's Wilcoxon test run by hand on the same cells.

    Log-normalized counts, the same Leiden clusters, scanpy's defaults otherwise.
    """
    ours, markers = mouse_clustered
    n_genes = CLUSTER_OPTIONS.markers.n_genes
    peer = mouse_qc.copy()
    sc.pp.normalize_total(peer, target_sum=1e4)
    sc.pp.log1p(peer)
    peer.obs["clusters"] = ours.obs["leiden_1.0"].to_numpy()
    sc.tl.rank_genes_groups(peer, "clusters", method="wilcoxon", use_raw=False, pts=True)
    reference = peer.uns["rank_genes_groups"]
    groups = list(ours.obs["leiden_1.0"].cat.categories)
    assert list(reference["names"].dtype.names) == groups
    assert list(markers["group"].unique()) == groups
    for group in groups:
        table = markers[markers["group"] == group]
        top = list(reference["names"][group][:n_genes])
        assert table["gene"].tolist() == top, f"cluster {group}"
        for column in ("scores", "logfoldchanges", "pvals", "pvals_adj"):
            np.testing.assert_allclose(
                table[column], reference[column][group][:n_genes], rtol=1e-6, err_msg=f"cluster {group}: {column}"
            )
        np.testing.assert_allclose(table["pct_nz_group"], reference["pts"].loc[top, group], rtol=1e-12)
        np.testing.assert_allclose(table["pct_nz_reference"], reference["pts_rest"].loc[top, group], rtol=1e-12)


def test_single_cluster_gives_an_empty_markers_table_with_the_usual_columns(mouse_clustered):
    adata, markers = mouse_clustered
    one = adata[:50].copy()
    del one.uns["rank_genes_groups"]
    one.obs["one"] = pd.Categorical(["0"] * one.n_obs)
    clustering.rank_markers(one, groupby="one", method="wilcoxon", backend="cpu")
    empty = clustering.markers_table(one, n_genes=5)
    assert empty.empty
    assert list(empty.columns) == list(markers.columns)


def test_clusters_of_one_cell_are_left_out_of_the_markers_and_the_others_ranked(mouse_clustered, caplog):
    """A very high resolution leaves clusters of one cell, which scanpy cannot test: the others
    are ranked against every other cell as usual.
    """
    adata, _ = mouse_clustered
    cells = adata[:200].copy()
    del cells.uns["rank_genes_groups"]
    groups = np.where(np.arange(cells.n_obs) < 100, "big", "other").astype(object)
    groups[:3] = ["alone_0", "alone_1", "alone_2"]
    cells.obs["groups"] = pd.Categorical(groups)
    with caplog.at_level("INFO", logger="omicsprep"):
        clustering.rank_markers(cells, groupby="groups", method="wilcoxon", backend="cpu")
    assert "markers: 3 clusters of one cell in groups left out" in caplog.text
    assert set(cells.uns["rank_genes_groups"]["names"].dtype.names) == {"big", "other"}
    table = clustering.markers_table(cells, n_genes=5)
    assert set(table["group"]) == {"big", "other"} and len(table) == 10


def test_logreg_markers_of_two_clusters_keep_their_group(mouse_clustered):
    """scanpy's logreg ranks one of two clusters and drops the group column: it is put back."""
    adata, _ = mouse_clustered
    cells = adata[:200].copy()
    del cells.uns["rank_genes_groups"]
    cells.obs["two"] = pd.Categorical(np.where(np.arange(cells.n_obs) < 100, "a", "b"))
    clustering.rank_markers(cells, groupby="two", method="logreg", backend="cpu")
    table = clustering.markers_table(cells, n_genes=5)
    assert list(table["group"].unique()) == [cells.uns["rank_genes_groups"]["names"].dtype.names[0]]
    assert len(table) == 5 and table["gene"].isin(cells.var_names).all()


def test_each_resolution_gives_its_own_clustering(mouse_clustered):
    """Leiden at 0.5 and 2 as scanpy clusters at those resolutions, Louvain as igraph's multilevel
    does: coarser below 1, finer above (a resolution not passed on would give 1.0's clusters)."""
    import random

    import igraph

    adata, _ = mouse_clustered
    again = adata.copy()
    clustering.cluster_graph(again, algorithm="leiden", resolutions=[0.5, 2.0], seed=0, backend="cpu")
    clustering.cluster_graph(again, algorithm="louvain", resolutions=[0.5, 2.0], seed=0, backend="cpu")
    edges = sparse_upper_edges(again.obsp["connectivities"])
    graph = igraph.Graph(n=again.n_obs, edges=edges[:, :2].astype(int).tolist(), edge_attrs={"weight": edges[:, 2]})
    counts = {}
    for resolution in (0.5, 2.0):
        peer = adata.copy()
        sc.tl.leiden(peer, resolution=resolution, flavor="igraph", n_iterations=-1, directed=False, random_state=0)
        assert adjusted_rand_score(again.obs[f"leiden_{resolution}"], peer.obs["leiden"]) == 1.0
        igraph.set_random_number_generator(random.Random(0))
        multilevel = graph.community_multilevel(weights="weight", resolution=resolution).membership
        assert adjusted_rand_score(again.obs[f"louvain_{resolution}"], multilevel) == 1.0
        counts[resolution] = [again.obs[f"{algorithm}_{resolution}"].nunique() for algorithm in ("leiden", "louvain")]
    one = [adata.obs["leiden_1.0"].nunique(), adata.obs["louvain_1.0"].nunique()]
    assert all(low < middle < high for low, middle, high in zip(counts[0.5], one, counts[2.0], strict=True)), counts


def sparse_upper_edges(adjacency) -> np.ndarray:
    """The upper triangle's edges of a symmetric sparse matrix: rows of (source, target, weight)."""
    from scipy import sparse

    upper = sparse.triu(adjacency, k=1).tocoo()
    return np.column_stack([upper.row, upper.col, upper.data])


def test_louvain_is_seeded(mouse_clustered):
    adata, _ = mouse_clustered
    again = adata.copy()
    clustering.cluster_graph(again, algorithm="louvain", resolutions=[1.0], seed=0, backend="cpu")
    assert (again.obs["louvain_1.0"] == adata.obs["louvain_1.0"]).all()
    assert list(again.obs["louvain_1.0"].value_counts().index[:1]) == ["0"]  # largest first


@pytest.mark.parametrize("algorithm", ["leiden", "louvain"])
@pytest.mark.parametrize("resolution", [1.0, 0.25, 2, 1e-3, 10.5])
def test_cluster_keys_parse_back_to_algorithm_and_resolution(algorithm, resolution):
    key = options.cluster_key(algorithm, resolution)
    assert options.parse_cluster_key(key) == (algorithm, float(resolution))


@pytest.mark.parametrize(
    "name", ["sample", "leiden", "leiden_", "leiden_x", "leiden_1", "wnn_leiden_1.0", "kmeans_1.0"]
)
def test_other_column_names_are_not_cluster_keys(name):
    assert options.parse_cluster_key(name) is None


def test_embedding_figure_of_many_cells_draws_a_random_share_and_labels_all():
    from omicsprep import plotting

    n = plotting.MAX_POINTS_SHOWN + 50_000
    rng = np.random.default_rng(1)
    # Two clusters far apart; the label of each sits at the median of all its cells.
    labels = np.repeat(["a", "b"], [n // 2, n - n // 2])
    coords = rng.normal(size=(n, 2)) + np.where(labels == "a", 0.0, 100.0)[:, None]
    obs = pd.DataFrame({"cluster": pd.Categorical(labels)}, index=[f"c{i}" for i in range(n)])
    fig = plotting.embedding_panels(coords, obs, keys=["cluster"], title="s")
    ax = fig.axes[0]
    assert sum(len(line.get_xdata()) for line in ax.lines) == plotting.MAX_POINTS_SHOWN
    for text in ax.texts:
        expected = np.median(coords[labels == text.get_text()], axis=0)
        np.testing.assert_allclose(text.get_position(), expected)
    assert fig.get_suptitle() == f"s ({plotting.MAX_POINTS_SHOWN:,} of {n:,} cells drawn)"
    # Fewer cells: every one drawn, the title as given.
    small = plotting.embedding_panels(coords[:1000], obs.iloc[:1000], keys=["cluster"], title="s")
    assert sum(len(line.get_xdata()) for line in small.axes[0].lines) == 1000
    assert small.get_suptitle() == "s"


def test_64_bit_indices_give_the_same_qc_and_clustering_on_the_cpu(pbmc):
    """The CPU backend takes a matrix beyond 2^31 entries as SciPy holds it (64-bit indices): QC,
    doublets, clustering and markers come out as with 32-bit indices."""
    doublets = options.DoubletOptions()
    results = {}
    for wide in (False, True):
        counts = pbmc.copy()
        if wide:
            counts.X = widened(counts.X)
        adata, metrics = run_qc(counts, options=QC_OPTIONS, doublet_options=doublets, seed=0, backend="cpu")
        if wide:
            adata.X = widened(adata.X)
        markers = run_clustering(adata, options=CLUSTER_OPTIONS, seed=0, backend="cpu")
        results[wide] = (adata, metrics, markers)
    (narrow, narrow_metrics, narrow_markers), (wide, wide_metrics, wide_markers) = results[False], results[True]
    pd.testing.assert_frame_equal(wide_metrics, narrow_metrics, check_dtype=False)
    pd.testing.assert_frame_equal(wide_markers, narrow_markers)
    assert abs(wide.X - narrow.X).max() == 0 and abs(wide.layers["counts"] - narrow.layers["counts"]).max() == 0
    np.testing.assert_array_equal(wide.obsm["X_umap"], narrow.obsm["X_umap"])
    pd.testing.assert_series_equal(wide.obs["leiden_1.0"], narrow.obs["leiden_1.0"])


def test_64_bit_indices_give_the_same_coexpression_and_merge_on_the_cpu(pbmc):
    """Rules coexpression and merge take inputs with 64-bit indices (an atlas sample's, as SciPy
    holds them) and find the same modules and integration metrics."""
    clustered, _ = run_qc(pbmc, options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
    run_clustering(clustered, options=CLUSTER_OPTIONS, seed=0, backend="cpu")
    results = {}
    for wide in (False, True):
        adata = clustered.copy()
        if wide:
            adata.X, adata.layers["counts"] = widened(adata.X), widened(adata.layers["counts"])
        network = run_coexpression(adata, options=options.CoexpressionOptions(), seed=0, backend="cpu")
        halves = {"first": adata[::2].copy(), "second": adata[1::2].copy()}
        settings = {"options": MERGE_OPTIONS, "clustering_options": CLUSTER_OPTIONS, "labels": "leiden_1.0"}
        metrics = run_merge(halves, **settings, seed=0, backend="cpu").metrics
        results[wide] = (network["modules"], metrics)
    pd.testing.assert_frame_equal(results[True][0], results[False][0])
    pd.testing.assert_frame_equal(results[True][1], results[False][1])


def test_fewer_components_than_asked_are_one_log_line_each(pbmc, caplog):
    adata, _ = run_qc(pbmc, options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
    wide = {"pca": options.PcaOptions(n_comps=5000), "neighbors": options.NeighborsOptions(n_pcs=5000)}
    many = replace(CLUSTER_OPTIONS, **wide)
    with caplog.at_level("INFO", logger="omicsprep"):
        run_clustering(adata, options=many, seed=0, backend="cpu")
    n_hvg = int(adata.var["highly_variable"].sum())
    lines = [record.getMessage() for record in caplog.records if "not the 5000 asked" in record.getMessage()]
    assert lines == [
        f"pca: {n_hvg - 1} components, not the 5000 asked: {adata.n_obs} cells, {n_hvg} variable genes",
        f"neighbors: {n_hvg - 1} components of X_pca, not the 5000 asked: it has {n_hvg - 1}",
    ]
    assert adata.obsm["X_pca"].shape[1] == n_hvg - 1
    record = adata.uns["omicsprep"]["cluster"]
    used = json.loads(record["params"])
    assert (used["pca"]["n_comps"], used["neighbors"]["n_pcs"]) == (n_hvg - 1, n_hvg - 1)
    assert json.loads(record["adapted"]) == {
        "pca.n_comps": {"asked": 5000, "used": n_hvg - 1},
        "neighbors.n_pcs": {"asked": 5000, "used": n_hvg - 1},
    }


SMALLEST_SAMPLE = yaml.safe_load(SCHEMA.read_text())["properties"]["qc"]["properties"]["min_cells_left"]["minimum"]


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("n_cells", [SMALLEST_SAMPLE, 40])
def test_the_smallest_samples_qc_lets_through_run_every_step(pbmc, n_cells, backend, caplog):
    """seurat_v3's loess fit fails on these few PBMCs: seurat's dispersion ranks the genes,
    and PCA and the neighbour graph take what the cells allow, each a log line and a record.
    """
    adata, _ = run_qc(pbmc, options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
    adata = adata[:n_cells].copy()
    with caplog.at_level("INFO", logger="omicsprep"):
        markers = run_clustering(adata, options=CLUSTER_OPTIONS, seed=0, backend=backend)
    assert any(r.getMessage().startswith(f"hvg: seurat_v3 failed on {n_cells} cells and") for r in caplog.records)
    adapted = json.loads(adata.uns["omicsprep"]["cluster"]["adapted"])
    assert adapted["hvg.flavor"] == {"asked": "seurat_v3", "used": "seurat"}
    assert adapted["pca.n_comps"]["used"] == adata.obsm["X_pca"].shape[1] < CLUSTER_OPTIONS.pca.n_comps
    asked_neighbors = CLUSTER_OPTIONS.neighbors.n_neighbors
    if n_cells <= asked_neighbors:
        assert adapted["neighbors.n_neighbors"] == {"asked": asked_neighbors, "used": n_cells - 1}
    assert np.isfinite(adata.obsm["X_umap"]).all()
    for resolution in CLUSTER_OPTIONS.leiden.resolutions:
        assert adata.obs[f"leiden_{resolution}"].notna().all()
    assert list(markers.columns) == list(clustering.markers_table(adata, n_genes=1).columns)
