"""Modalities joined by barcode: the real Multiome cells, and barcodes that do not match."""

from __future__ import annotations

import mudata
import numpy as np
import pandas as pd
import pytest
from conftest import CITESEQ, MULTIOME, distinct_profiles, multiome_rna

from omicsprep import io
from omicsprep.atac.fragments import count_fragments
from omicsprep.atac.lsi import lsi, tfidf
from omicsprep.errors import InputError
from omicsprep.multiome.wnn import join_modalities


@pytest.fixture(scope="module")
def atac():
    barcodes = pd.Index(pd.read_csv(MULTIOME / "barcodes.tsv.gz", header=None)[0])
    return count_fragments(
        io.fragment_chunks(MULTIOME / "fragments.tsv.gz"),
        barcodes=barcodes,
        peaks=io.read_peaks(MULTIOME / "peaks.bed"),
    )


def test_join_keeps_the_common_cells(atac):
    half = atac[::2].copy()  # a second modality with every other cell
    joined, overlap = join_modalities({"atac": atac, "protein": half}, min_overlap=0.4)
    assert overlap == {"atac": 0.5, "protein": 1.0}
    assert joined.n_obs == 500
    assert list(joined.mod) == ["atac", "protein"]
    assert list(joined["atac"].obs_names) == list(half.obs_names)


def test_join_keeps_the_first_modalitys_order_and_records_the_shares(atac):
    """The common cells in the first modality's order (not sorted); each modality's share, rounded to
    4 places, returned and in uns["overlap"]; a share exactly at min_overlap is enough."""
    backwards = atac[::-1][:999].copy()  # 999 cells in reverse order
    third = atac[::3].copy()  # 334 cells, 333 of them among the 999
    joined, overlap = join_modalities({"atac": backwards, "protein": third}, min_overlap=0.3)
    kept = set(third.obs_names)
    assert list(joined.obs_names) == [name for name in backwards.obs_names if name in kept]
    assert overlap == {"atac": 0.3333, "protein": 0.997} == joined.uns["overlap"]
    join_modalities({"atac": backwards, "protein": third}, min_overlap=0.3333)
    _, single = join_modalities({"atac": atac, "protein": atac[:1].copy()}, min_overlap=0)
    assert single == {"atac": 0.001, "protein": 1.0}  # a modality of one cell: all of it


def test_barcodes_that_do_not_overlap_are_refused(atac):
    protein = io.read_counts(CITESEQ / "cells", feature_type="Antibody Capture")
    shares = r"\(atac 0.0% of 1000, protein 0.0% of 2872\)"
    with pytest.raises(InputError, match=r"modalities share 0 cell barcodes " + shares):
        join_modalities({"atac": atac, "protein": protein}, min_overlap=0.5)


@pytest.fixture(scope="module")
def rna_and_atac(atac):
    """The Multiome cells' RNA (PCA) and ATAC (LSI of the peaks) embeddings, joined.

    Cells with fewer than 5 of the 45 genes are left out, and so are cells without fragments
    in peaks or whose peak counts are proportional to another cell's: identical
    embeddings make ties that neighbour searches break arbitrarily (and muon, which
    finds neighbours through non-zero stored distances, loses them).
    """
    rna = multiome_rna()
    atac = atac[distinct_profiles(atac)].copy()
    tfidf(atac, backend="cpu")
    lsi(atac, n_comps=20, backend="cpu")
    joined, _ = join_modalities({"rna": rna, "atac": atac}, min_overlap=0.5)
    return joined


def _exact_nearest_neighbors(X, n_neighbors, metric, metric_kwds, random_state, angular=False, low_memory=True):  # noqa: FBT002 - umap's signature
    """Exhaustive stand-in for umap's ``nearest_neighbors``, as muon calls it.

    Searches by muon's Jaccard-Euclidean width criterion, or by Euclidean distance, where
    umap would use NN-descent.
    """
    from scipy import sparse
    from scipy.spatial.distance import cdist
    from sklearn.neighbors import NearestNeighbors

    if not callable(metric):
        distances, indices = NearestNeighbors(n_neighbors=n_neighbors).fit(X).kneighbors(X)
        return indices, distances, None
    kw = metric_kwds
    n = kw["N"]
    sets = sparse.csr_matrix(
        (np.ones_like(kw["neighbors_data"]), kw["neighbors_indices"], kw["neighbors_indptr"]), shape=(n, n)
    )
    shared = (sets @ sets.T).toarray()
    size = np.asarray(sets.sum(axis=1)).ravel()
    jaccard = shared / (size[:, None] + size[None, :] - shared)
    euclid = cdist(kw["X"], kw["X"])
    score = np.where(jaccard > 0, n * jaccard + (kw["bbox_norm"] - euclid) / kw["bbox_norm"], n + 1.0)
    np.fill_diagonal(score, np.inf)
    return np.argsort(score, axis=1, kind="stable")[:, :n_neighbors], None, None


def test_wnn_equals_muon_with_exhaustive_searches(rna_and_atac, monkeypatch):
    """With every neighbour search made exhaustive, muon's WNN and ours agree.

    Muon itself searches approximately (NN-descent; its kernel widths correlate 0.26 with an
    exhaustive search of its own criterion on these cells).
    """
    import muon
    import muon._core.preproc
    import scanpy as sc

    from omicsprep.multiome.wnn import weighted_nearest_neighbors

    ours = rna_and_atac.copy()
    weighted_nearest_neighbors(ours, representations={"rna": "X_pca", "atac": "X_lsi"}, n_neighbors=20, backend="cpu")
    reference = rna_and_atac.copy()
    for name, key in [("rna", "X_pca"), ("atac", "X_lsi")]:
        modality = reference.mod[name]
        modality.obsm[key] = modality.obsm[key] / np.linalg.norm(modality.obsm[key], axis=1, keepdims=True)
        sc.pp.neighbors(modality, use_rep=key, n_neighbors=20, transformer="sklearn")
    monkeypatch.setattr(muon._core.preproc, "nearest_neighbors", _exact_nearest_neighbors)
    muon.pp.neighbors(reference, n_neighbors=18)  # muon keeps n_neighbors + 1 others; ours 20 with the cell
    for name in ("rna", "atac"):
        np.testing.assert_allclose(ours.obs[f"{name}:mod_weight"], reference.obs[f"{name}:mod_weight"], atol=1e-4)
    ours_edges, muon_edges = ours.obsp["distances"] > 0, reference.obsp["distances"] > 0
    assert ours_edges.sum() == muon_edges.sum() == 19 * ours.n_obs
    assert ours_edges.multiply(muon_edges).sum() >= 0.99 * ours_edges.sum()
    assert (ours.obsp["connectivities"] - ours.obsp["connectivities"].T).count_nonzero() == 0


def test_64_bit_indices_give_the_same_joint_results_and_file_on_the_cpu(rna_and_atac, tmp_path):
    # Rule multiome joins the modalities' embeddings; their matrices, with 64-bit indices beyond
    # 2^31 entries, are carried into the MuData file as they are.
    from conftest import embedding_options, shipped_config, widened

    from omicsprep.multiome.pipeline import run_multiome
    from omicsprep.options import MultiomeOptions, from_config

    config = shipped_config()
    results = []
    for widen in (True, False):
        modalities = {name: rna_and_atac.mod[name].copy() for name in ("rna", "atac")}
        modalities["atac"].obs.index.name = None  # the fixture's barcodes column, 0: not a name a file takes
        if widen:
            modalities["atac"].X = widened(modalities["atac"].X)  # the RNA's X is scaled, dense
        results.append(
            run_multiome(
                modalities,
                options=from_config(MultiomeOptions, config["multiome"]),
                embedding_options=embedding_options(config),
                seed=0,
                backend="cpu",
            )
        )
    wide, narrow = results
    assert wide.obs.filter(like="wnn_").equals(narrow.obs.filter(like="wnn_"))
    np.testing.assert_array_equal(wide.obsm["X_umap"], narrow.obsm["X_umap"])
    io.write_h5mu(wide, tmp_path / "wide.h5mu")
    back = mudata.read_h5mu(tmp_path / "wide.h5mu")
    assert (back.mod["atac"].X != wide.mod["atac"].X).nnz == 0


def test_run_multiome_passes_its_settings_on(rna_and_atac):
    """run_multiome's WNN is the one its settings ask for (RNA's PCs cut at neighbors.n_pcs, every
    WNN setting), its joint clusters are at each resolution asked, a seed repeats them, and its
    provenance names the rule, the settings with the seed, and the steps."""
    import json

    from omicsprep.multiome.pipeline import run_multiome
    from omicsprep.multiome.wnn import weighted_nearest_neighbors
    from omicsprep.options import EmbeddingOptions, LeidenOptions, MultiomeOptions, NeighborsOptions, WnnOptions

    options = MultiomeOptions(min_overlap=0.6, wnn=WnnOptions(n_neighbors=12, n_bandwidth_neighbors=8, n_candidates=20))
    embedding = EmbeddingOptions(neighbors=NeighborsOptions(n_pcs=10), leiden=LeidenOptions(resolutions=(0.4, 1.2)))
    expected = rna_and_atac.copy()
    weighted_nearest_neighbors(
        expected,
        representations={"rna": "X_pca", "atac": "X_lsi"},
        n_dims={"rna": 10},
        n_neighbors=12,
        n_bandwidth_neighbors=8,
        n_candidates=20,
        backend="cpu",
    )
    runs = []
    for _ in range(2):
        modalities = {name: rna_and_atac.mod[name].copy() for name in ("rna", "atac")}
        runs.append(run_multiome(modalities, options=options, embedding_options=embedding, seed=5, backend="cpu"))
    mdata, again = runs
    assert (mdata.obsp["connectivities"] != expected.obsp["connectivities"]).nnz == 0
    np.testing.assert_array_equal(mdata.obs["rna:mod_weight"], expected.obs["rna:mod_weight"])
    assert list(mdata.obs.filter(like="wnn_").columns) == ["wnn_leiden_0.4", "wnn_leiden_1.2"]
    assert mdata.obs["wnn_leiden_0.4"].nunique() < mdata.obs["wnn_leiden_1.2"].nunique()
    assert mdata.obs.filter(like="wnn_").equals(again.obs.filter(like="wnn_"))
    np.testing.assert_array_equal(mdata.obsm["X_umap"], again.obsm["X_umap"])
    provenance = mdata.uns["omicsprep"]["multiome"]
    assert provenance["backend"] == "cpu"
    params = json.loads(provenance["params"])
    assert params == {
        "min_overlap": 0.6,
        "wnn": {"n_neighbors": 12, "n_bandwidth_neighbors": 8, "n_candidates": 20},
        "seed": 5,
    }
    assert {"wnn", "umap", "leiden"} <= set(provenance["timings"])


def _reference_kernel_width(embedding: np.ndarray, neighbors: np.ndarray, n_bandwidth: int) -> np.ndarray:
    """WNN's kernel width cell by cell, as its definition reads (slow)."""
    n_cells, k = neighbors.shape
    sets = [set(row) for row in neighbors]
    widths = np.zeros(n_cells)
    for cell in range(n_cells):
        scored = []
        for other in range(n_cells):
            shared = len(sets[cell] & sets[other])
            if other != cell and shared > 0:
                jaccard = shared / (2 * k - shared)
                scored.append((jaccard, -np.linalg.norm(embedding[cell] - embedding[other]), other))
        chosen = sorted(scored)[:n_bandwidth]
        widths[cell] = -np.mean([distance for _, distance, _ in chosen]) if chosen else 0.0
    return widths


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_kernel_width_is_the_mean_distance_to_the_least_overlapping_neighbour_sets(k):
    """Each cell's kernel width: the mean distance to the n cells whose k-neighbour sets share the
    fewest (but some) members with its own by Jaccard index, farther first among equals; a cell
    whose set overlaps no other's (the last, apart) has width 0."""
    from omicsprep.multiome.wnn import _kernel_width, _unit_rows

    rng = np.random.default_rng(k)
    embedding = _unit_rows(rng.normal(size=(61, 5)).astype(np.float32), xp=np)
    # Sets of k among cells 0-56; the last cell's set, among cells 57-59, is in nobody else's.
    neighbors = np.array([rng.choice(np.setdiff1d(np.arange(57), [cell]), k, replace=False) for cell in range(60)])
    neighbors = np.vstack([neighbors, np.arange(57, 57 + k)])
    for n_bandwidth in (1, 3, 10):
        ours = _kernel_width(embedding, neighbors, n_bandwidth, xp=np)
        assert ours.shape == (61,) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, _reference_kernel_width(embedding, neighbors, n_bandwidth), atol=1e-6)
        assert ours[-1] == 0


def test_wnn_stores_its_graph_as_scanpy_stores_neighbours():
    """obsp distances (k joint neighbours per row, float32, cells x cells even where the last cell
    is nobody's neighbour) and UMAP connectivities as scanpy computes them from those distances;
    uns["neighbors"] names them, with the neighbours per cell (the cell included) and the UMAP
    method, so scanpy's UMAP and Leiden find them."""
    import anndata
    from scanpy.neighbors._connectivity import umap as umap_connectivities

    from omicsprep.multiome.wnn import weighted_nearest_neighbors

    rng = np.random.default_rng(1)
    n_cells = 80
    # Rows are scaled to unit length: the last cell is apart along a dimension of its own.
    rna, atac = np.zeros((n_cells, 7)), np.zeros((n_cells, 5))
    rna[:-1, :-1], atac[:-1, :-1] = rng.normal(size=(n_cells - 1, 6)), rng.normal(size=(n_cells - 1, 4))
    rna[-1, -1] = atac[-1, -1] = 1
    mdata = mudata.MuData(
        {
            name: anndata.AnnData(np.zeros((n_cells, 1)), obsm={"X": values})
            for name, values in {"rna": rna, "atac": atac}.items()
        }
    )
    weighted_nearest_neighbors(mdata, representations={"rna": "X", "atac": "X"}, n_neighbors=6, backend="cpu")
    distances = mdata.obsp["distances"]
    assert distances.shape == (n_cells, n_cells) and distances.dtype == np.float32
    assert (np.diff(distances.indptr) == 5).all() and distances[:, -1].nnz == 0
    assert distances.data.max() <= np.sqrt(0.5) + 1e-6  # sqrt((1 - similarity) / 2), similarity in [0, 1]
    indices = distances.indices.reshape(n_cells, 5)
    knn_dists = distances.data.reshape(n_cells, 5)
    expected = umap_connectivities(
        np.hstack([np.arange(n_cells)[:, None], indices]),
        np.hstack([np.zeros((n_cells, 1), np.float32), knn_dists]),
        n_obs=n_cells,
        n_neighbors=6,
    )
    np.testing.assert_allclose(mdata.obsp["connectivities"].toarray(), expected.toarray(), rtol=1e-6, atol=1e-7)
    assert mdata.uns["neighbors"] == {
        "connectivities_key": "connectivities",
        "distances_key": "distances",
        "params": {"n_neighbors": 6, "method": "umap", "metric": "euclidean", "use_rep": "X_wnn_input"},
    }


def wnn_sample(**embeddings: np.ndarray) -> mudata.MuData:
    """A MuData of modalities holding only an embedding each (obsm["X"])."""
    import anndata

    return mudata.MuData(
        {name: anndata.AnnData(np.zeros((len(values), 1)), obsm={"X": values}) for name, values in embeddings.items()}
    )


def test_unit_rows_are_of_length_one_and_zero_rows_stay_zero():
    from omicsprep.multiome.wnn import _unit_rows

    values = np.array([[0.03, 0.04], [0, 0], [3, 4]], dtype=np.float32)
    np.testing.assert_allclose(_unit_rows(values, xp=np), [[0.6, 0.8], [0, 0], [0.6, 0.8]], rtol=1e-6)


def test_wnn_needs_two_modalities_and_three_cells():
    """Three cells are enough (each has the other two as neighbours); two cells, or one modality, are refused."""
    from omicsprep.multiome.wnn import weighted_nearest_neighbors

    rng = np.random.default_rng(0)
    three = wnn_sample(rna=rng.normal(size=(3, 4)), atac=rng.normal(size=(3, 3)))
    weighted_nearest_neighbors(three, representations={"rna": "X", "atac": "X"}, backend="cpu")
    distances = three.obsp["distances"].toarray()
    assert ((distances > 0) == ~np.eye(3, dtype=bool)).all()
    two = wnn_sample(rna=rng.normal(size=(2, 4)), atac=rng.normal(size=(2, 3)))
    with pytest.raises(InputError, match=r"3 cells or more \(got \['rna', 'atac'\], 2 cells\)"):
        weighted_nearest_neighbors(two, representations={"rna": "X", "atac": "X"}, backend="cpu")
    with pytest.raises(InputError, match=r"two modalities or more .*\(got \['rna'\], 10 cells\)"):
        weighted_nearest_neighbors(
            wnn_sample(rna=rng.normal(size=(10, 4))), representations={"rna": "X"}, backend="cpu"
        )


def test_wnn_of_a_sample_smaller_than_its_neighbourhoods_joins_every_other_cell():
    """Ten cells with 20 neighbours asked: each cell's joint neighbours are the nine others."""
    from omicsprep.multiome.wnn import weighted_nearest_neighbors

    rng = np.random.default_rng(1)
    cells = wnn_sample(rna=rng.normal(size=(10, 4)), atac=rng.normal(size=(10, 3)))
    weighted_nearest_neighbors(cells, representations={"rna": "X", "atac": "X"}, n_neighbors=20, backend="cpu")
    distances = cells.obsp["distances"].toarray()
    assert ((distances > 0) == ~np.eye(10, dtype=bool)).all()
    assert cells.uns["neighbors"]["params"]["n_neighbors"] == 10


def test_wnn_weights_the_modality_that_separates_the_cells():
    """RNA in four tight clusters, ATAC noise: every cell's RNA weight is near 1 and the weights are
    finite, though the noise's affinity ratios reach 1/eps (a softmax shifted by its row maximum)."""
    from omicsprep.multiome.wnn import weighted_nearest_neighbors

    rng = np.random.default_rng(2)
    centres = rng.normal(size=(4, 5)) * 10
    rna = np.repeat(centres, 25, axis=0) + rng.normal(scale=0.01, size=(100, 5))
    cells = wnn_sample(rna=rna, atac=rng.normal(size=(100, 5)))
    weighted_nearest_neighbors(cells, representations={"rna": "X", "atac": "X"}, n_neighbors=10, backend="cpu")
    weights = cells.obs[["rna:mod_weight", "atac:mod_weight"]].to_numpy()
    assert np.isfinite(weights).all() and weights.dtype == np.float32
    np.testing.assert_allclose(weights.sum(axis=1), 1, rtol=1e-5)
    assert weights[:, 0].min() > 0.9
    assert cells.obsm["X_wnn_input"].dtype == np.float32


def test_wnn_uses_the_leading_dimensions_asked():
    """n_dims: the RNA's first two dimensions only, as if the embedding had only those."""
    from omicsprep.multiome.wnn import weighted_nearest_neighbors

    rng = np.random.default_rng(3)
    rna, atac = rng.normal(size=(60, 6)), rng.normal(size=(60, 4))
    truncated, leading = wnn_sample(rna=rna[:, :2], atac=atac), wnn_sample(rna=rna, atac=atac)
    weighted_nearest_neighbors(truncated, representations={"rna": "X", "atac": "X"}, n_neighbors=8, backend="cpu")
    weighted_nearest_neighbors(
        leading, representations={"rna": "X", "atac": "X"}, n_dims={"rna": 2}, n_neighbors=8, backend="cpu"
    )
    assert (leading.obsp["distances"] != truncated.obsp["distances"]).nnz == 0
    np.testing.assert_array_equal(leading.obs["rna:mod_weight"], truncated.obs["rna:mod_weight"])


def test_wnn_with_one_neighbour_per_cell():
    """n_neighbors 2 (the cell and one other): one joint neighbour per row, not the cell itself."""
    from omicsprep.multiome.wnn import weighted_nearest_neighbors

    rng = np.random.default_rng(4)
    cells = wnn_sample(rna=rng.normal(size=(20, 4)), atac=rng.normal(size=(20, 3)))
    weighted_nearest_neighbors(cells, representations={"rna": "X", "atac": "X"}, n_neighbors=2, backend="cpu")
    distances = cells.obsp["distances"]
    assert distances.shape == (20, 20) and (np.diff(distances.indptr) == 1).all()
    assert (distances.indices != np.arange(20)).all()


def test_a_cell_is_never_its_own_nearest_neighbour_even_beside_an_identical_twin():
    """Identical cells tie at distance 0 and the search may list the twin before the cell itself:
    the cell is dropped wherever it stands, and its twin kept."""
    from omicsprep.multiome.wnn import _nearest, _unit_rows

    rng = np.random.default_rng(5)
    points = rng.normal(size=(30, 4)).astype(np.float32)
    points[1::2] = points[::2]  # cells 2i and 2i + 1 are twins
    indices, distances = _nearest(_unit_rows(points, xp=np), 3, backend="cpu")
    assert indices.shape == (30, 3)
    assert (indices != np.arange(30)[:, None]).all()
    twins = np.arange(30) ^ 1
    assert (indices[:, 0] == twins).all() and (distances[:, 0] == 0).all()
