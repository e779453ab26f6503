"""scIB's metrics of the merge (omicsprep.rna.integration_scores) against scib-metrics' own.

On the generated study of ``test_atlas.py`` (:func:`omicsprep.testing.study.generate_study`: three
batches with 12 planted types, the last lacking one and its labels held out), merged with PCA and
Harmony only: the metrics take any embedding, and this merge takes a quarter of the time of one
that trains scVI and scANVI, which ``test_atlas.py`` does. Kept apart so that the mutation run of
these metrics (``tests/mutation/mutate.py scib``) runs these tests alone.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import scipy.sparse
from conftest import ATLAS_OPTIONS, CLUSTER_OPTIONS

from omicsprep.rna import integration_scores
from omicsprep.rna.latent import UNLABELLED, known_labels
from omicsprep.rna.pipeline import run_merge
from omicsprep.testing.scib_reference import scib_metrics_own, stationary_eigenvalues_as_one

OPTIONS = replace(
    ATLAS_OPTIONS, integration=replace(ATLAS_OPTIONS.integration, methods=("pca", "harmony"), use="harmony")
)
METHODS = OPTIONS.integration.methods


@pytest.fixture(scope="module")
def integrated(generated_study):
    """The study merged with PCA and Harmony, scIB's metrics of both in ``metrics``."""
    return run_merge(
        generated_study, options=OPTIONS, clustering_options=CLUSTER_OPTIONS, labels="leiden_1.0", seed=0, backend="cpu"
    )


def test_scib_metrics_are_scib_metrics_own_benchmark(integrated):
    """Ours against scib-metrics' Benchmarker on the same cells, given exact neighbours by brute force.

    (With its default approximate search, pynndescent, kBET differed from ours by up to 0.006 here.)
    """
    from anndata import AnnData

    cells = integrated.cells
    known = (known_labels(cells.obs["known_type"]) != UNLABELLED).to_numpy()
    theirs = AnnData(
        obs=cells.obs.loc[known, ["sample", "known_type"]].astype(str),
        obsm={f"X_{method}": np.asarray(cells.obsm[f"X_{method}"])[known] for method in METHODS},
    )
    embeddings = [f"X_{method}" for method in METHODS]
    expected = scib_metrics_own(theirs, batch_key="sample", label_key="known_type", embeddings=embeddings)
    ours = integrated.metrics.set_index("embedding")[expected.columns]
    pd.testing.assert_frame_equal(ours, expected, check_names=False, atol=1e-3, rtol=0)


def test_scibs_garbage_collections_walk_only_the_objects_made_while_it_runs():
    """scib-metrics collects before each metric: the process's older objects are frozen meanwhile,
    new garbage is still collected, and everything is unfrozen after, even on an error."""
    import gc
    import weakref

    class Node:
        pass

    with pytest.raises(RuntimeError, match="stop"), integration_scores._collecting_new_objects_only():
        assert gc.get_freeze_count() > 1000
        cycle = Node()
        cycle.itself = cycle
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
        raise RuntimeError("stop")
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize(("metric", "between"), [("euclidean", "nearest"), ("cosine", "mean_other")])
def test_silhouettes_from_matrix_products_are_scib_metrics_own(integrated, metric, between):
    """Each cell's silhouette as scib-metrics computes it: against the nearest other label (label
    silhouette, isolated labels), and in cosine distance against all other batches (BRAS), a
    label of one cell (silhouette 0) among them."""
    from scib_metrics.utils import silhouette_samples

    points = np.asarray(integrated.cells.obsm["X_harmony"], dtype=np.float32)
    labels = integrated.cells.obs["cell_type"].astype(str).to_numpy()
    labels[0] = "alone"
    expected = silhouette_samples(points, labels, metric=metric, between_cluster_distances=between)
    ours = integration_scores.silhouette_samples(
        points, labels, metric=metric, between_cluster_distances=between, backend="cpu"
    )
    assert ours[0] == expected[0] == 0
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5)


def run_under_cuda_simulator(script: str) -> None:
    """Run ``script`` under Numba's CUDA simulator (set before numba.cuda is imported, hence a
    subprocess); it prints ``ok`` when its checks pass."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
        check=False,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


SILHOUETTE_KERNEL_SCRIPT = """
import numpy as np
from omicsprep.rna import integration_scores, pairs_cuda
pairs_cuda.CELLS_PER_CHUNK = 64  # several chunks, labels changing inside them
pairs_cuda.THREADS_PER_BLOCK = 16  # several blocks, the last one's threads holding fewer cells
rng = np.random.default_rng(0)
# 7 coordinates: 4 cells a thread; 70: one.
for n_cells, n_dims in ((200, 7), (90, 70)):
    points = rng.normal(size=(n_cells, n_dims)).astype(np.float32)
    codes = rng.integers(0, 4, n_cells)
    for cosine in (False, True):
        if cosine:
            points /= np.sqrt((points * points).sum(axis=1, keepdims=True))
        kernel = pairs_cuda.pair_sums_gpu(points, codes, 5, cosine=cosine, xp=np).sums
        # In float64: float32's |x|^2 + |y|^2 - 2xy loses more digits than the kernel's differences.
        # The kernel is 7e-8 from them; a distance missed or added twice moves a sum by 1e-2 or more.
        products = integration_scores.label_distance_sums(points.astype(np.float64), codes, 5, cosine=cosine, xp=np)
        assert kernel.shape == (n_cells, 5) and not kernel[:, 4].any()
        np.testing.assert_allclose(kernel, products, rtol=1e-6)
print("ok")
"""


def test_the_silhouette_kernel_sums_distances_per_label_as_the_matrix_products():
    """The GPU's kernel (each cell's distances summed per label without writing them) gives the
    CPU's sums, Euclidean and cosine, over chunks of cells where labels change mid-chunk, with
    threads holding four cells (the last block's partly past the last cell) or one."""
    run_under_cuda_simulator(SILHOUETTE_KERNEL_SCRIPT)


NEIGHBOUR_CANDIDATES_SCRIPT = """
import types
import numpy as np
from sklearn.neighbors import NearestNeighbors
from omicsprep.rna import integration_scores, neighbors_cuda, pairs_cuda
from omicsprep.rna.embedding import exact_neighbors, nearest_by_exact_distances
pairs_cuda.THREADS_PER_BLOCK = 4  # 8 cells a thread: 3 blocks, the last one's threads partly past the last cell
pairs_cuda.CELLS_PER_CHUNK = 16  # 6 chunks of other cells, the last one shorter, labels changing inside them
neighbors_cuda.MAX_CANDIDATES = 40
neighbors_cuda.BRUTE_FORCE_BOUND_MAX_CELLS = 0  # the bounds from the IVF-Flat stand-in, below
neighbors_cuda.PRODUCT_BLOCK_BYTES = 4 * 60 * 7  # products of the wide embedding in blocks of 7 rows
neighbors_cuda.KEEP_THREADS_PER_BLOCK = 16  # 4 blocks a row of 60 products, the last one's threads partly past it
k, asked = 10, []


class Search:  # cuML's NearestNeighbors; its IVF-Flat search misses cells for the odd cells
    def __init__(self, n_neighbors, algorithm, algo_params=None):
        self.n_neighbors, self.algorithm = n_neighbors, algorithm

    def fit(self, points):
        self.points = points
        return self

    def kneighbors(self, queries, return_distance):
        asked.append((self.algorithm, len(queries)))
        found = NearestNeighbors(n_neighbors=k).fit(self.points).kneighbors(queries)[1]
        if self.algorithm == "ivfflat":  # the even cells' search exact: their bound is the k-th distance
            among = np.arange(0, len(self.points), 3)  # the odd cells': among every third cell only
            found[1::2] = among[NearestNeighbors(n_neighbors=k).fit(self.points[among]).kneighbors(queries[1::2])[1]]
            found[0], found[2, 1:] = -1, found[2, 0]  # cell 0: nothing found; cell 2: one cell, repeated
        return found


rng = np.random.default_rng(0)
points = (rng.normal(size=(90, 8)) + 50).astype(np.float32)
points[6] = points[5]  # a tie, ordered by index
codes = rng.integers(0, 3, 90)
candidates, sums = neighbors_cuda.neighbour_candidates(
    points, k, xp=np, cuml=types.SimpleNamespace(neighbors=types.SimpleNamespace(NearestNeighbors=Search)),
    codes=codes, n_labels=3,
)
expected = exact_neighbors(points, k, backend="cpu")
assert all(np.isin(nearest, row).all() for nearest, row in zip(expected[0], candidates))
# An even cell's bound is its k-th distance: its k nearest are its candidates, none missed to
# float32's rounding; an odd cell's holds more. By brute force: cells 0 and 2, and a cell of 40 or more.
kept = (candidates >= 0).sum(axis=1)
assert (kept[::2] == k).all() and (kept[1::2] >= k).all() and kept[1::2].mean() > 2 * k
assert asked == [("ivfflat", 90), ("brute", 3)]
ours = nearest_by_exact_distances(points, candidates, k, xp=np)
np.testing.assert_array_equal(ours[0], expected[0])
np.testing.assert_array_equal(ours[1], expected[1])
assert list(expected[0][5][:2]) == [5, 6] and list(expected[0][6][:2]) == [5, 6]
# The same pass summed each cell's distances per label, in the cells' order.
products = integration_scores.label_distance_sums(points.astype(np.float64), codes, 3, cosine=False, xp=np)
np.testing.assert_allclose(sums, products, rtol=1e-5)
stand_in = types.SimpleNamespace(neighbors=types.SimpleNamespace(NearestNeighbors=Search))
# Wider than the pass's registers: the cells within the bound from matrix products, no sums.
wide = (rng.normal(size=(60, pairs_cuda.MAX_DIMS + 1)) + 50).astype(np.float32)
asked.clear()
candidates, sums = neighbors_cuda.neighbour_candidates(wide, k, xp=np, cuml=stand_in)
assert asked[0] == ("ivfflat", 60) and sums is None and ((candidates >= 0).sum(axis=1)[::2] == k).all()
wide_nearest = nearest_by_exact_distances(wide, candidates, k, xp=np)
for ours, cpu in zip(wide_nearest, exact_neighbors(wide, k, backend="cpu")):
    np.testing.assert_array_equal(ours, cpu)
# Bounds at each cell's exact k-th distance: the products keep its k nearest, float32's rounding allowed for.
squared = ((wide[:, None, :].astype(np.float64) - wide[None, :, :]) ** 2).sum(axis=2)
counts, kept_by_products = neighbors_cuda._within_bounds_by_products(wide, np.sort(squared, axis=1)[:, k - 1], xp=np)
assert (counts >= k).all()
assert all(np.isin(nearest, row).all() for nearest, row in zip(wide_nearest[0], kept_by_products))
# Without sums wanted, 65 dimensions take the products too; with labels, the pass and its sums.
mid = (rng.normal(size=(60, neighbors_cuda.PASS_MAX_DIMS_WITHOUT_SUMS + 1)) + 50).astype(np.float32)
candidates, sums = neighbors_cuda.neighbour_candidates(mid, k, xp=np, cuml=stand_in)
assert sums is None
mid_nearest = exact_neighbors(mid, k, backend="cpu")[0]
np.testing.assert_array_equal(nearest_by_exact_distances(mid, candidates, k, xp=np)[0], mid_nearest)
candidates, sums = neighbors_cuda.neighbour_candidates(mid, k, xp=np, cuml=stand_in, codes=codes[:60], n_labels=3)
assert sums.shape == (60, 3)
np.testing.assert_array_equal(nearest_by_exact_distances(mid, candidates, k, xp=np)[0], mid_nearest)
# float64 coordinates, two dense clusters far apart: the pass reads them centred and rounded to
# float32, which moves distances by more than their own rounding; the limits allow for it.
dense = np.concatenate([100 + 1e-3 * rng.normal(size=(150, 8)), -100 + 1e-3 * rng.normal(size=(150, 8))])
candidates, _ = neighbors_cuda.neighbour_candidates(dense, k, xp=np, cuml=stand_in)
# (scikit-learn's float64 |x|^2 + |y|^2 - 2xy would blur these: compared with the differences' order.)
exact = np.argsort(((dense[:, None, :] - dense[None, :, :]) ** 2).sum(axis=2), axis=1, kind="stable")[:, :k]
np.testing.assert_array_equal(nearest_by_exact_distances(dense, candidates, k, xp=np)[0], exact)
# Few cells: their bounds from the brute force, each cell's exact k-th distance, so k candidates a cell.
neighbors_cuda.BRUTE_FORCE_BOUND_MAX_CELLS = 90
asked.clear()
candidates, _ = neighbors_cuda.neighbour_candidates(points, k, xp=np, cuml=stand_in, codes=codes, n_labels=3)
assert asked == [("brute", 90)] and ((candidates >= 0).sum(axis=1) == k).all()
np.testing.assert_array_equal(nearest_by_exact_distances(points, candidates, k, xp=np)[0], expected[0])
print("ok")
"""


def test_the_gpu_neighbour_candidates_hold_every_exact_neighbour():
    """The GPU's candidates (cells within a bound from an approximate search, kept by the pass over
    all pairs) hold each cell's exact nearest though the search found only every other cell; a cell
    without a bound, or with too many candidates, is searched by brute force, and every cell of an
    embedding wider than the pass takes; ordered by exact distances, ties by index, they are the
    CPU's neighbours; the pass's sums per label are the matrix products'."""
    run_under_cuda_simulator(NEIGHBOUR_CANDIDATES_SCRIPT)


def test_a_silhouette_asked_again_is_computed_once(integrated, monkeypatch):
    """Isolated labels and the label silhouette ask for the same silhouettes (the second with
    scib-metrics' defaults spelled out): one pass; other labels or another metric: a pass each;
    silhouettes given for an embedding (the GPU's neighbour search's) are its, for those labels,
    and stay; of those computed, the last only."""
    computed = []
    compute = integration_scores.silhouette_samples

    @functools.wraps(compute)
    def counted(*args, **kwargs):
        computed.append(args[1])
        return compute(*args, **kwargs)

    monkeypatch.setattr(integration_scores, "silhouette_samples", counted)
    silhouettes = integration_scores.SilhouetteMemory("cpu")
    points = np.asarray(integrated.cells.obsm["X_harmony"], dtype=np.float32)
    types, samples = (integrated.cells.obs[key].astype(str).to_numpy() for key in ("cell_type", "sample"))
    first = silhouettes(points, types)
    first[:] = 2  # what a caller does to its copy stays there
    again = silhouettes(points, types, chunk_size=256, metric="euclidean")
    by_sample = silhouettes(points, samples)
    cosine = silhouettes(points, types, metric="cosine")
    assert [labels is samples for labels in computed] == [False, True, False]
    np.testing.assert_array_equal(again, compute(points, types, backend="cpu"))
    assert not np.array_equal(again, by_sample) and not np.array_equal(again, cosine)
    # Given by the GPU's neighbour search: kept for that array (by identity) and those labels only,
    # for good; of what it computed, the last only (the cosine one here).
    given, same_values = np.full(len(points), 0.5, dtype=np.float32), points.copy()
    silhouettes.remember(same_values, types, given)
    np.testing.assert_array_equal(silhouettes(same_values, types), given)
    assert len(computed) == 3
    np.testing.assert_array_equal(silhouettes(points, types), again)
    silhouettes(same_values, samples)
    assert len(computed) == 5
    np.testing.assert_array_equal(silhouettes(same_values, types), given)
    assert len(computed) == 5


def test_kmeans_clusters_are_scib_metrics_own(integrated):
    """scib-metrics' k-means (its start, at least 300 Lloyd steps) compiled once, its centroids from
    a matrix product: the same clusters as its own on each embedding, cell for cell."""
    from scib_metrics.utils import KMeans

    n_types = integrated.cells.obs["cell_type"].nunique()
    for key in ("X_pca", "X_harmony"):
        points = np.asarray(integrated.cells.obsm[key], dtype=np.float32)
        theirs = np.asarray(KMeans(n_types).fit(points.copy()).labels_)
        assert len(np.unique(theirs)) == n_types
        np.testing.assert_array_equal(integration_scores.kmeans_labels(points, n_types), theirs)


def test_diffusion_neighbours_are_scib_metrics_own_and_give_its_kbet(integrated):
    """kBET's neighbours in one label's diffusion map: the exact search finds pynndescent's, and our
    chi-square test of them gives scib-metrics' statistics, p-values and acceptance."""
    from scib_metrics.metrics import kbet
    from scib_metrics.utils import diffusion_nn

    cells = integrated.cells
    graph = integration_scores.scib_neighbors(np.asarray(cells.obsm["X_pca"]), 50, backend="cpu")
    of_type = (cells.obs["cell_type"] == "type01").to_numpy()
    subgraph = scipy.sparse.csr_matrix(graph.knn_graph_connectivities)[of_type][:, of_type]
    subgraph.sort_indices()
    with stationary_eigenvalues_as_one():
        expected = diffusion_nn(subgraph, k=20, n_comps=100)
    ours = integration_scores.diffusion_neighbors(subgraph, k=20, n_comps=100, backend="cpu")
    assert ours.indices.shape == expected.indices.shape == (of_type.sum(), 21)
    pairs = zip(ours.indices, expected.indices, strict=True)
    assert np.mean([np.isin(mine, theirs).mean() for mine, theirs in pairs]) > 0.99
    batches = cells.obs.loc[of_type, "sample"].to_numpy()
    assert kbet(ours, batches)[0] == pytest.approx(kbet(expected, batches)[0], abs=1e-3)
    # Our test of a label's neighbours (NumPy: no compile per label size) is scib-metrics' JAX one,
    # here in Harmony's space, where the batches mix.
    mixed = integration_scores.scib_neighbors(np.asarray(cells.obsm["X_harmony"])[of_type], 30, backend="cpu")
    theirs, mine = kbet(mixed, batches), integration_scores.kbet(mixed, batches)
    assert 0 < mine[0] == theirs[0] < 1
    np.testing.assert_allclose(mine[1], theirs[1], rtol=1e-5)
    np.testing.assert_allclose(mine[2], theirs[2], atol=1e-6)


def test_kbet_does_not_follow_the_last_bits_of_its_graph(integrated):
    """A label's stationary eigenvalue, from transitions in the graph's float32, lands a few float32
    units off 1 or on it. scib-metrics keeps exactly 1 only: the vector off it, scaled by about 1e7,
    decided the label's kBET (type06 in the PCA space: 0.836 from the float32 graph, 0.008 from the
    same graph in float64), so cuML's graph (1e-6 from umap-learn's) moved the GPU's kBET by a whole
    label. Taken as 1 near it, kBET per label is the same from the graph in float32, in float64 and
    with 1e-6 relative noise."""
    cells = integrated.cells
    known = (known_labels(cells.obs["known_type"]) != UNLABELLED).to_numpy()
    labels, batches = cells.obs["known_type"].astype(str).to_numpy()[known], cells.obs["sample"].to_numpy()[known]
    neighbours = integration_scores.scib_neighbors(np.asarray(cells.obsm["X_pca"])[known], 90, backend="cpu")
    graph = neighbours.knn_graph_connectivities
    noisy = graph.astype(np.float64)
    noisy.data *= 1 + 1e-6 * np.random.default_rng(0).standard_normal(noisy.data.size)
    noisy = ((noisy + noisy.T) / 2).astype(np.float32)
    tables = [
        integration_scores.kbet_per_label(
            SimpleNamespace(knn_graph_connectivities=connectivities), batches, labels, return_df=True,
            backend="cpu",
        )[1]
        for connectivities in (graph, graph.astype(np.float64), noisy)
    ]  # fmt: skip
    assert tables[0]["kBET"].notna().sum() >= 10
    for table in tables[1:]:
        pd.testing.assert_frame_equal(table, tables[0])


def test_kbet_per_label_is_scib_metrics_loop(integrated, monkeypatch):
    """Our kBET per label takes each label's graph, components, k0 and diffusion components as
    scib-metrics' loop does: with the same search and test inside, the same score per label, in
    every branch: too few cells, one batch, two far types (two components, each kept), cells
    scattered in components too small to keep, and a label small enough to lower the diffusion
    components of the labels after it (scib-metrics keeps the lower number)."""
    from scib_metrics.metrics import _kbet

    cells = integrated.cells
    # Harmony's space, where the batches mix: kBET above 0.
    neighbours = integration_scores.scib_neighbors(np.asarray(cells.obsm["X_harmony"]), 50, backend="cpu")
    types, batches = cells.obs["cell_type"].astype(str).to_numpy(), cells.obs["sample"].to_numpy()
    rng = np.random.default_rng(0)
    labels = types.copy()
    labels[rng.choice(np.flatnonzero(types == "type02"), 80, replace=False)] = "a_small"
    labels[np.flatnonzero(types == "type03")[:5]] = "few"
    labels[(types == "type04") & (batches == "batch0")] = "one_batch"
    labels[np.isin(types, ["type05", "type06"])] = "two_types"
    for scattered in ("type08", "type09", "type10"):
        labels[rng.choice(np.flatnonzero(types == scattered), 12, replace=False)] = "scattered"
    ours, table = integration_scores.kbet_per_label(neighbours, batches, labels, return_df=True, backend="cpu")
    kbet_of = dict(zip(table["cluster"], table["kBET"], strict=True))
    assert np.isnan(kbet_of["few"]) and np.isnan(kbet_of["one_batch"])
    assert kbet_of["scattered"] == 0
    assert 0 < kbet_of["two_types"] < 1 and 0 < kbet_of["a_small"] <= 1
    monkeypatch.setattr(_kbet, "diffusion_nn", functools.partial(integration_scores.diffusion_neighbors, backend="cpu"))
    monkeypatch.setattr(_kbet, "kbet", integration_scores.kbet)
    theirs, their_table = _kbet.kbet_per_label(neighbours, batches, labels, return_df=True)
    pd.testing.assert_frame_equal(table, their_table)
    assert ours == theirs


def test_neighbours_found_for_the_gpu_take_kbets_graph_from_cuml_in_every_subset(integrated, monkeypatch):
    """On the GPU, scib-metrics' neighbours, and the 50 of them its Benchmarker hands kBET, build
    their connectivities with cuML (here a stand-in), never with umap-learn on the host."""
    asked = []

    def by_cuml(indices, distances):
        asked.append(indices.shape)
        return scipy.sparse.identity(indices.shape[0], format="csr")

    monkeypatch.setattr(integration_scores, "umap_connectivities_on_gpu", by_cuml)
    points = np.asarray(integrated.cells.obsm["X_pca"])
    found = integration_scores.exact_neighbors(points, 90, backend="cpu")
    for_kbet = integration_scores._neighbors_on_host(*found, backend="gpu").subset_neighbors(50)
    assert for_kbet.knn_graph_connectivities.nnz == len(points)
    assert asked == [(len(points), 50)]


def test_scib_needs_two_known_labels(integrated):
    cells = integrated.cells.copy()
    cells.obs["one_type"] = np.where(cells.obs["sample"] == "batch0", "T", "Unknown")
    with pytest.raises(ValueError, match=r"two known labels or more in obs\['one_type'\]"):
        integration_scores.scib_benchmarker(
            cells, embeddings=["X_pca"], batch_key="sample", label_key="one_type", backend="cpu"
        )
