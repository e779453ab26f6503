"""CITE-seq antibody tags on the dsb package's real data: QC, CLR and dsb against muon."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from conftest import CITESEQ

from omicsprep import io
from omicsprep.errors import InputError
from omicsprep.options import EmbeddingOptions, ProteinOptions
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


def test_clr_equals_muon(cells):
    from muon import prot

    ours, theirs = cells.copy(), cells.copy()
    normalization.clr(ours, backend="cpu")
    prot.pp.clr(theirs, axis=1)  # per cell, Seurat's margin = 2
    np.testing.assert_allclose(ours.X, dense(theirs.X), atol=1e-5)
    assert (dense(ours.layers["counts"]) == dense(cells.X)).all()


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
    assert {"dsb_background", "dsb_technical"} <= set(ours.obs.columns)


def test_dsb_refuses_mismatched_input(cells, empty):
    with pytest.raises(InputError, match="empty droplets lack 1 antibodies"):
        normalization.dsb(cells.copy(), empty=empty[:, 1:].copy(), isotypes=[], backend="cpu")
    with pytest.raises(InputError, match="isotype controls not among the antibodies: IgG_nope"):
        normalization.dsb(cells.copy(), empty=empty, isotypes=["IgG_nope"], backend="cpu")


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
