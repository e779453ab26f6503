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
    barcodes = pd.Index(pd.read_csv(MULTIOME / "barcodes.tsv", header=None)[0])
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
