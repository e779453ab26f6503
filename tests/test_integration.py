"""Many samples as one: concatenation, Harmony and the integration metrics.

On the real PBMCs split into two batches, one given a technical (per-gene) batch effect; the
metrics also on hand-built neighbour graphs and clusters with values computed by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import pytest
from anndata import AnnData
from conftest import CLUSTER_OPTIONS, MERGE_OPTIONS
from scipy import sparse

from omicsprep.errors import InputError
from omicsprep.rna import integration
from omicsprep.rna.pipeline import run_merge


def test_concatenation_keeps_every_cell_and_gene(pbmc_batches):
    merged = integration.concatenate_samples(pbmc_batches, labels="leiden_1.0", backend="cpu")
    assert merged.n_obs == sum(a.n_obs for a in pbmc_batches.values())
    assert set(merged.var_names) == set(pbmc_batches["first"].var_names) | set(pbmc_batches["second"].var_names)
    assert merged.obs_names.is_unique
    assert merged.obs_names[0].startswith("first:")
    missing = merged.uns["merge"]["genes_missing"]
    assert missing["first"] == merged.n_vars - pbmc_batches["first"].n_vars
    first = merged[merged.obs["sample"] == "first", list(pbmc_batches["first"].var_names)]
    assert (pbmc_batches["first"].layers["counts"] != first.X).nnz == 0  # counts unchanged, zero where absent


def test_concatenation_keeps_every_cell_column_and_the_genes_descriptions(pbmc_batches):
    samples = {name: adata.copy() for name, adata in pbmc_batches.items()}
    samples["first"].obs["donor"] = "d1"  # a sheet column one sample has
    samples["second"].obs["cell_type"] = np.where(samples["second"].obs["leiden_1.0"] == "0", "T", "other")
    merged = integration.concatenate_samples(samples, labels="leiden_1.0", backend="cpu")
    first = merged.obs["sample"] == "first"
    for name, adata in samples.items():
        part = merged.obs.loc[merged.obs["sample"] == name]
        for column in ("total_counts", "n_genes_by_counts", "pct_counts_mt"):
            np.testing.assert_array_equal(part[column].to_numpy(), adata.obs[column].to_numpy())
        expected = (name + ":" + adata.obs["leiden_1.0"].astype(str)).to_numpy()
        np.testing.assert_array_equal(part["sample_leiden_1.0"].astype(str).to_numpy(), expected)
    assert (merged.obs.loc[first, "donor"] == "d1").all() and merged.obs.loc[~first, "donor"].isna().all()
    assert merged.obs.loc[~first, "cell_type"].isin(["T", "other"]).all()
    assert not any(key.startswith(("leiden_", "louvain_")) for key in merged.obs)  # the merge's own, later
    genes = samples["first"].var
    assert {"gene_ids", "feature_types"} <= set(merged.var.columns)
    assert "n_cells" not in merged.var and "highly_variable" not in merged.var  # per-sample statistics
    pd.testing.assert_series_equal(merged.var.loc[genes.index, "gene_ids"], genes["gene_ids"])


def test_samples_that_share_no_gene_or_one_sample_are_not_merged(pbmc_batches):
    renamed = pbmc_batches["second"].copy()
    renamed.var_names = "ENSG_" + renamed.var_names  # ids where the first has symbols
    first = pbmc_batches["first"].var_names
    expected = f"the samples share no gene (first {len(first)} (e.g. '{first[0]}'), second {renamed.n_vars} (e.g. 'ENSG"
    with pytest.raises(InputError) as caught:
        integration.concatenate_samples({"first": pbmc_batches["first"], "second": renamed}, backend="cpu")
    assert str(caught.value).startswith(expected)
    with pytest.raises(InputError, match=r"a merge needs two samples or more; given 1: \['first'\]"):
        run_merge(
            {"first": pbmc_batches["first"]},
            options=MERGE_OPTIONS,
            clustering_options=CLUSTER_OPTIONS,
            labels="leiden_1.0",
            seed=0,
            backend="cpu",
        )


def test_harmony_mixes_the_pbmc_batches_and_keeps_the_clusters(pbmc_batches):
    merged, metrics, _, _ = run_merge(
        pbmc_batches,
        options=MERGE_OPTIONS,
        clustering_options=CLUSTER_OPTIONS,
        labels="leiden_1.0",
        seed=0,
        backend="cpu",
    )
    before, after = metrics.set_index("method").loc["pca"], metrics.set_index("method").loc["harmony"]
    print(metrics.to_string(index=False))
    assert before["batch_mixing"] < 0.5  # the technical effect separates the halves
    assert after["batch_mixing"] > before["batch_mixing"] + 0.2
    assert after["label_conservation"] > 0.4
    assert merged.obsm["X_harmony"].shape == merged.obsm["X_pca"].shape
    assert merged.uns["omicsprep"]["merge"]["backend"] == "cpu"


def test_the_merge_selects_genes_and_corrects_by_the_batch_key_not_the_sample(pbmc_batches):
    """Three samples in two batches (the first half's cells in two samples), 50 of the 149 genes:
    the merge's HVGs are ranked within batches and Harmony corrects the batches, as a batch-aware
    selection and a Harmony of batches give them, and not as by sample or without batches."""
    from dataclasses import replace

    from omicsprep.rna import preprocessing

    first = pbmc_batches["first"]
    samples = {"a": first[::2].copy(), "b": first[1::2].copy(), "c": pbmc_batches["second"].copy()}
    for name, batch in (("a", "A"), ("b", "A"), ("c", "C")):
        samples[name].obs["batch"] = batch
    options = replace(CLUSTER_OPTIONS, hvg=replace(CLUSTER_OPTIONS.hvg, n_top_genes=50))
    merged = run_merge(
        samples,
        options=replace(MERGE_OPTIONS, batch_key="batch"),
        clustering_options=options,
        labels="leiden_1.0",
        seed=0,
        backend="cpu",
    ).cells
    assert merged.n_vars == 149 and merged.var["highly_variable"].sum() == 50
    selections = {}
    for key in ("batch", "sample", None):
        alone = integration.concatenate_samples(samples, labels="leiden_1.0", backend="cpu")
        preprocessing.normalize(alone, target_sum=options.normalize.target_sum, backend="cpu")
        preprocessing.highly_variable_genes(alone, flavor="seurat_v3", n_top_genes=50, batch_key=key, backend="cpu")
        selections[key] = alone.var["highly_variable"]
    assert merged.var["highly_variable"].equals(selections["batch"])
    assert not selections["batch"].equals(selections["sample"]) and not selections["batch"].equals(selections[None])
    harmony = MERGE_OPTIONS.harmony
    corrected = {}
    for key in ("batch", "sample"):
        again = merged.copy()
        integration.harmony(again, key=key, theta=harmony.theta, max_iter=harmony.max_iter, seed=0, backend="cpu")
        corrected[key] = again.obsm["X_harmony"]
    np.testing.assert_allclose(merged.obsm["X_harmony"], corrected["batch"], rtol=1e-6, atol=1e-6)
    assert np.abs(corrected["batch"] - corrected["sample"]).max() > 0.1


def neighbour_graph(batches: list[str], neighbours: dict[int, list[int]]) -> AnnData:
    """Cells with a batch each and a kNN graph in obsp["distances"].

    Row i holds cell i's neighbours (distances arbitrary: the metric counts neighbours).
    """
    rows = [cell for cell, partners in neighbours.items() for _ in partners]
    cols = [partner for partners in neighbours.values() for partner in partners]
    distances = sparse.csr_matrix((np.linspace(0.5, 2.0, len(rows)), (rows, cols)), shape=(len(batches),) * 2)
    adata = AnnData(obs=pd.DataFrame({"batch": batches}, index=[f"c{i}" for i in range(len(batches))]))
    adata.obsp["distances"] = distances
    return adata


def entropy(*shares: float) -> float:
    return -sum(p * math.log(p) for p in shares)


def test_batch_mixing_on_a_hand_built_graph():
    # Batches A A A B B: overall shares 3/5, 2/5, whose entropy is the reference.
    # Row i = cell i's neighbours (not symmetric: the cells *it* lists, itself left out):
    #   c0 (A): c1 c3    -> A 1/2, B 1/2 -> H = ln 2          = 0.693147
    #   c1 (A): c0 c2    -> A only       -> H = 0
    #   c2 (A): c3 c4 c0 -> A 1/3, B 2/3 -> H(1/3, 2/3)       = 0.636514
    #   c3 (B): c4       -> B only       -> H = 0
    #   c4 (B): c0 c1 c2 c3 -> A 3/4, B 1/4 -> H(3/4, 1/4)    = 0.562335
    # mixing = mean(H) / H(3/5, 2/5) = (1.891996 / 5) / 0.673012 = 0.562248
    adata = neighbour_graph(["A", "A", "A", "B", "B"], {0: [1, 3], 1: [0, 2], 2: [3, 4, 0], 3: [4], 4: [0, 1, 2, 3]})
    mean_entropy = (entropy(1 / 2, 1 / 2) + 0 + entropy(1 / 3, 2 / 3) + 0 + entropy(3 / 4, 1 / 4)) / 5
    expected = mean_entropy / entropy(3 / 5, 2 / 5)
    assert expected == pytest.approx(0.562248, abs=1e-6)
    assert integration.batch_mixing(adata, key="batch") == pytest.approx(expected, rel=1e-9)


def test_batch_mixing_is_one_for_mixed_and_zero_for_separate_batches():
    batches = ["A", "A", "B", "B"]
    # Each cell's neighbours hold the batches in the overall shares (1/2, 1/2): H = ln 2 each -> 1.
    mixed = neighbour_graph(batches, {0: [1, 2], 1: [0, 3], 2: [3, 0], 3: [2, 1]})
    assert integration.batch_mixing(mixed, key="batch") == pytest.approx(1.0, rel=1e-12)
    # Each cell's neighbours are of its own batch only: H = 0 each -> 0.
    separate = neighbour_graph(batches, {0: [1], 1: [0], 2: [3], 3: [2]})
    assert integration.batch_mixing(separate, key="batch") == 0
    # One batch: nothing to mix, 1 by definition (no division by a zero entropy).
    single = neighbour_graph(["A"] * 3, {0: [1], 1: [2], 2: [0]})
    assert integration.batch_mixing(single, key="batch") == 1


def test_label_conservation_on_hand_built_clusters():
    # Sample s1 (6 cells): own clusters a a a b b b, merged 0 0 0 1 1 1 -> the same split, ARI 1.
    # Sample s2 (4 cells): own clusters c c d d, merged 0 1 0 1 -> every pair of the contingency
    # table is split: sum C(n_ij, 2) = 0; rows 2, 2 and columns 2, 2 give sum C(.,2) = 2 each;
    # expected index = 2 x 2 / C(4, 2) = 2/3, maximum = (2 + 2) / 2 = 2,
    # ARI = (0 - 2/3) / (2 - 2/3) = -1/2.
    # The mean over samples is (1 - 1/2) / 2 = 1/4 (weighting by cells would give 0.4).
    obs = pd.DataFrame(
        {
            "sample": ["s1"] * 6 + ["s2"] * 4,
            "sample_clusters": ["s1:a"] * 3 + ["s1:b"] * 3 + ["s2:c", "s2:c", "s2:d", "s2:d"],
            "leiden": ["0", "0", "0", "1", "1", "1", "0", "1", "0", "1"],
        },
        index=[f"c{i}" for i in range(10)],
    )
    assert integration.label_conservation(AnnData(obs=obs), clusters="leiden") == pytest.approx(0.25, abs=1e-12)


def test_merged_counts_equal_anndatas_outer_concatenation_also_read_one_sample_at_a_time(pbmc_batches, tmp_path):
    # The counts are stacked by omicsprep (each sample's genes placed among all samples'), the
    # cells and genes by anndata: the matrix is anndata's outer concatenation's. Read from files
    # one sample at a time (io.H5adSamples, as rule merge reads them), the same.
    import anndata as ad

    from omicsprep import io

    samples = {name: adata[:, ::-1].copy() if name == "second" else adata for name, adata in pbmc_batches.items()}
    counts = {name: AnnData(adata.layers["counts"], var=adata.var[[]]) for name, adata in samples.items()}
    reference = ad.concat(counts, join="outer", fill_value=0)
    merged = integration.concatenate_samples(samples, labels="leiden_1.0", backend="cpu")
    assert list(merged.var_names) == list(reference.var_names)
    assert merged.X.has_sorted_indices and (sparse.csr_matrix(reference.X) != merged.X).nnz == 0
    paths = {}
    for name, adata in samples.items():
        paths[name] = tmp_path / f"{name}.h5ad"
        io.write_h5ad(adata, paths[name], compression="gzip")
    lazily = io.H5adSamples(paths, skip=("X",))
    assert isinstance(lazily, Mapping) and list(lazily) == list(samples)
    from_files = integration.concatenate_samples(lazily, labels="leiden_1.0", backend="cpu")
    assert (from_files.X != merged.X).nnz == 0
    pd.testing.assert_frame_equal(from_files.obs, merged.obs)
