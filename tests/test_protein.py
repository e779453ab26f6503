"""CITE-seq antibody tags on the dsb package's real data: QC, CLR and dsb against muon."""

from __future__ import annotations

import json
import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import CITESEQ

from omicsprep import io
from omicsprep.errors import InputError
from omicsprep.options import DsbOptions, EmbeddingOptions, ProteinOptions
from omicsprep.protein import normalization
from omicsprep.protein.pipeline import run_protein

ISOTYPE_PATTERN = ProteinOptions().isotype_pattern


@pytest.fixture(scope="module")
def cells():
    return io.read_counts(CITESEQ / "cells", feature_type="Antibody Capture")


@pytest.fixture(scope="module")
def empty():
    return io.read_counts(CITESEQ / "empty_droplets", feature_type="Antibody Capture")


def dense(matrix) -> np.ndarray:
    return matrix.toarray() if hasattr(matrix, "toarray") else np.asarray(matrix)


def test_reads_antibody_capture_and_finds_isotypes(cells, empty):
    assert cells.shape == (2872, 87)
    assert empty.shape == (8005, 87)
    assert len(normalization.isotype_controls(cells, pattern=ISOTYPE_PATTERN)) == 4
    with pytest.raises(InputError, match=re.escape("no 'Gene Expression' features (found: Antibody Capture)")):
        io.read_counts(CITESEQ / "cells")


def test_qc_metrics(cells):
    adata = cells.copy()
    isotypes = normalization.isotype_controls(adata, pattern=ISOTYPE_PATTERN)
    normalization.protein_qc(adata, isotypes=isotypes)
    counts = dense(cells.X)
    np.testing.assert_allclose(adata.obs["total_adt"], counts.sum(axis=1))
    # The panel's four isotype controls (IgA, IgD and IgM are real targets, not controls).
    is_isotype = cells.var_names.str.contains(ISOTYPE_PATTERN)
    assert cells.var_names[is_isotype].tolist() == [
        "MouseIgG1kappaisotype_PROT",
        "MouseIgG2akappaisotype_PROT",
        "Mouse IgG2bkIsotype_PROT",
        "RatIgG2bkIsotype_PROT",
    ]
    isotype_counts = counts[:, is_isotype].sum(axis=1)
    np.testing.assert_allclose(adata.obs["isotype_adt"], isotype_counts)
    np.testing.assert_allclose(adata.obs["pct_isotype"], 100 * isotype_counts / counts.sum(axis=1))
    assert 0 < adata.obs["pct_isotype"].median() < 5  # isotypes are a small share of real tags


def test_isotype_share_of_a_cell_with_one_tag_or_none():
    from anndata import AnnData

    adata = AnnData(np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 3.0]], dtype=np.float32))
    adata.var_names = ["IgG1_isotype", "CD3"]
    normalization.protein_qc(adata, isotypes=["IgG1_isotype"])
    assert adata.obs["pct_isotype"].tolist() == [100.0, 0.0, 25.0]


def test_the_technical_component_is_the_centred_first_pc_rising_with_the_cells_means():
    """dsb's technical component: first PC scores of the column-centred values (as scikit-learn's
    PCA gives them up to sign), signed to rise with each cell's mean, for data and its negation."""
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(0)
    shared = rng.normal(size=(300, 1))
    values = shared @ rng.normal(1.0, 0.3, size=(1, 4)) + rng.normal(0, 0.2, size=(300, 4)) + [0, 5, -3, 10]
    for data in (values, -values):
        scores = normalization._first_component(data, xp=np)
        expected = PCA(n_components=1).fit_transform(data)[:, 0]
        np.testing.assert_allclose(np.abs(scores), np.abs(expected), rtol=1e-8, atol=1e-8)
        assert np.corrcoef(scores, (data - data.mean(axis=0)).mean(axis=1))[0, 1] > 0
    # An eigenvector's sign is LAPACK's choice: the other one gives the same scores.
    negated = SimpleNamespace(eigh=lambda matrix: tuple(-part for part in np.linalg.eigh(matrix)))
    flipped = SimpleNamespace(**{**vars(np), "linalg": negated})
    # Integer values with whole column means: the centred values sum to exactly 0, so the sign
    # must come from each cell's own mean, not the mean of all.
    whole = np.array([[0.0, 0, 0], [2, 2, 1], [4, 3, 4], [6, 7, 7]])
    for data in (values, whole):
        scores = normalization._first_component(data, xp=flipped)
        np.testing.assert_array_equal(scores, normalization._first_component(data, xp=np))
    # Scale: values 1,000 times smaller give scores 1,000 times smaller, whichever sign LAPACK gives
    # the eigenvector (the sign test is against 0, whatever the scale).
    for module in (np, flipped):
        np.testing.assert_allclose(
            normalization._first_component(values / 1000, xp=module),
            normalization._first_component(values, xp=np) / 1000,
        )


def test_the_technical_component_rises_with_the_cells_means_in_small_noisy_panels():
    """Thirty cells x four antibodies, noisy, some cells' means near zero on either side: the
    scores still correlate positively with each cell's centred mean (their covariance decides
    the sign, not a ratio to the means)."""
    for seed in range(100, 130):
        rng = np.random.default_rng(seed)
        values = rng.normal(size=(30, 1)) @ rng.normal(1.0, 0.3, size=(1, 4)) + rng.normal(0, 0.5, size=(30, 4))
        scores = normalization._first_component(values, xp=np)
        assert np.corrcoef(scores, (values - values.mean(axis=0)).mean(axis=1))[0, 1] > 0, seed


def test_the_background_mixture_is_the_maximum_likelihood_fit():
    """dsb's per-cell two-component mixture reaches scikit-learn's maximum-likelihood fit from the
    same start (lower component's mean), and stays finite where every density underflows."""
    from sklearn.mixture import GaussianMixture

    rng = np.random.default_rng(2)
    values = np.concatenate([rng.normal(0, 0.5, size=(8, 60)), rng.normal(3, 1, size=(8, 27))], axis=1)
    low = normalization._two_component_low_means(values, xp=np, n_iterations=2000)
    for row, ours in zip(values, low, strict=True):
        ordered = np.sort(row)
        start = [[ordered[len(row) // 4]], [ordered[3 * len(row) // 4]]]
        mixture = GaussianMixture(2, means_init=start, weights_init=[0.5, 0.5], tol=1e-12, max_iter=5000)
        mixture.fit(row[:, None])
        assert ours == pytest.approx(mixture.means_.min(), abs=1e-6)
    # A value midway between two tight clusters of 10,000: over 700 log units below both
    # components' peaks, where only densities taken relative to their maximum stay finite.
    between = np.r_[np.zeros(10_000), np.ones(10_000), 0.5][None, :]
    assert normalization._two_component_low_means(between, xp=np)[0] == pytest.approx(0, abs=1e-4)


def test_the_background_mixture_scales_with_the_values_and_keeps_constant_cells():
    """dsb's per-cell mixture: values 1,000 times smaller give means 1,000 times smaller (the
    variance floor scales with them), and a cell whose values are all one value gets that value."""
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.normal(0, 0.5, size=(50, 60)), rng.normal(4, 1, size=(50, 27))], axis=1)
    values = np.vstack([values, np.full((1, 87), 2.5)])
    low = normalization._two_component_low_means(values, xp=np)
    np.testing.assert_allclose(normalization._two_component_low_means(values / 1000, xp=np), low / 1000, rtol=1e-6)
    assert low[-1] == pytest.approx(2.5)
    assert np.abs(low[:-1]).max() < 0.5  # the lower component is the one around 0


def test_clr_equals_muon(cells):
    from muon import prot

    ours, theirs = cells.copy(), cells.copy()
    normalization.clr(ours, backend="cpu")
    prot.pp.clr(theirs, axis=1)  # per cell, Seurat's margin = 2
    np.testing.assert_allclose(ours.X, dense(theirs.X), atol=1e-5)
    assert ours.X.dtype == np.float32  # as the RNA's log counts: half the memory of float64
    assert (dense(ours.layers["counts"]) == dense(cells.X)).all()
    dense_input = cells.copy()
    dense_input.X = dense(cells.X)  # an .h5ad may hold the tags dense
    normalization.clr(dense_input, backend="cpu")
    np.testing.assert_array_equal(dense_input.X, ours.X)


def test_dsb_agrees_with_muon(cells, empty):
    from muon import prot

    isotypes = normalization.isotype_controls(cells, pattern=ISOTYPE_PATTERN)
    plain_ours, plain_theirs = cells.copy(), cells.copy()
    normalization.dsb(plain_ours, empty=empty, isotypes=isotypes, denoise=False, backend="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prot.pp.dsb(plain_theirs, empty, denoise_counts=False)
    np.testing.assert_allclose(plain_ours.X, dense(plain_theirs.X), atol=1e-4)  # ambient scaling: exact

    ours, theirs = cells.copy(), cells.copy()
    normalization.dsb(ours, empty=empty, isotypes=isotypes, backend="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prot.pp.dsb(theirs, empty, isotype_controls=isotypes, random_state=0)
    theirs = dense(theirs.X)
    # Denoising fits per-cell mixtures: ours by one vectorized EM from quartiles, muon's by
    # scikit-learn from random starts with a BIC choice of variances. Stated tolerance:
    correlation = [np.corrcoef(ours.X[:, j], theirs[:, j])[0, 1] for j in range(ours.n_vars)]
    assert min(correlation) > 0.99
    assert np.abs(ours.X - theirs).mean() < 0.05
    assert ours.X.dtype == plain_ours.X.dtype == np.float32

    # The per-cell background and technical component in obs: the mixture's lower mean of each
    # cell's ambient-scaled values, and the first PC of the isotypes beside it.
    scaled = plain_ours.X.astype(np.float64)  # muon's, above (to float32's precision)
    background = normalization._two_component_low_means(scaled, xp=np)
    np.testing.assert_allclose(ours.obs["dsb_background"], background, rtol=1e-5, atol=1e-5)
    columns = [cells.var_names.get_loc(name) for name in isotypes]
    technical = normalization._first_component(np.column_stack([scaled[:, columns], background]), xp=np)
    np.testing.assert_allclose(ours.obs["dsb_technical"], technical, rtol=1e-4, atol=1e-4)


def test_dsb_refuses_mismatched_input(cells, empty):
    with pytest.raises(InputError, match="empty droplets lack 1 antibodies"):
        normalization.dsb(cells.copy(), empty=empty[:, 1:].copy(), isotypes=[], backend="cpu")
    with pytest.raises(InputError, match=r"isotype controls not among the antibodies: IgG_nope, IgG_too$"):
        normalization.dsb(cells.copy(), empty=empty, isotypes=["IgG_nope", "IgG_too"], backend="cpu")


def test_dsb_without_empty_droplets_is_one_clear_error(cells):
    options = ProteinOptions(normalization="dsb")
    with pytest.raises(InputError) as error:
        run_protein(
            cells.copy(), empty=None, options=options, embedding_options=EmbeddingOptions(), seed=0, backend="cpu"
        )
    assert str(error.value) == (
        "protein.normalization is dsb, which needs empty droplets (sample sheet column adt_empty)"
    )


def test_dsb_denoising_without_isotype_controls_is_one_clear_error(cells, empty):
    """A panel without isotype controls: dsb's denoising stops, naming the pattern tried.

    It is not quietly replaced by the background alone.
    """
    others = ~cells.var_names.isin(normalization.isotype_controls(cells, pattern=ISOTYPE_PATTERN))
    no_isotypes = cells[:, others].copy()
    for method in ("auto", "dsb"):  # auto picks dsb: empty droplets are given
        options = ProteinOptions(normalization=method)
        with pytest.raises(InputError) as error:
            run_protein(
                no_isotypes.copy(),
                empty=empty,
                options=options,
                embedding_options=EmbeddingOptions(),
                seed=0,
                backend="cpu",
            )
        assert str(error.value) == (
            "dsb's denoising asks for isotype controls, and none of the 83 antibodies matches "
            f"protein.isotype_pattern {ISOTYPE_PATTERN!r}"
        )


def test_run_protein_normalizes_as_asked_with_its_settings(cells, empty):
    """auto is dsb with empty droplets and CLR without; clr is CLR even with them; dsb's pseudocount
    and denoising are passed on; provenance names the method and every step; a seed repeats."""
    few = cells[:400].copy()
    isotypes = normalization.isotype_controls(few, pattern=ISOTYPE_PATTERN)
    dsb_options = ProteinOptions(dsb=DsbOptions(pseudocount=20, denoise=False))
    expected_dsb, expected_denoised, expected_clr = few.copy(), few.copy(), few.copy()
    normalization.dsb(expected_dsb, empty=empty, isotypes=isotypes, pseudocount=20, denoise=False, backend="cpu")
    normalization.dsb(expected_denoised, empty=empty, isotypes=isotypes, pseudocount=20, denoise=True, backend="cpu")
    normalization.clr(expected_clr, backend="cpu")
    runs = [
        (ProteinOptions(dsb=DsbOptions(pseudocount=20, denoise=True)), empty, "dsb", expected_denoised),
        (dsb_options, empty, "dsb", expected_dsb),
        (ProteinOptions(), None, "clr", expected_clr),
        (ProteinOptions(normalization="clr"), empty, "clr", expected_clr),
    ]
    embedding = EmbeddingOptions()
    for options, background, method, expected in runs:
        adata = few.copy()
        run_protein(adata, empty=background, options=options, embedding_options=embedding, seed=3, backend="cpu")
        np.testing.assert_allclose(adata.X, expected.X, rtol=1e-6)
        provenance = adata.uns["omicsprep"]["protein"]
        params = json.loads(provenance["params"])
        assert (params["normalization"], params["seed"]) == (method, 3)
        assert provenance["backend"] == "cpu"
        np.testing.assert_array_equal(adata.obs["isotype_adt"], few[:, isotypes].X.sum(axis=1).A1)
        assert {"normalize", "to_device", "pca", "to_host"} <= set(provenance["timings"])
        assert adata.var["isotype_control"].sum() == len(isotypes) == 4
        assert (adata.var["highly_variable"] == ~adata.var["isotype_control"]).all()
    again = few.copy()  # the last run again
    run_protein(again, empty=empty, options=options, embedding_options=embedding, seed=3, backend="cpu")
    np.testing.assert_array_equal(again.obsm["X_umap"], adata.obsm["X_umap"])
    np.testing.assert_array_equal(again.obs["leiden_1.0"], adata.obs["leiden_1.0"])


def test_64_bit_indices_give_the_same_protein_results_on_the_cpu(cells, empty):
    # Beyond 2^31 entries SciPy holds the tags with 64-bit indices (the GPU takes them in row
    # blocks): rule protein's chain (dsb, PCA, neighbours, Leiden) gives what it gives with
    # 32-bit ones.
    from conftest import embedding_options, shipped_config, widened

    from omicsprep.options import from_config

    config = shipped_config()
    results = []
    for widen in (True, False):
        adata, background = cells.copy(), empty.copy()
        if widen:
            adata.X, background.X = widened(adata.X), widened(background.X)
        run_protein(
            adata,
            empty=background,
            options=from_config(ProteinOptions, config["protein"]),
            embedding_options=embedding_options(config),
            seed=0,
            backend="cpu",
        )
        results.append(adata)
    wide, narrow = results
    assert (wide.layers["counts"] != narrow.layers["counts"]).nnz == 0
    np.testing.assert_array_equal(wide.X, narrow.X)
    np.testing.assert_allclose(np.abs(wide.obsm["X_pca"]), np.abs(narrow.obsm["X_pca"]), atol=1e-5)
    assert wide.obs.filter(like="leiden").equals(narrow.obs.filter(like="leiden"))
