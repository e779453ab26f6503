"""Many samples as one: concatenation, Harmony and the integration metrics, on the real
PBMCs split into two batches, one given a technical (per-gene) batch effect."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CLUSTER_PARAMS, NO_DOUBLETS, PBMC_H5, QC_PARAMS

from omicsprep import integration, io
from omicsprep.pipeline import run_clustering, run_merge, run_qc

MERGE_PARAMS = {"batch_key": "sample", "harmony": {"theta": 2.0, "max_iter": 10}}


@pytest.fixture(scope="module")
def batches():
    """The chr21 PBMCs in two halves; the second half's counts scaled per gene (log-normal, sigma 1.5)."""
    counts = io.read_counts(PBMC_H5)
    halves = {"first": counts[::2].copy(), "second": counts[1::2].copy()}
    rng = np.random.default_rng(0)
    scale = rng.lognormal(0, 1.5, counts.n_vars)
    second = halves["second"].X.tocsc()
    second.data = np.round(second.data * np.repeat(scale, np.diff(second.indptr)))
    halves["second"].X = second.tocsr()
    halves["second"].X.eliminate_zeros()
    processed = {}
    for name, adata in halves.items():
        adata, _ = run_qc(adata, qc_params=QC_PARAMS, doublet_params=NO_DOUBLETS, seed=0, backend="cpu")
        run_clustering(adata, params=CLUSTER_PARAMS, seed=0, backend="cpu")
        processed[name] = adata
    return processed


def test_concatenation_keeps_every_cell_and_gene(batches):
    merged = integration.concatenate_samples(batches, labels="leiden_1.0")
    assert merged.n_obs == sum(a.n_obs for a in batches.values())
    assert set(merged.var_names) == set(batches["first"].var_names) | set(batches["second"].var_names)
    assert merged.obs_names.is_unique and merged.obs_names[0].startswith("first:")
    missing = merged.uns["merge"]["genes_missing"]
    assert missing["first"] == merged.n_vars - batches["first"].n_vars
    first = merged[merged.obs["sample"] == "first", list(batches["first"].var_names)]
    assert (first.X != batches["first"].layers["counts"]).nnz == 0  # counts unchanged, zero where absent


def test_harmony_mixes_the_batches_and_keeps_the_clusters(batches):
    merged, metrics = run_merge(batches, params=MERGE_PARAMS, clustering_params=CLUSTER_PARAMS,
                                labels="leiden_1.0", seed=0, backend="cpu")
    before, after = metrics.set_index("stage").loc["before"], metrics.set_index("stage").loc["after"]
    print(metrics.to_string(index=False))
    assert before["batch_mixing"] < 0.5  # the technical effect separates the halves
    assert after["batch_mixing"] > before["batch_mixing"] + 0.2
    assert after["label_conservation"] > 0.4
    assert merged.obsm["X_pca_harmony"].shape == merged.obsm["X_pca"].shape
    assert merged.uns["omicsprep"]["merge"]["backend"] == "cpu"
