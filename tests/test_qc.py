"""QC on real 10x data: metrics agree with scanpy, filters, MAD outliers, doublets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import scanpy as sc
from conftest import NO_DOUBLETS, QC_OPTIONS

from omicsprep import io
from omicsprep.errors import TooFewCellsError
from omicsprep.options import DoubletOptions, FilterOptions
from omicsprep.rna import doublets, qc
from omicsprep.rna.pipeline import run_qc


def test_gene_groups_match_human_and_mouse_names():
    names = ["MT-CO1", "mt-Nd1", "RPL13", "Rps2", "HBB", "Hba-a1", "HBA2", "HBEGF", "HBP1", "GAPDH", "MTOR"]
    adata = sc.AnnData(np.zeros((1, len(names)), dtype=np.float32))
    adata.var_names = names
    qc.annotate_gene_groups(adata, patterns=QC_OPTIONS.gene_groups)
    assert adata.var_names[adata.var["mt"]].tolist() == ["MT-CO1", "mt-Nd1"]
    assert adata.var_names[adata.var["ribo"]].tolist() == ["RPL13", "Rps2"]
    assert adata.var_names[adata.var["hb"]].tolist() == ["HBB", "Hba-a1", "HBA2"]


def test_metrics_equal_scanpy(pbmc):
    qc.annotate_gene_groups(pbmc, patterns=QC_OPTIONS.gene_groups)
    qc.calculate_qc_metrics(pbmc, qc_vars=["mt", "ribo", "hb"], backend="cpu")
    expected = np.asarray(pbmc.X.sum(axis=1)).ravel()
    np.testing.assert_allclose(pbmc.obs["total_counts"], expected)
    np.testing.assert_array_equal(pbmc.obs["n_genes_by_counts"], np.diff(pbmc.X.indptr))
    ribo = np.asarray(pbmc[:, pbmc.var["ribo"]].X.sum(axis=1)).ravel()
    np.testing.assert_allclose(pbmc.obs["pct_counts_ribo"], 100 * ribo / expected, rtol=1e-5)


def test_mad_outliers():
    values = np.array([10.0, 11, 9, 10, 10, 50])
    assert qc.mad_outliers(values, n_mads=5).tolist() == [False] * 5 + [True]


def test_mad_outliers_are_flagged_on_both_sides_of_real_cells(pbmc):
    """Five MADs around the median, below as above: the PBMCs have one cell with too few genes
    and one with too many counts for their spread (a one-sided check keeps one of them)."""
    qc.annotate_gene_groups(pbmc, patterns=QC_OPTIONS.gene_groups)
    qc.calculate_qc_metrics(pbmc, qc_vars=["mt", "ribo", "hb"], backend="cpu")
    sides = {}
    for metric in qc.MAD_METRICS:
        values = pbmc.obs[metric].to_numpy()
        median = np.median(values)
        mad = np.median(np.abs(values - median))
        low, high = values < median - 5 * mad, values > median + 5 * mad
        np.testing.assert_array_equal(qc.mad_outliers(values, n_mads=5), low | high)
        sides[metric] = (int(low.sum()), int(high.sum()))
    assert sides == {"log1p_total_counts": (0, 1), "log1p_n_genes_by_counts": (1, 0)}
    reasons = qc.qc_pass_mask(pbmc, method="mad", n_mads=5, n_mads_mt=3)
    assert (reasons == "mad_log1p_total_counts").sum() == 1
    assert (reasons == "mad_log1p_n_genes_by_counts").sum() == 1


def test_mad_of_zero_flags_nothing():
    # Most cells without mitochondrial counts: no spread to judge outliers by.
    values = np.array([0.0, 0.0, 0.0, 0.0, 0.5, 2.0])
    assert not qc.mad_outliers(values, n_mads=3).any()


def test_pass_mask_records_first_failing_reason():
    obs = pd.DataFrame(
        {
            "n_genes_by_counts": [5, 300, 300, 300],
            "total_counts": [10, 1000, 1000, 1000],
            "pct_counts_mt": [50.0, 1.0, 30.0, 2.0],
        },
        index=list("abcd"),
    )
    adata = sc.AnnData(obs=obs)
    reasons = qc.qc_pass_mask(adata, method="thresholds", min_genes=10, max_pct_mt=20)
    assert reasons.tolist() == ["min_genes", "", "max_pct_mt", ""]


def test_reference_filtering_of_the_mouse_10k(mouse_path):
    # shared/data README: min_genes=10, min_cells=3 keep 9,912 cells x 613 genes.
    adata = io.read_counts(mouse_path)
    kept, metrics = run_qc(adata, options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
    assert kept.shape == (9912, 613)
    assert len(metrics) == 10000
    assert metrics["passed"].sum() == 9912
    assert set(metrics.loc[~metrics["passed"], "fail_reason"]) == {"min_genes"}
    assert kept.uns["omicsprep"]["qc"]["backend"] == "cpu"
    assert "scanpy" in kept.uns["omicsprep"]["qc"]["versions"]


def test_mad_filtering_and_doublets_are_reproducible(pbmc):
    options = replace(QC_OPTIONS, filter=replace(QC_OPTIONS.filter, method="mad"))
    doublets = DoubletOptions(enabled=True, expected_rate=0.06, remove=True, max_cells_per_run=100_000)
    first, metrics = run_qc(pbmc.copy(), options=options, doublet_options=doublets, seed=0, backend="cpu")
    second, _ = run_qc(pbmc, options=options, doublet_options=doublets, seed=0, backend="cpu")
    assert list(first.obs_names) == list(second.obs_names)
    np.testing.assert_array_equal(first.obs["doublet_score"], second.obs["doublet_score"])
    assert metrics["fail_reason"].str.startswith("mad_").any()
    assert not first.obs["predicted_doublet"].any()
    assert "batches" not in first.uns["scrublet"]  # scored whole: no groups recorded
    assert 1000 < first.n_obs < 1107


@pytest.mark.parametrize(("n_cells", "seed"), [(150, 0), (201, 1), (20_000, 0), (20_000, 7), (70_000, 2)])
def test_simulated_pairs_are_scikit_learns_draw(n_cells, seed):
    """The vectorized draw gives scikit-learn's integers in its order (scanpy's pairs), beyond
    2^32 too (70,000 cells); 150 cells is scikit-learn's own permutation."""
    from sklearn.utils.random import sample_without_replacement

    grid, n_doublets = n_cells * n_cells, 2 * n_cells
    expected = sample_without_replacement(grid, n_doublets, random_state=np.random.RandomState(seed))
    ours = doublets.sample_without_replacement(grid, n_doublets, random_state=np.random.RandomState(seed))
    np.testing.assert_array_equal(ours, expected)


def test_large_samples_are_scored_for_doublets_in_random_groups(mouse_path):
    adata, _ = run_qc(
        io.read_counts(mouse_path), options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu"
    )
    grouped = adata.copy()
    qc.score_doublets(grouped, expected_rate=0.06, max_cells_per_run=4_000, seed=0, backend="cpu")
    # 9,912 cells: three groups of 3,304, scored apart; the grouping column is not kept.
    assert len(grouped.uns["scrublet"]["batches"]) == 3
    assert "batched_by" not in grouped.uns["scrublet"]
    # obs gains the two scores only (scanpy's groups add `n_genes`).
    assert list(grouped.obs.columns) == [*adata.obs.columns, "doublet_score", "predicted_doublet"]
    assert grouped.obs["predicted_doublet"].dtype == bool
    # The groups as qc.score_doublets draws them: a seeded permutation of the cells, dealt
    # round-robin; each group is then Scrublet's whole input, seeded alike.
    group = np.random.default_rng(0).permutation(adata.n_obs) % 3
    assert np.bincount(group).tolist() == [3304] * 3
    n_comps = min(30, adata.n_vars // 10)  # as qc.score_doublets picks it for 613 genes
    for label in range(3):
        alone = adata[group == label].copy()
        sc.pp.scrublet(
            alone,
            expected_doublet_rate=0.06,
            n_prin_comps=n_comps,
            use_approx_neighbors=False,
            random_state=0,
            verbose=False,
        )
        scored = grouped.obs.loc[alone.obs_names]
        assert alone.obs["doublet_score"].std() > 0
        ours, theirs = scored["doublet_score"].to_numpy(), alone.obs["doublet_score"].to_numpy()
        # The same simulated doublets, embedding and neighbours, except that scanpy's sparse
        # distance graph drops a simulated doublet identical to the cell (distance 0; one
        # cell of the 9,912): we count it, one neighbour more.
        differ = ours != theirs
        assert differ.sum() <= 1
        k_adj = round(grouped.uns["scrublet"]["batches"][str(label)]["parameters"]["n_neighbors"] * 3)
        np.testing.assert_allclose(
            simulated_neighbours(ours[differ], k_adj) - simulated_neighbours(theirs[differ], k_adj), 1
        )
        np.testing.assert_allclose(ours[~differ], theirs[~differ], rtol=1e-12, atol=0)
        np.testing.assert_array_equal(scored["predicted_doublet"], alone.obs["predicted_doublet"])
        np.testing.assert_array_equal(
            grouped.uns["scrublet"]["batches"][str(label)]["doublet_scores_sim"],
            alone.uns["scrublet"]["doublet_scores_sim"],
        )


def simulated_neighbours(scores: np.ndarray, k_adj: int, expected_rate: float = 0.06) -> np.ndarray:
    """Scrublet's score inverted: how many of a cell's k_adj - 1 neighbours are simulated doublets."""
    ratio = 2.0  # simulated doublets per cell
    q = scores * (1 - expected_rate) / (expected_rate / ratio + scores * (1 - expected_rate - expected_rate / ratio))
    return q * (k_adj + 2) - 1


def test_too_few_cells_left_names_each_filter_and_what_it_removed(pbmc):
    options = replace(QC_OPTIONS, filter=FilterOptions(method="thresholds", min_genes=20, max_counts=19))
    n_genes = (pbmc.X > 0).sum(axis=1).A1
    with pytest.raises(TooFewCellsError) as caught:
        run_qc(pbmc, options=options, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
    metrics = caught.value.metrics
    assert len(metrics) == pbmc.n_obs and (metrics["fail_reason"] != "").all()
    low = int((n_genes < 20).sum())  # min_genes removes these, max_counts the others (20 genes: 20 UMIs or more)
    assert 0 < low < pbmc.n_obs
    assert str(caught.value).startswith(
        f"only 0 cells left after cell filtering (at least 30 needed): min_genes 20 removed {low:,}, "
        f"max_counts 19 removed {pbmc.n_obs - low:,} of {pbmc.n_obs:,} cells; median per input cell: "
        f"{np.median(n_genes):,.0f} genes, {np.median(pbmc.X.sum(axis=1).A1):,.0f} UMIs, "
    )
