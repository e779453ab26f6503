"""Many samples as one: concatenation, Harmony and the integration metrics, on the real
PBMCs split into two batches, one given a technical (per-gene) batch effect."""

from __future__ import annotations

from conftest import CLUSTER_PARAMS, MERGE_PARAMS

from omicsprep import integration
from omicsprep.pipeline import run_merge


def test_concatenation_keeps_every_cell_and_gene(pbmc_batches):
    merged = integration.concatenate_samples(pbmc_batches, labels="leiden_1.0")
    assert merged.n_obs == sum(a.n_obs for a in pbmc_batches.values())
    assert set(merged.var_names) == set(pbmc_batches["first"].var_names) | set(pbmc_batches["second"].var_names)
    assert merged.obs_names.is_unique and merged.obs_names[0].startswith("first:")
    missing = merged.uns["merge"]["genes_missing"]
    assert missing["first"] == merged.n_vars - pbmc_batches["first"].n_vars
    first = merged[merged.obs["sample"] == "first", list(pbmc_batches["first"].var_names)]
    assert (first.X != pbmc_batches["first"].layers["counts"]).nnz == 0  # counts unchanged, zero where absent


def test_harmony_mixes_the_pbmc_batches_and_keeps_the_clusters(pbmc_batches):
    merged, metrics = run_merge(pbmc_batches, params=MERGE_PARAMS, clustering_params=CLUSTER_PARAMS,
                                labels="leiden_1.0", seed=0, backend="cpu")
    before, after = metrics.set_index("stage").loc["before"], metrics.set_index("stage").loc["after"]
    print(metrics.to_string(index=False))
    assert before["batch_mixing"] < 0.5  # the technical effect separates the halves
    assert after["batch_mixing"] > before["batch_mixing"] + 0.2
    assert after["label_conservation"] > 0.4
    assert merged.obsm["X_pca_harmony"].shape == merged.obsm["X_pca"].shape
    assert merged.uns["omicsprep"]["merge"]["backend"] == "cpu"
