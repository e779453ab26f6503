"""EmptyDrops and emptyDropsCellRanger against DropletUtils 1.18; the Monte Carlo on CPU and CUDA."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import subprocess
import sys
import warnings
from functools import cache

import numba
import numpy as np
import pandas as pd
import pytest
from conftest import REPO, import_for_gpu_test
from scipy import io as scipy_io
from scipy import sparse

from omicsprep.cells import montecarlo
from omicsprep.cells.emptydrops import empty_drops, empty_drops_cell_ranger
from omicsprep.errors import InputError
from omicsprep.testing.droplets import RawDroplets, generate_raw_droplets
from omicsprep.testing.reference_runs import missing_r_package, run_reference

NITERS = 2000
CALLED = 0.001

R_SCRIPT = """
suppressPackageStartupMessages({library(DropletUtils); library(Matrix)})
args <- commandArgs(trailingOnly=TRUE)
m <- as(readMM(args[1]), "CsparseMatrix")
for (case in args[-1]) {
    name <- sub("=.*", "", case)
    call <- eval(parse(text=sub("^[^=]*=", "", case)))
    set.seed(0)
    out <- call(m)
    md <- metadata(out)
    prefix <- file.path(dirname(args[1]), name)
    write.csv(data.frame(total=out$Total, log_prob=out$LogProb, p_value=out$PValue, fdr=out$FDR),
              paste0(prefix, ".table.csv"), row.names=FALSE)
    write.csv(data.frame(ambient=as.numeric(md$ambient)), paste0(prefix, ".ambient.csv"), row.names=FALSE)
    write.csv(data.frame(alpha=md$alpha, retain=md$retain), paste0(prefix, ".meta.csv"), row.names=FALSE)
}
"""

# (our call, DropletUtils' call): explicit retain on both sides; every option covered once.
CASES = {
    "estimated_alpha": (
        lambda m: empty_drops(m, niters=NITERS, retain=800),
        f"function(m) emptyDrops(m, niters={NITERS}, retain=800)",
    ),
    "test_ambient_by_rank_fixed_alpha": (
        lambda m: empty_drops(m, niters=NITERS, retain=2000, test_ambient=True, by_rank=600, alpha=200.0, ignore=3),
        f"function(m) emptyDrops(m, niters={NITERS}, retain=2000, test.ambient=TRUE, by.rank=600, alpha=200, ignore=3)",
    ),
    "multinomial_lower": (
        lambda m: empty_drops(m, niters=NITERS, retain=1500, lower=50, alpha=math.inf),
        f"function(m) emptyDrops(m, niters={NITERS}, retain=1500, lower=50, alpha=Inf)",
    ),
    "cell_ranger": (
        lambda m: empty_drops_cell_ranger(
            m, niters=NITERS, expected_cells=300, umi_min=30, ambient_rank_min=2000, ambient_rank_max=15000
        ),
        (
            f"function(m) emptyDropsCellRanger(m, niters={NITERS}, n.expected.cells=300, umi.min=30, "
            "ind.min=2000, ind.max=15000)"
        ),
    ),
}


AMBIENT_ALPHA = 200.0


@cache
def droplets() -> RawDroplets:
    """Generated droplets whose empty droplets are Dirichlet-multinomial around the ambient profile.

    generate's empty droplets are multinomial draws, whose alpha estimate would sit at
    DropletUtils' upper bound; overdispersed ones test the estimate.
    """
    raw = generate_raw_droplets(300, 20_000, 2_000, seed=3)
    rng = np.random.default_rng(3)
    empty = ~raw.truth["is_cell"].to_numpy()
    proportions = rng.gamma(AMBIENT_ALPHA * raw.ambient, size=(int(empty.sum()), raw.ambient.size))
    proportions /= proportions.sum(axis=1, keepdims=True)
    totals = np.asarray(raw.counts[empty].sum(axis=1)).ravel().astype(np.int64)
    redrawn = sparse.csr_matrix(rng.multinomial(totals, proportions).astype(np.float32))
    stacked = sparse.vstack([raw.counts[~empty], redrawn], format="csr")
    position = np.empty(empty.size, dtype=np.int64)  # each barcode's row in the stack
    position[np.argsort(empty, kind="stable")] = np.arange(empty.size)
    return dataclasses.replace(raw, counts=stacked[position])


def skip_without_dropletutils() -> None:
    if reason := missing_r_package("DropletUtils"):
        pytest.skip(reason)


@pytest.fixture(scope="module")
def dropletutils(tmp_path_factory):
    """Runs every case in DropletUtils; ``{case: (table, ambient, alpha, retain)}``."""
    skip_without_dropletutils()
    directory = tmp_path_factory.mktemp("dropletutils")
    matrix_path = directory / "counts.mtx"
    scipy_io.mmwrite(matrix_path, droplets().counts.T.tocoo())  # genes x barcodes, as R expects
    script = directory / "run.R"
    script.write_text(R_SCRIPT)
    calls = [f"{case}={r_call}" for case, (_, r_call) in CASES.items()]
    run = run_reference(["Rscript", str(script), str(matrix_path), *calls], directory, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {}
    for case in CASES:
        table = pd.read_csv(directory / f"{case}.table.csv")
        meta = pd.read_csv(directory / f"{case}.meta.csv")
        ambient = pd.read_csv(directory / f"{case}.ambient.csv")["ambient"].to_numpy()
        results[case] = (table, ambient, float(meta["alpha"].iloc[0]), float(meta["retain"].iloc[0]))
    return results


@pytest.mark.parametrize("case", CASES)
def test_matches_dropletutils(dropletutils, case):
    ours = CASES[case][0](droplets().counts)
    theirs, ambient, alpha, retain = dropletutils[case]
    table = ours.table
    np.testing.assert_array_equal(table["total"], theirs["total"])
    detected = ours.ambient > 0  # DropletUtils drops the genes no barcode counts
    np.testing.assert_allclose(ours.ambient[detected], ambient, rtol=1e-6)
    assert ours.alpha == pytest.approx(alpha, rel=1e-6)
    assert ours.retain == retain
    tested = theirs["p_value"].notna().to_numpy()
    np.testing.assert_array_equal(table["p_value"].notna(), tested)
    np.testing.assert_allclose(table["log_prob"][tested], theirs["log_prob"][tested], rtol=1e-6)
    p, p_r = table["p_value"][tested].to_numpy(), theirs["p_value"][tested].to_numpy()
    # Four standard errors of a difference of two independent Monte Carlo estimates.
    pooled = (p + p_r) / 2
    tolerance = 4 * np.sqrt(2 * pooled * (1 - pooled) / NITERS) + 1 / NITERS
    assert np.all(np.abs(p - p_r) <= tolerance), np.max(np.abs(p - p_r) - tolerance)
    called, called_r = table["fdr"].to_numpy() <= CALLED, theirs["fdr"].to_numpy() <= CALLED
    assert called_r.sum() > 100
    assert np.mean(called == called_r) >= 0.995
    # At these niters the smallest p-value, 1 / (niters + 1), is near the threshold after BH,
    # so a few borderline calls flip with the Monte Carlo draws.
    assert (called != called_r).sum() <= 0.05 * called_r.sum()
    np.testing.assert_array_equal(table["fdr"].isna(), theirs["fdr"].isna())
    retained = table["total"].to_numpy() >= retain  # FDR 0 on both sides, not Benjamini-Hochberg's of small p
    assert retained.sum() > 0 and (table["fdr"][retained] == 0).all() and (theirs["fdr"][retained] == 0).all()
    # FDR values against DropletUtils' (within the Monte Carlo noise their p-values carry: at
    # most 0.032 apart, 0.0006-0.0054 on average over the four cases), and as Benjamini-Hochberg
    # makes them from p-values: never below them, growing with them, above them for some
    # (raw p-values as FDR would be none).
    fdr, fdr_r = table["fdr"].to_numpy(), theirs["fdr"].to_numpy()
    both = ~np.isnan(fdr) & ~np.isnan(fdr_r)
    assert np.abs(fdr[both] - fdr_r[both]).max() < 0.05 and np.abs(fdr[both] - fdr_r[both]).mean() < 0.01
    p_all = table["p_value"].to_numpy()
    adjusted = both & ~np.isnan(p_all) & (table["total"].to_numpy() < retain)  # retained ones: FDR of p 0
    order = np.argsort(p_all[adjusted], kind="stable")
    assert np.all(fdr[adjusted] >= p_all[adjusted] - 1e-12)
    assert np.all(np.diff(fdr[adjusted][order]) >= -1e-12)
    assert (fdr[adjusted] > p_all[adjusted] + 1e-6).sum() > 0.5 * (p_all[adjusted] < 1).sum()


R_DEFAULTS = """
suppressPackageStartupMessages(library(DropletUtils))
for (name in c(".empty_drops", ".test_empty_drops", ".empty_drops_cell_ranger")) {
    arguments <- formals(get(name, envir=asNamespace("DropletUtils")))
    for (argument in names(arguments)) {
        if (is.symbol(arguments[[argument]]) || is.call(arguments[[argument]])) next
        value <- arguments[[argument]]
        cat(argument, if (is.null(value)) "NULL" else format(value, scientific=FALSE), "\\n")
    }
}
"""
# DropletUtils' argument of each of ours whose default is its (retain: its NULL takes the knee, ours retains none).
R_ARGUMENTS = {
    empty_drops: {"lower": "lower", "niters": "niters", "test_ambient": "test.ambient", "ignore": "ignore",
                  "alpha": "alpha"},
    empty_drops_cell_ranger: {"expected_cells": "n.expected.cells", "max_percentile": "max.percentile",
                              "max_min_ratio": "max.min.ratio", "umi_min": "umi.min",
                              "umi_min_frac_median": "umi.min.frac.median", "candidates_max": "cand.max.n",
                              "ambient_rank_min": "ind.min", "ambient_rank_max": "ind.max", "niters": "niters"},
}  # fmt: skip


def test_defaults_are_dropletutils_own_and_seed_zero(tmp_path):
    """Called without them, both take DropletUtils' defaults (its functions' formals, read from R),
    and the Monte Carlo's seed 0."""
    skip_without_dropletutils()
    (tmp_path / "defaults.R").write_text(R_DEFAULTS)
    run = run_reference(["Rscript", str(tmp_path / "defaults.R")], tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = {}
    for line in run.stdout.splitlines():
        argument, value = line.split()
        theirs[argument] = None if value == "NULL" else {"TRUE": True, "FALSE": False}.get(value, value)
    for function, arguments in R_ARGUMENTS.items():
        defaults = inspect.signature(function).parameters
        for ours, their_name in arguments.items():
            default = defaults[ours].default
            expected = theirs[their_name]
            assert default == (float(expected) if isinstance(expected, str) else expected), (function, ours)
    counts = droplets().counts
    pd.testing.assert_frame_equal(
        empty_drops(counts, niters=20, retain=2000).table, empty_drops(counts, niters=20, retain=2000, seed=0).table
    )
    ranks = {"expected_cells": 300, "umi_min": 30, "ambient_rank_min": 2000, "ambient_rank_max": 15000}
    pd.testing.assert_frame_equal(
        empty_drops_cell_ranger(counts, niters=20, **ranks).table,
        empty_drops_cell_ranger(counts, niters=20, seed=0, **ranks).table,
    )


def test_called_without_them_lower_is_100_and_niters_10000():
    """The defaults at work (a signature need not show the default a call takes): a barcode of
    100 counts is ambient and one of 101 is tested, and the smallest p-value is 1 / (10,000 + 1)."""
    counts = droplets().counts
    totals = np.asarray(counts.sum(axis=1)).ravel()
    (at_lower,) = np.flatnonzero(totals == 100)
    above = counts[at_lower].tolil()
    above[0, above.rows[0][0]] += 1
    table = empty_drops(sparse.vstack([counts, above.tocsr()], format="csr"), retain=2000).table
    assert table["total"].iloc[-1] == 101
    assert np.isnan(table["p_value"].iloc[at_lower]) and not np.isnan(table["p_value"].iloc[-1])
    assert table["p_value"].min() == 1 / 10_001


def test_cell_ranger_called_without_them_takes_ranks_45000_to_90000_as_ambient_and_niters_10000():
    """The Cell Ranger defaults at work, not only in the signature (test_defaults_are_dropletutils_own_and_seed_zero
    reads that, which mutmut's wrapper keeps as the original's): 100,000 one-count droplets behind the
    generated ones put ranks 45,000 and 90,000 among them, where one droplet more or less changes the
    ambient profile; the smallest p-value is 1 / (10,000 + 1)."""
    counts = droplets().counts
    rng = np.random.default_rng(5)
    n_small = 100_000
    small = sparse.csr_matrix(
        (np.ones(n_small), (np.arange(n_small), rng.integers(counts.shape[1], size=n_small))),
        shape=(n_small, counts.shape[1]),
    )
    many = sparse.vstack([counts, small], format="csr")
    called = {"expected_cells": 300, "umi_min": 30}
    ranks = {"ambient_rank_min": 45_000, "ambient_rank_max": 90_000}
    for shifted in ({"ambient_rank_min": 45_001}, {"ambient_rank_max": 90_001}):
        assert not np.array_equal(
            empty_drops_cell_ranger(many, niters=20, **called, **ranks).ambient,
            empty_drops_cell_ranger(many, niters=20, **called, **(ranks | shifted)).ambient,
        ), shifted
    np.testing.assert_array_equal(
        empty_drops_cell_ranger(many, niters=20, **called).ambient,
        empty_drops_cell_ranger(many, niters=20, **called, **ranks).ambient,
    )
    table = empty_drops_cell_ranger(counts, **called, ambient_rank_min=2000, ambient_rank_max=15000).table
    assert table["p_value"].min() == 1 / 10_001


def test_genes_counted_in_no_barcode_at_the_end_and_counts_rounding_to_zero_change_nothing():
    """Genes counted nowhere, last in the matrix (where a matrix built from the counts' indices
    would end early), with and without stored counts that round to 0 (R's round; no counts):
    ambient 0 for those genes, as DropletUtils drops them, and the table is the same, without a
    warning of their log(0)."""
    counts = droplets().counts
    rows, genes = np.nonzero(counts[:50].toarray() == 0)
    near_zero = sparse.csr_matrix((np.full(rows.size, 0.4, dtype=counts.dtype), (rows, genes)), shape=counts.shape)
    narrow = empty_drops(counts, niters=20, retain=2000)
    for stored in (counts + near_zero, counts):
        wider = sparse.hstack([stored, sparse.csr_matrix((counts.shape[0], 3), dtype=counts.dtype)], format="csr")
        assert wider.nnz == stored.nnz
        wide = empty_drops(wider, niters=20, retain=2000)
        assert wide.ambient.size == counts.shape[1] + 3 and (wide.ambient[-3:] == 0).all()
        np.testing.assert_array_equal(wide.ambient[:-3], narrow.ambient)
        pd.testing.assert_frame_equal(wide.table, narrow.table)
    with warnings.catch_warnings():  # their log(0) in the multinomial's terms: no warning in the rule's log
        warnings.simplefilter("error", RuntimeWarning)
        empty_drops(wider, niters=20, retain=2000, alpha=math.inf)


@pytest.mark.parametrize("alpha", [math.inf, 50.0])
def test_each_total_counts_its_own_simulations_from_none_to_all(alpha):
    """A barcode less probable than any simulated droplet of its total has none below it, one more
    probable than all has every one, in each group of equal totals: the first group too (the
    comparisons with DropletUtils, whose draws differ, let one count more or less through)."""
    from omicsprep.cells import emptydrops

    ambient = np.array([0.5, 0.3, 0.2])
    totals = np.array([20, 20, 20, 50, 50])
    data_p = np.array([-1e300, 1e300, -3.0, -1e300, 1e300])
    below = emptydrops._count_below(totals, data_p, ambient, alpha=alpha, niters=40, seed=0, backend="cpu")
    assert [below[0], below[1], below[3], below[4]] == [0, 40, 0, 40]
    assert 0 <= below[2] <= 40


def test_the_monte_carlo_reads_log_counts_up_to_the_largest_total():
    """The kernels read log(count + 1) for each count a gene reaches, up to a droplet's whole total; a
    shorter table is read past its end (Numba checks no bounds) when one gene takes nearly all of it."""
    ambient = np.array([0.98, 0.01, 0.01])
    inputs = montecarlo.simulation_inputs(ambient, math.inf, np.array([3, 7]), np.array([2, 1]), np.zeros(3))
    log_count = inputs[4]
    assert log_count.size == 7 + 1
    np.testing.assert_allclose(log_count[1:], np.log(np.arange(1, 8)))


def test_benjamini_hochberg_is_rs_p_adjust_with_one_p_value_or_ties():
    """R's p.adjust(p, "BH"): NaN stays NaN and does not count, so one p-value is its own FDR; tied
    p-values share one (R 4.2.2: p.adjust(c(NA, 0.01, 0.04, 0.04, 0.03), "BH") is NA, 0.04, 0.04, 0.04, 0.04)."""
    from omicsprep.cells import emptydrops

    np.testing.assert_array_equal(
        emptydrops._benjamini_hochberg(np.array([np.nan, 0.2, np.nan])), [np.nan, 0.2, np.nan]
    )
    np.testing.assert_allclose(
        emptydrops._benjamini_hochberg(np.array([np.nan, 0.01, 0.04, 0.04, 0.03])), [np.nan, 0.04, 0.04, 0.04, 0.04]
    )


def test_limited_marks_the_p_values_at_their_floor():
    """DropletUtils' Limited: no simulated barcode was as unlikely as this one, so its p-value is
    the floor 1 / (niters + 1); NA where a barcode is not tested."""
    table = empty_drops(droplets().counts, niters=20, retain=2000).table
    tested = table["p_value"].notna().to_numpy()
    limited = table["limited"]
    np.testing.assert_array_equal(limited.isna().to_numpy(), ~tested)
    at_floor = table["p_value"][tested].to_numpy() == 1 / 21
    np.testing.assert_array_equal(limited[tested].to_numpy(dtype=bool), at_floor)
    assert 0 < at_floor.sum() < at_floor.size


def test_ambient_genes_good_turing_leaves_at_zero_share_a_pseudo_count():
    """DropletUtils' .safe_good_turing: without singletons Good-Turing gives the unseen genes
    nothing; they then share 1 / (total counts) equally and the others give it up in proportion
    (DropletUtils 1.18 gives this profile 0.01315789474 per unseen gene, 0.34509684897 for the 13)."""
    from omicsprep.cells.emptydrops import _good_turing_proportions, _safe_good_turing

    profile = np.array([0, 0, 2, 2, 2, 3, 3, 5, 8, 13])
    good_turing = _good_turing_proportions(profile)
    assert (good_turing[:2] == 0).all() and good_turing.sum() == pytest.approx(1)
    safe = _safe_good_turing(profile)
    np.testing.assert_allclose(safe[:2], 1 / 38 / 2, rtol=1e-15)
    np.testing.assert_allclose(safe[2:], good_turing[2:] * (1 - 1 / 38), rtol=1e-15)
    with warnings.catch_warnings():  # a profile without zeros: nothing to share, no division by its 0 zeros
        warnings.simplefilter("error")
        np.testing.assert_array_equal(_safe_good_turing(profile + 1), _good_turing_proportions(profile + 1))


def test_which_barcodes_are_tested_and_counted_in_the_fdr_as_in_dropletutils():
    """DropletUtils' rules (its ``testEmptyDrops`` and ``.empty_drops``): with test.ambient every
    barcode with a nonzero total is tested, one count among them; ignore leaves out those at or
    below it, and without test.ambient the ambient ones stay untested whatever ignore; a retained
    total counts as p 0 in the FDR even at or below lower (retain is applied before test.ambient's
    discard)."""
    counts = droplets().counts
    with_empty = sparse.vstack([counts, sparse.csr_matrix((3, counts.shape[1]), dtype=counts.dtype)], format="csr")
    table = empty_drops(with_empty, niters=20, test_ambient=True, retain=2000).table
    totals = table["total"].to_numpy()
    assert (totals == 1).sum() > 0 and (totals == 0).sum() == 3
    np.testing.assert_array_equal(table["p_value"].notna().to_numpy(), totals > 0)
    ignoring = empty_drops(counts, niters=20, ignore=50, retain=2000).table  # ignore below lower (100)
    np.testing.assert_array_equal(ignoring["p_value"].notna().to_numpy(), ignoring["total"].to_numpy() > 100)
    low_retain = empty_drops(counts, niters=20, retain=60).table
    retained_ambient = ((low_retain["total"] >= 60) & (low_retain["total"] <= 100)).to_numpy()
    assert retained_ambient.sum() > 0 and low_retain["p_value"][retained_ambient].isna().all()
    assert (low_retain["fdr"][retained_ambient] == 0).all()


def test_cell_ranger_marks_ordmag_cells_as_called_without_testing():
    result = empty_drops_cell_ranger(
        droplets().counts, niters=200, expected_cells=300, ambient_rank_min=2000, ambient_rank_max=15000
    )
    ordmag = result.table["total"] >= result.retain
    assert ordmag.sum() > 0
    assert result.table["p_value"][ordmag].isna().all()
    assert (result.table["fdr"][ordmag] == 0).all()


def test_cell_ranger_ordmag_cells_include_a_total_equal_to_retain_and_retain_is_at_least_one():
    """DropletUtils' ``ncells.simple <- sum(totals >= retain)``: a barcode whose total is exactly
    retain is an ordmag cell (untested, FDR 0); and ``retain <- max(round(n.umi.max / 10), 1)``: 1
    when the total at the expected cells' rank is below 15."""
    counts = droplets().counts.tolil()
    totals = np.asarray(counts.sum(axis=1)).ravel()
    retain = max(round(np.sort(totals)[::-1][2] / 10), 1)  # expected_cells 300: the 3rd largest total
    below = np.flatnonzero(totals < retain)
    raised = below[np.argmax(totals[below])]
    counts[raised, 0] += retain - totals[raised]
    ranks = {"niters": 20, "expected_cells": 300, "ambient_rank_min": 2000, "ambient_rank_max": 15000}
    table = empty_drops_cell_ranger(counts.tocsr(), **ranks).table
    assert table["total"][raised] == retain
    ordmag = table["total"] >= retain
    assert table["p_value"][ordmag].isna().all() and (table["fdr"][ordmag] == 0).all()
    # 1,500,000 expected cells: rank 15,000 of 20,000, a total of 1 or 2, a tenth of it rounds to 0.
    few = empty_drops_cell_ranger(droplets().counts, niters=20, expected_cells=1_500_000, ambient_rank_min=2000)
    assert few.retain == 1


def test_cell_ranger_candidates_end_at_a_hundredth_of_the_median_ordmag_total():
    """DropletUtils' ``min.umi <- max(umi.min, round(umi.min.frac.median * totals[o[ncells.simple / 2]]))``
    with three ordmag cells (index 1: the largest total), and ``keep[o[(ncells.simple + 1):i.cand.last]]``
    counting down from rank 4 to 3 when no other barcode is above min.umi."""
    counts = droplets().counts.tolil()
    totals = np.asarray(counts.sum(axis=1)).ravel()
    top = np.argsort(-totals, kind="stable")[:3]
    # Three barcodes far above the rest, the only ordmag cells; the largest 60 times the others,
    # whose hundredth would let some 290 barcodes in.
    counts[top[:1]] = counts[top[:1]] * 1000
    counts[top[1:]] = counts[top[1:]] * 20
    table = empty_drops_cell_ranger(
        counts.tocsr(), niters=20, expected_cells=300, umi_min=30, ambient_rank_min=2000, ambient_rank_max=15000
    ).table
    totals = table["total"].to_numpy()
    assert round(0.01 * totals.max()) > np.sort(totals)[::-1][3]  # min.umi above every other barcode
    ranked = np.argsort(-totals, kind="stable")
    np.testing.assert_array_equal(np.flatnonzero(table["p_value"].notna()), np.sort(ranked[2:4]))
    # No barcode above umi.min: i.cand.last is 0, and R's (ncells.simple + 1):0 runs down to rank 1
    # (its index 0 selects nothing).
    table = empty_drops_cell_ranger(
        counts.tocsr(), niters=20, expected_cells=300, umi_min=10**9, ambient_rank_min=2000, ambient_rank_max=15000
    ).table
    np.testing.assert_array_equal(np.flatnonzero(table["p_value"].notna()), np.sort(ranked[:4]))


def test_refuses_data_without_ambient_counts():
    counts = droplets().counts
    with pytest.raises(InputError, match=r"^no counts in the ambient barcodes to estimate the ambient profile from$"):
        empty_drops(counts, lower=0, niters=10)
    with pytest.raises(InputError, match="by_rank"):
        empty_drops(counts, by_rank=counts.shape[0], niters=10)


def test_by_rank_is_lower_at_the_total_ranked_just_below_it():
    """DropletUtils' by.rank: the ambient droplets are those at or below the total of the barcode
    ranked by_rank + 1 (its .get_lower), so by_rank = 600 is lower = that total (without R)."""
    counts = droplets().counts
    totals = np.asarray(counts.sum(axis=1)).ravel()
    at_rank = int(np.sort(totals)[::-1][600])
    assert (totals > at_rank).sum() <= 600 < (totals >= at_rank).sum()
    by_rank = empty_drops(counts, by_rank=600, niters=20, retain=2000)
    by_lower = empty_drops(counts, lower=at_rank, niters=20, retain=2000)
    pd.testing.assert_frame_equal(by_rank.table, by_lower.table)
    np.testing.assert_array_equal(by_rank.ambient, by_lower.ambient)


def test_philox_known_answers():
    """Random123's known-answer vectors of Philox4x32-10."""
    words = [np.uint64(w) for w in (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)]
    assert [int(w) for w in montecarlo.philox(*words)] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    zero = np.uint64(0)
    assert [int(w) for w in montecarlo.philox(*[zero] * 6)] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_alias_table_draws_the_distribution():
    prob = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    accept, alias = montecarlo.alias_table(prob)
    recovered = accept / prob.size
    np.add.at(recovered, alias, (1 - accept) / prob.size)
    np.testing.assert_allclose(recovered, prob)


def test_seed_changes_p_values_and_threads_do_not():
    counts = droplets().counts
    first = empty_drops(counts, niters=300, seed=1).table["p_value"]
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        pd.testing.assert_series_equal(first, empty_drops(counts, niters=300, seed=1).table["p_value"])
    finally:
        numba.set_num_threads(threads)
    assert not first.equals(empty_drops(counts, niters=300, seed=2).table["p_value"])


# Runs under Numba's CUDA simulator (set before numba.cuda is imported, hence a subprocess).
CUDASIM_SCRIPT = """
import math
import numpy as np
from scipy import sparse
from omicsprep.cells import emptydrops, montecarlo
from omicsprep.cells.montecarlo_cuda import count_gpu
rng = np.random.default_rng(0)
ambient = rng.dirichlet(np.full(60, 0.3)) + 1e-6
ambient /= ambient.sum()
group_totals = np.array([1, 2, 7, 30, 120])
group_sizes = np.array([3, 5, 10, 20, 20])
for alpha in (math.inf, 5.0):
    totals = np.repeat(group_totals, group_sizes)
    draws = [rng.multinomial(t, ambient if alpha == math.inf else rng.dirichlet(alpha * ambient)) for t in totals]
    observed = sparse.csr_matrix(np.array(draws))
    data_p = emptydrops._data_log_prob(observed, np.arange(observed.shape[0]), ambient, alpha)
    sorted_p = np.concatenate([np.sort(p) for p in np.split(data_p, np.cumsum(group_sizes)[:-1])])
    inputs = montecarlo.simulation_inputs(ambient, alpha, group_totals, group_sizes, sorted_p)
    cpu = montecarlo.count_cpu(200, (7, 1), alpha, *inputs)
    gpu = count_gpu(200, (7, 1), alpha, *inputs, xp=np)
    assert np.array_equal(cpu, gpu), (cpu, gpu)
    assert (cpu > 0).sum() > 20, cpu
print("ok")
"""


def test_cuda_kernel_counts_like_the_cpu_kernel():
    result = subprocess.run(
        [sys.executable, "-c", CUDASIM_SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
        check=False,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


@pytest.mark.gpu
def test_gpu_backend_gives_the_cpu_p_values(pytestconfig):
    import_for_gpu_test(pytestconfig, "cupy")
    counts = generate_raw_droplets(2000, 100_000, 10_000, seed=4).counts
    runs = {
        "empty_drops": lambda backend: empty_drops(counts, niters=2000, retain=1000, backend=backend),
        "cell_ranger": lambda backend: empty_drops_cell_ranger(
            counts, niters=2000, expected_cells=2000, backend=backend
        ),
    }
    for name, run in runs.items():
        cpu, gpu = run("cpu"), run("gpu")
        differ = int((cpu.table["p_value"] != gpu.table["p_value"])[cpu.table["p_value"].notna()].sum())
        print(f"\nMEASURE test_emptydrops_gpu_{name} p_values_differing={differ}", flush=True)
        pd.testing.assert_frame_equal(cpu.table, gpu.table)
        assert cpu.alpha == gpu.alpha
