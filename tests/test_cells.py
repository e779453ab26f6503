"""Cell calling and ambient RNA removal through the pipeline step, against the planted truth of
generated raw droplets (the demo's: 300 cells of 6 types among 15,000 barcodes)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from anndata import AnnData
from conftest import DROPLETS_H5, DROPLETS_TRUTH, PBMC_H5
from scipy import sparse

from omicsprep import io
from omicsprep.cells.pipeline import run_call_cells
from omicsprep.errors import InputError
from omicsprep.options import AmbientOptions, CellOptions, EmptyDropsCrOptions, SoupxOptions
from omicsprep.protein.normalization import background_droplets
from omicsprep.testing.droplets import generate_raw_droplets

# Cells with at least this many UMIs are clear cells (the truth's smallest has 300; every
# empty droplet fewer than 700).
CLEAR_CELL_TOTAL = 700


@pytest.fixture(scope="module")
def raw():
    return io.read_counts(DROPLETS_H5)


@pytest.fixture(scope="module")
def truth():
    return pd.read_parquet(DROPLETS_TRUTH)


@pytest.fixture(scope="module")
def planted_markers(raw) -> list[np.ndarray]:
    """Each type's marker genes as planted: the demo droplets are generated again (resources/demo/README.md)."""
    droplets = generate_raw_droplets(300, 15_000, 2_000, seed=1)
    assert abs(droplets.counts - raw.X).sum() == 0  # the demo's droplets
    return droplets.markers


def call(raw, **options):
    ambient = options.pop("ambient", AmbientOptions())
    return run_call_cells(
        raw.copy(), filtered=None, cellbender=None, options=CellOptions(ambient=ambient, **options), backend="cpu"
    )


def clear_cells(raw):
    """A copy of the barcodes with at least ``CLEAR_CELL_TOTAL`` UMIs: cells, whatever the calling."""
    return raw[np.asarray(raw.X.sum(axis=1)).ravel() >= CLEAR_CELL_TOTAL].copy()


def recall_and_precision(table: pd.DataFrame, truth: pd.DataFrame, *, clear_total: float) -> tuple[float, float]:
    """Recall of the cells with at least ``clear_total`` UMIs, precision of all called."""
    clear = truth["is_cell"] & (truth["total"] >= clear_total)
    called = table["is_cell"].reindex(truth.index)
    return float(called[clear].mean()), float(truth["is_cell"][called].mean())


@pytest.mark.parametrize("method", ["emptydrops", "emptydrops_cr", "knee"])
def test_cells_recovered(raw, truth, method):
    # Cell Ranger's ambient pool (ranks 45,000-90,000 by default) must lie within 15,000 barcodes.
    extra = (
        {"expected_cells": 300, "emptydrops_cr": EmptyDropsCrOptions(ambient_rank_min=2_000, ambient_rank_max=10_000)}
        if method == "emptydrops_cr"
        else {}
    )
    cells, calls = call(raw, method=method, **extra)
    # The knee is conservative by design: only cells above it are clear to that method.
    clear_total = calls.ranks.knee if method == "knee" else CLEAR_CELL_TOTAL
    recall, precision = recall_and_precision(calls.table, truth, clear_total=clear_total)
    assert recall >= 0.99 and precision >= 0.99, (method, recall, precision)
    assert cells.n_obs == int(calls.table["is_cell"].sum())
    assert list(calls.table.columns[:2]) == ["total", "rank"]
    assert cells.uns["cells"]["method"] == method


def test_emptydrops_cr_is_cell_rangers_test_with_its_settings(raw):
    """Method ``emptydrops_cr`` runs Cell Ranger's variant (its candidates and ambient ranks),
    whose table is not plain emptyDrops'."""
    from omicsprep.cells import emptydrops
    from omicsprep.cells.calling import TEST_COLUMNS, call_cells

    cr = EmptyDropsCrOptions(ambient_rank_min=2_000, ambient_rank_max=10_000)
    options = CellOptions(method="emptydrops_cr", expected_cells=300, emptydrops_cr=cr, niters=2_000)
    table = call_cells(raw, options=options, backend="cpu").table
    direct = emptydrops.empty_drops_cell_ranger(
        raw.X, expected_cells=300, max_percentile=cr.max_percentile, max_min_ratio=cr.max_min_ratio,
        umi_min=cr.umi_min, umi_min_frac_median=cr.umi_min_frac_median, candidates_max=cr.candidates_max,
        ambient_rank_min=cr.ambient_rank_min, ambient_rank_max=cr.ambient_rank_max, niters=2_000, seed=0,
        backend="cpu",
    ).table  # fmt: skip
    columns = list(TEST_COLUMNS)
    pd.testing.assert_frame_equal(
        table[columns].reset_index(drop=True), direct[columns].reset_index(drop=True), check_dtype=False
    )
    plain = call_cells(raw, options=CellOptions(niters=2_000), backend="cpu").table
    assert not plain[columns].equals(table[columns])


@pytest.mark.parametrize("method", ["emptydrops", "emptydrops_cr"])
def test_every_emptydrops_setting_reaches_its_test(method, monkeypatch):
    """Each of ``cells``' settings (and the backend) reaches emptyDrops or Cell Ranger's variant (stand-ins)."""
    from omicsprep.cells import emptydrops
    from omicsprep.cells.calling import TEST_COLUMNS, call_cells

    asked: list[dict] = []

    def stand_in(counts, **settings):
        asked.append(settings)
        table = pd.DataFrame({column: np.zeros(counts.shape[0]) for column in TEST_COLUMNS})
        return emptydrops.EmptyDropsResult(table=table, ambient=np.zeros(counts.shape[1]), alpha=np.inf, retain=None)

    monkeypatch.setattr(emptydrops, "empty_drops" if method == "emptydrops" else "empty_drops_cell_ranger", stand_in)
    droplets = _droplets([*range(98, 158), *[10] * 300])
    common = {"niters": 777, "seed": 3, "backend": "cpu"}
    if method == "emptydrops":
        settings = {"lower": 10, "test_ambient": True, "ignore": 5, "by_rank": 50}
        for retain, expected in ((None, 100.0), (60.0, 60.0)):  # the knee unless set
            options = CellOptions(method=method, retain=retain, niters=777, seed=3, **settings)
            call_cells(droplets, options=options, backend="cpu")
            assert asked.pop() == {**settings, **common, "retain": expected}
        return
    cr = {
        "max_percentile": 0.9, "max_min_ratio": 5.0, "umi_min": 45, "umi_min_frac_median": 0.02,
        "candidates_max": 100, "ambient_rank_min": 70, "ambient_rank_max": 300,
    }  # fmt: skip
    for given, expected in ((None, 3000), (200, 200)):  # Cell Ranger's 3,000 unless set
        options = CellOptions(
            method=method, lower=10, expected_cells=given, niters=777, seed=3, emptydrops_cr=EmptyDropsCrOptions(**cr)
        )
        call_cells(droplets, options=options, backend="cpu")
        assert asked.pop() == {**cr, **common, "expected_cells": expected}


def test_emptydrops_table(raw, truth):
    _, calls = call(raw, niters=2_000)
    table = calls.table
    tested = table["total"] > 100
    assert table.loc[tested, "p_value"].notna().all() and table.loc[~tested, "p_value"].isna().all()
    assert ((table["p_value"] >= 1 / 2_001) | table["p_value"].isna()).all()
    # The ambient profile is the empty droplets' pooled expression: the planted one.
    assert np.corrcoef(calls.ambient, np.asarray(raw.X[~truth["is_cell"].to_numpy()].sum(axis=0)).ravel())[0, 1] > 0.999


def test_filtered_input_keeps_its_cells(raw, truth):
    filtered = raw[truth["is_cell"].to_numpy()][:250].copy()
    cells, calls = run_call_cells(raw.copy(), filtered=filtered, cellbender=None, options=CellOptions(), backend="cpu")
    assert set(cells.obs_names) == set(filtered.obs_names)
    assert (calls.table["method"] == "input").all()


# SoupX's default tf-idf cut-off (1.0) finds 5 markers here (each type's markers are detected
# in many other cells through the ambient RNA), too few for a stable estimate; SoupX advises
# lowering it then.
AMBIENT = {
    "soupx": AmbientOptions(method="soupx", soupx=SoupxOptions(tfidf_min=0.5)),
    "decontx": AmbientOptions(method="decontx"),
}


@pytest.mark.parametrize("method", list(AMBIENT))
def test_ambient_removed(raw, truth, planted_markers, method):
    cells, calls = call(raw, ambient=AMBIENT[method])
    assert (cells.layers["counts_uncorrected"] - cells.X).min() >= -1e-4  # only removes
    planted = truth.loc[cells.obs_names, "ambient_fraction"]
    estimated = cells.obs["ambient_fraction"]
    assert abs(estimated.mean() - planted.mean()) <= 0.03, (estimated.mean(), planted.mean())
    assert calls.table.loc[cells.obs_names, "ambient_fraction"].notna().all()
    # Each type's marker genes in cells of other types: ambient UMIs only, at least 80% removed.
    cell_type = truth.loc[cells.obs_names, "cell_type"].to_numpy()
    before = after = 0.0
    for kind, genes in enumerate(planted_markers):
        others = cell_type != kind
        before += cells.layers["counts_uncorrected"][others][:, genes].sum()
        after += cells.X[others][:, genes].sum()
    assert after <= 0.2 * before, (method, after, before)


def test_bad_droplets():
    filtered = io.read_counts(PBMC_H5)
    with pytest.raises(
        InputError,
        match=r"has no empty droplets: all \d+ barcodes have more than cells\.lower = 5 UMIs "
        r"\(a filtered matrix given as raw\?\)$",
    ):
        run_call_cells(filtered, filtered=None, cellbender=None, options=CellOptions(lower=5), backend="cpu")


def test_bad_droplets_options(raw):
    with pytest.raises(InputError, match="expected_cells = 20000 is more than the 15000 barcodes"):
        call(raw, method="emptydrops_cr", expected_cells=20_000)
    with pytest.raises(InputError, match=r"no barcode has more than cells\.lower = 100000 UMIs"):
        call(raw, lower=100_000)
    with pytest.raises(InputError, match="no cell called"):
        call(raw, niters=100, fdr=1e-9, retain=1e9)  # p-values are at least 1/101


def test_raw_genes_must_match_the_filtered_input(raw, truth):
    """Genes missing from the input: one error naming the first; the same genes in another order: another."""
    cells = raw[truth["is_cell"].to_numpy()]
    first = sorted(raw.var_names[:10])[0]
    message = (
        rf"^the raw matrix's genes differ from the input's \({raw.n_vars} vs {raw.n_vars - 10} genes; "
        rf"10 in one only, e\.g\. '{re.escape(first)}'\)$"
    )
    for filtered, expected in (
        (cells[:, 10:], message),
        (cells[:, np.arange(raw.n_vars)[::-1]], r"^the raw matrix's genes are in another order than the input's$"),
    ):
        with pytest.raises(InputError, match=expected):
            run_call_cells(raw.copy(), filtered=filtered.copy(), cellbender=None, options=CellOptions(), backend="cpu")


def test_dsb_background_from_raw_droplets():
    """Droplets at either end of the range count (10 and 100 tags for 10^1 to 10^2); barcodes the
    calls table lacks are not cells, whatever its order; an empty droplet's log10(0) warns nothing."""
    import warnings

    from scipy import sparse

    totals = np.array([0, 9, 10, 60, 100, 101, 80, 50])
    tags = AnnData(sparse.csr_matrix(np.stack([totals // 2, totals - totals // 2], axis=1)))
    tags.obs_names = [f"b{i}" for i in range(len(totals))]
    # b6 is a cell; b7 is not in the table (not a cell); the table runs backwards.
    is_cell = pd.Series([False, False, False, False, False, False, True][::-1], index=tags.obs_names[:7][::-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        background = background_droplets(tags, is_cell=is_cell, log10_library=(1.0, 2.0))
    assert list(background.obs_names) == ["b2", "b3", "b4", "b7"]
    with pytest.raises(InputError) as error:
        background_droplets(tags, is_cell=is_cell, log10_library=(4.0, 4.5))
    assert str(error.value) == (
        "no empty droplet with an antibody total of 10^4 to 10^4.5 among 8 barcodes for dsb's background "
        "(protein.dsb.background_log10_library)"
    )


@pytest.mark.gpu
def test_call_cells_on_the_gpu_calls_the_same_cells(raw, request):
    """The whole step on both backends: emptyDrops' Monte Carlo from one stream gives the same
    p-values; DecontX on each backend's quick clustering (cuGraph or igraph Leiden) gives close
    contamination."""
    from conftest import import_for_gpu_test

    import_for_gpu_test(request.config, "cupy")
    options = CellOptions(ambient=AmbientOptions(method="decontx"))
    results = {
        backend: run_call_cells(raw.copy(), filtered=None, cellbender=None, options=options, backend=backend)
        for backend in ("cpu", "gpu")
    }
    (cpu_cells, cpu_calls), (gpu_cells, gpu_calls) = results["cpu"], results["gpu"]
    pd.testing.assert_series_equal(cpu_calls.table["p_value"], gpu_calls.table["p_value"])
    assert (cpu_calls.table["is_cell"] == gpu_calls.table["is_cell"]).all()
    difference = (cpu_cells.obs["ambient_fraction"] - gpu_cells.obs["ambient_fraction"]).abs()
    print(f"\nMEASURE test_call_cells_gpu ambient_fraction_max_difference={difference.max():.2e}", flush=True)
    assert difference.mean() < 0.01


@pytest.mark.parametrize("method", list(AMBIENT))
def test_64_bit_indices_give_the_same_cells_and_ambient_removal_on_the_cpu(raw, method):
    # Beyond 2^31 entries SciPy holds the droplets with 64-bit indices: emptyDrops, the quick
    # clustering and SoupX or DecontX (its index pointers kept 64-bit on the host) give what
    # they give with 32-bit ones.
    from conftest import widened

    wide_raw = raw.copy()
    wide_raw.X = widened(sparse.csr_matrix(wide_raw.X))
    # emptyDrops' 2,000 draws, not 10,000: the test compares two runs of one seed.
    wide, wide_calls = call(wide_raw, ambient=AMBIENT[method], niters=2000)
    narrow, narrow_calls = call(raw, ambient=AMBIENT[method], niters=2000)
    pd.testing.assert_frame_equal(wide_calls.table, narrow_calls.table)
    assert abs(wide.X - narrow.X).max() < 1e-6
    pd.testing.assert_series_equal(wide.obs["ambient_fraction"], narrow.obs["ambient_fraction"])
    # SciPy narrows the called cells' indices again (they fit): their removal on 64-bit ones.
    from omicsprep.cells import ambient

    again = narrow.copy()
    again.X = widened(sparse.csr_matrix(narrow.layers["counts_uncorrected"]))
    ambient.remove_ambient(again, raw=wide_raw, options=AMBIENT[method], seed=CellOptions().seed, backend="cpu")
    assert abs(again.X - narrow.X).max() < 1e-6


@pytest.mark.parametrize("method", list(AMBIENT))
def test_soupx_and_decontx_beyond_one_gpu_matrix_are_one_clear_error_before_any_gpu_work(raw, monkeypatch, method):
    # Their GPU code holds every count in one CuPy matrix: beyond its 32-bit indices (the limit
    # lowered here) the rule stops with one line, before the quick clustering touches a GPU.
    from omicsprep import backend
    from omicsprep.cells import ambient

    cells = clear_cells(raw)
    monkeypatch.setattr(backend.placement, "GPU_SPARSE_MAX_ENTRIES", cells.X.nnz - 1)
    with pytest.raises(InputError) as error:
        ambient.remove_ambient(cells, raw=raw, options=AMBIENT[method], seed=0, backend="gpu")
    assert str(error.value) == (
        f"{method} on the GPU takes at most {cells.X.nnz - 1:,} non-zero counts, and the {cells.n_obs:,} cells "
        f"hold {cells.X.nnz:,}: run rule call_cells on the CPU (backend_per_rule: {{call_cells: cpu}})"
    )


def test_soupx_with_a_fixed_contamination_takes_its_soup_from_the_range_set(raw):
    """``soupx.contamination`` set: that share is removed (not estimated), with the soup of the
    droplets in ``soupx.soup_range``."""
    from dataclasses import replace

    from omicsprep.cells import ambient, soupx

    cells = clear_cells(raw)
    counts = sparse.csr_matrix(cells.X)
    options = replace(AMBIENT["soupx"], soupx=replace(AMBIENT["soupx"].soupx, contamination=0.2, soup_range=(5, 50)))
    clusters = ambient.quick_clusters(cells, resolution=options.cluster_resolution, seed=0, backend="cpu")
    ambient.remove_ambient(cells, raw=raw, options=options, seed=0, backend="cpu")
    assert cells.uns["ambient"]["contamination"] == 0.2
    soup = soupx.soup_profile(sparse.csr_matrix(raw.X), soup_range=(5, 50))
    expected = soupx.remove_soup(counts, soup, rho=0.2, clusters=clusters, backend="cpu")
    np.testing.assert_allclose(cells.X.toarray(), expected.toarray(), rtol=1e-6, atol=1e-6)  # float32 counts


def test_soupx_estimates_its_contamination_with_every_setting_given(raw, monkeypatch):
    """Each of ``cells.ambient.soupx``'s settings reaches SoupX's estimate (here a stand-in), and the
    backend its removal."""
    from types import SimpleNamespace

    from omicsprep.cells import ambient, soupx

    asked = {}

    def estimate(counts, soup, **settings):
        asked.update(settings)
        return SimpleNamespace(rho=0.1)

    monkeypatch.setattr(soupx, "estimate_contamination", estimate)
    removal = soupx.remove_soup
    backends = []

    def remove_soup(*args, **kwargs):
        backends.append(kwargs.get("backend"))
        return removal(*args, **kwargs)

    monkeypatch.setattr(soupx, "remove_soup", remove_soup)
    settings = {
        "tfidf_min": 0.7,
        "soup_quantile": 0.8,
        "max_markers": 7,
        "contamination_range": (0.02, 0.5),
        "rho_max_fdr": 0.3,
        "prior_rho": 0.1,
        "prior_rho_std_dev": 0.2,
    }
    cells = clear_cells(raw)
    options = AmbientOptions(method="soupx", soupx=SoupxOptions(**settings))
    ambient.remove_ambient(cells, raw=raw, options=options, seed=0, backend="cpu")
    assert asked.pop("clusters").shape == (cells.n_obs,)
    assert asked == settings
    assert cells.uns["ambient"]["contamination"] == 0.1
    assert backends == ["cpu"]  # the rule's backend reaches the removal


def test_decontx_runs_with_every_setting_given(raw, monkeypatch):
    """Each of ``cells.ambient.decontx``'s settings reaches DecontX (here a stand-in that removes
    nothing), and its iterations go to ``uns["ambient"]``."""
    from types import SimpleNamespace

    from omicsprep.cells import ambient, decontx
    from omicsprep.options.counting import DecontxOptions

    asked = {}

    def run(counts, **settings):
        asked.update(settings)
        return SimpleNamespace(corrected=counts, iterations=3)

    monkeypatch.setattr(decontx, "decontx", run)
    settings = {"max_iter": 9, "delta": (5.0, 20.0), "estimate_delta": False, "convergence": 0.01, "seed": 7}
    cells = clear_cells(raw)
    options = AmbientOptions(method="decontx", decontx=DecontxOptions(**settings))
    ambient.remove_ambient(cells, raw=raw, options=options, seed=0, backend="cpu")
    assert asked.pop("clusters").shape == (cells.n_obs,)
    assert asked == {**settings, "backend": "cpu"}
    assert cells.uns["ambient"]["iterations"] == 3 and (cells.obs["ambient_fraction"] == 0).all()


def test_soupx_refusing_is_one_error_naming_its_settings(raw):
    """SoupX's own refusal (here: no droplet in its soup range) becomes one input error that
    names the settings to change."""
    from dataclasses import replace

    from omicsprep.cells import ambient

    cells = clear_cells(raw)
    options = replace(AMBIENT["soupx"], soupx=replace(AMBIENT["soupx"].soupx, soup_range=(10**8, 10**9)))
    with pytest.raises(InputError, match=r"^SoupX: .+ \(cells\.ambient\.soupx; or set its contamination\)$"):
        ambient.remove_ambient(cells, raw=raw, options=options, seed=0, backend="cpu")


def test_another_modality_keeps_the_barcodes_called_on_the_rna():
    """Antibody tags keep the barcodes the RNA's calls call cells, in their own order; a barcode
    the calls lack is not a cell; none kept is one error."""

    from omicsprep.cells.calling import called_cells

    tags = AnnData(np.arange(12, dtype=np.float32).reshape(4, 3))
    tags.obs_names = ["a", "b", "c", "d"]
    is_cell = pd.Series([True, False, True, True], index=["c", "a", "b", "z"])
    kept = called_cells(tags, is_cell=is_cell)
    assert kept.obs_names.tolist() == ["b", "c"]
    np.testing.assert_array_equal(kept.X, tags.X[[1, 2]])
    with pytest.raises(InputError, match="none of the 4 barcodes is among the cells called on the RNA"):
        called_cells(tags, is_cell=pd.Series([False, True], index=["a", "z"]))


def _droplets(totals: list[int]) -> AnnData:
    """Barcodes whose counts add up to ``totals``, spread over 20 genes."""

    counts = np.zeros((len(totals), 20), dtype=np.float32)
    for row, total in enumerate(totals):
        counts[row] = np.bincount(np.arange(total) % 20, minlength=20)
    droplets = AnnData(sparse.csr_matrix(counts))
    droplets.obs_names = [f"B{row}" for row in range(len(totals))]
    return droplets


@pytest.mark.parametrize("method", ["knee", "emptydrops"])
def test_methods_that_need_a_knee_say_so_when_the_totals_have_none(method):
    """One total above cells.lower: no knee to find, which knee and emptyDrops need, one error."""
    from omicsprep.cells.calling import call_cells

    droplets = _droplets([row % 11 for row in range(250)] + [500] * 50)
    with pytest.raises(InputError, match=r"^barcode ranks: insufficient unique points .* \(cells\.lower = 100\)$"):
        call_cells(droplets, options=CellOptions(method=method), backend="cpu")


def test_method_none_takes_every_barcode_with_counts_and_needs_no_empty_droplet():
    """``cells.method: none`` (a filtered matrix): no knee needed, none of the raw-matrix checks."""
    from omicsprep.cells.calling import TEST_COLUMNS, call_cells

    table = call_cells(_droplets([150, 500, 500, 800]), options=CellOptions(method="none"), backend="cpu").table
    assert table["is_cell"].all() and table["rank"].tolist() == [4, 2.5, 2.5, 1]
    assert table.index.name == "barcode"
    # Untested, the test's columns are float NaN: numbers in the barcode table's Parquet, not nulls.
    assert [str(table[column].dtype) for column in TEST_COLUMNS] == ["float64"] * 4
    assert table[list(TEST_COLUMNS)].isna().all().all()


def test_method_none_calls_barcodes_with_a_count_and_shows_the_soup_of_those_up_to_lower():
    """Method ``none``: a barcode of one UMI is a cell, one of none is not. The ambient profile is
    the pooled counts of the barcodes with 1 to ``cells.lower`` UMIs (here 100, not 101), and with
    too few totals above ``lower`` for a knee the ranks stand alone (knee and inflection NaN)."""
    from omicsprep.cells.calling import call_cells

    droplets = _droplets([0, 1, 60, 60, 100, 101, 500])
    calls = call_cells(droplets, options=CellOptions(method="none"), backend="cpu")
    assert calls.table["is_cell"].tolist() == [False, True, True, True, True, True, True]
    soup = np.asarray(droplets.X[1:5].sum(axis=0, dtype=np.float64)).ravel()  # totals 1, 60, 60 and 100
    np.testing.assert_allclose(calls.ambient, soup / soup.sum(), rtol=1e-12)
    assert calls.table["rank"].tolist() == [7, 6, 4.5, 4.5, 3, 2, 1]
    assert np.isnan(calls.ranks.knee) and np.isnan(calls.ranks.inflection) and np.isnan(calls.ranks.fitted).all()
    np.testing.assert_array_equal(calls.ranks.rank, calls.table["rank"])


def test_no_barcode_up_to_lower_leaves_the_ambient_profile_not_a_number():
    from omicsprep.cells.calling import call_cells

    ambient = call_cells(_droplets([150, 500]), options=CellOptions(method="none"), backend="cpu").ambient
    assert ambient.dtype == np.float64 and ambient.shape == (20,) and np.isnan(ambient).all()


def test_the_knee_takes_the_curve_above_lower_and_a_barcode_at_the_knee_is_a_cell():
    """Knee calling with ``cells.lower = 10`` on totals whose curve lies between 98 and 157 UMIs:
    the knee is at 100 (DropletUtils' default lower, 100, would leave it out of the curve), and
    the barcode of 100 UMIs is a cell. The empty droplets have exactly ``lower`` UMIs (at most
    ``lower``: empty), and as many cells may be expected as there are barcodes."""
    from omicsprep.cells.calling import call_cells

    droplets = _droplets([*range(98, 158), *[10] * 300])
    options = CellOptions(method="knee", lower=10, expected_cells=droplets.n_obs)
    calls = call_cells(droplets, options=options, backend="cpu")
    table = calls.table
    assert calls.ranks.knee == 100  # 10 ** log10(100), exactly
    np.testing.assert_array_equal(table["is_cell"], table["total"] >= 100)
    assert table.loc[table["total"] == 100, "is_cell"].all() and table["is_cell"].sum() == 58


def test_a_knee_above_its_total_by_rounding_leaves_that_barcode_out_as_r_does():
    """DropletUtils' knee is 10 ** log10 of a total: 1985.0000000000002 on the demo droplets. R's
    ``total >= knee`` leaves the barcode of 1,985 UMIs out; so do the calls, from float32 counts
    (whose float32 totals rounded the knee to 1985) as from float64 ones."""
    from omicsprep.cells.calling import call_cells

    raw = io.read_counts(DROPLETS_H5)
    calls = {}
    for dtype in (np.float32, np.float64):
        droplets = raw.copy()
        droplets.X = droplets.X.astype(dtype)
        calls[dtype] = call_cells(droplets, options=CellOptions(method="knee"), backend="cpu")
    knee = calls[np.float64].ranks.knee
    assert knee == 10 ** np.log10(1985) > 1985
    for found in calls.values():
        table = found.table
        assert (table["total"] == 1985).sum() == 1 and not table.loc[table["total"] == 1985, "is_cell"].any()
    pd.testing.assert_frame_equal(calls[np.float32].table, calls[np.float64].table)


def test_the_step_passes_its_settings_on_and_records_the_calls_and_their_provenance(monkeypatch):
    """run_call_cells hands the backend to the calling, and the ambient options, CellBender's output,
    the seed and the backend to the removal (stand-ins record them); each cell's ambient fraction
    goes to the calls' table (NaN for the other barcodes); the summary and provenance are kept."""
    import json
    from dataclasses import asdict

    from omicsprep.cells import ambient, calling

    asked = {}
    call_cells = calling.call_cells

    def calling_stand_in(raw, **kwargs):
        asked["calling"] = kwargs["backend"]
        return call_cells(raw, **kwargs)

    def removal(cells, **kwargs):
        asked["removal"] = kwargs
        if kwargs["options"].method != "none":  # as remove_ambient: no fraction without a removal
            cells.obs["ambient_fraction"] = 0.25

    monkeypatch.setattr(calling, "call_cells", calling_stand_in)
    monkeypatch.setattr(ambient, "remove_ambient", removal)
    droplets, cellbender = _droplets([*range(98, 158), *[10] * 300]), AnnData(np.zeros((1, 1)))
    options = CellOptions(method="knee", lower=10, seed=7, ambient=AmbientOptions(method="decontx"))
    cells, calls = run_call_cells(droplets, filtered=None, cellbender=cellbender, options=options, backend="cpu")
    assert asked["calling"] == "cpu"
    removed = asked["removal"]
    assert removed.pop("raw") is droplets and removed.pop("cellbender_output") is cellbender
    assert removed == {"options": options.ambient, "seed": 7, "backend": "cpu"}
    fractions = calls.table["ambient_fraction"]
    assert (fractions[calls.table["is_cell"]] == 0.25).all() and fractions[~calls.table["is_cell"]].isna().all()
    assert fractions.dtype == np.float64
    assert cells.uns["cells"] == {
        "method": "knee", "n_cells": 58, "n_barcodes": 360, "knee": 100.0, "inflection": calls.ranks.inflection,
    }  # fmt: skip
    record = cells.uns["omicsprep"]["call_cells"]
    assert record["backend"] == "cpu"
    assert json.loads(record["params"]) == json.loads(json.dumps(asdict(options), default=str))
    assert set(record["timings"]) == {"call_cells", "ambient"}
    # Without a removal the column is there, NaN throughout; a matrix of one barcode is summarized too.
    options = CellOptions(method="none")
    cells, calls = run_call_cells(_droplets([500]), filtered=None, cellbender=None, options=options, backend="cpu")
    assert list(calls.table.columns[-2:]) == ["method", "ambient_fraction"]
    assert calls.table["ambient_fraction"].isna().all()
    assert cells.uns["cells"]["method"] == "none" and cells.uns["cells"]["n_cells"] == 1


def test_the_quick_clusters_pass_the_seed_and_backend_to_every_step(raw, monkeypatch):
    """Each step of the pooling clusters gets the seed and backend given (wrappers record them)."""
    from omicsprep.cells import ambient

    asked = []

    def recording(module, name):
        step = getattr(module, name)

        def recorded(*args, **kwargs):
            asked.append((name, kwargs.get("seed", "-"), kwargs["backend"]))
            return step(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    for module, name in (
        (ambient, "to_device"), (ambient.preprocessing, "normalize"), (ambient.preprocessing, "highly_variable_genes"),
        (ambient.preprocessing, "pca"), (ambient.clustering, "neighbors"), (ambient.clustering, "cluster_graph"),
    ):  # fmt: skip
        recording(module, name)
    clusters = ambient.quick_clusters(clear_cells(raw), resolution=1.0, seed=7, backend="cpu")
    assert clusters.shape == (clear_cells(raw).n_obs,)
    assert asked == [
        ("to_device", "-", "cpu"), ("normalize", "-", "cpu"), ("highly_variable_genes", "-", "cpu"), ("pca", 7, "cpu"),
        ("neighbors", "-", "cpu"), ("cluster_graph", 7, "cpu"),
    ]  # fmt: skip


def test_the_quick_clusters_work_on_every_gene_some_cell_counts(raw, monkeypatch):
    """The pooling clusters' working copy leaves out the genes no cell counts (cuML's PCA refuses
    them) and keeps a gene that a single cell counts (a wrapper records the genes normalized)."""
    import anndata as ad

    from omicsprep.cells import ambient

    cells = clear_cells(raw)
    once = sparse.csr_matrix(([1.0], ([0], [0])), shape=(cells.n_obs, 1), dtype=cells.X.dtype)
    cells = ad.AnnData(
        sparse.hstack([cells.X, once, sparse.csr_matrix((cells.n_obs, 1), dtype=cells.X.dtype)], format="csr"),
        obs=cells.obs, var=pd.DataFrame(index=[*cells.var_names, "counted_once", "never_counted"]),
    )  # fmt: skip
    normalized = []
    normalize = ambient.preprocessing.normalize

    def recorded(adata, **kwargs):
        normalized.append(list(adata.var_names))
        return normalize(adata, **kwargs)

    monkeypatch.setattr(ambient.preprocessing, "normalize", recorded)
    ambient.quick_clusters(cells, resolution=1.0, seed=7, backend="cpu")
    counted = np.asarray((cells.X != 0).sum(axis=0)).ravel() > 0
    assert normalized == [list(cells.var_names[counted])]
    assert "counted_once" in normalized[0] and "never_counted" not in normalized[0]


def test_ambient_removal_passes_its_settings_on_and_summarizes_what_it_did(raw, monkeypatch):
    """The seed and backend reach the quick clusters, the backend SoupX (stand-ins record them);
    the summary counts the clusters; method none changes nothing; only the GPU caps the counts,
    at more than its largest matrix, checked before any clustering."""
    from omicsprep.cells import ambient

    asked = {}

    def clusters_stand_in(cells, **kwargs):
        asked["clusters"] = kwargs
        return np.arange(cells.n_obs) % 3

    def soupx_stand_in(counts, **kwargs):
        asked["soupx"] = kwargs
        return (counts * 0.9).astype(np.float64), 0.1  # float64, as SoupX's and DecontX's counts come

    monkeypatch.setattr(ambient, "quick_clusters", clusters_stand_in)
    monkeypatch.setattr(ambient, "_soupx", soupx_stand_in)
    cells = clear_cells(raw)
    monkeypatch.setattr(ambient, "max_gpu_sparse_entries", lambda: cells.X.nnz - 1)  # the CPU has no such cap
    options = AmbientOptions(method="soupx", cluster_resolution=0.7)
    untouched = cells.copy()
    ambient.remove_ambient(untouched, raw=raw, options=AmbientOptions(), seed=7, backend="cpu")
    assert abs(untouched.X - cells.X).max() == 0 and not untouched.layers and "ambient" not in untouched.uns
    ambient.remove_ambient(cells, raw=raw, options=options, seed=7, backend="cpu")
    assert asked["clusters"] == {"resolution": 0.7, "seed": 7, "backend": "cpu"}
    assert asked["soupx"]["backend"] == "cpu" and asked["soupx"]["options"] is options
    assert cells.uns["ambient"] == {
        "method": "soupx", "n_clusters": 3, "contamination": 0.1, "median_ambient_fraction": pytest.approx(0.1),
    }  # fmt: skip
    assert cells.X.dtype == np.float32
    # Each cell's fraction removed: 0 for a cell without counts, a cell of one UMI as any other.
    few = _droplets([0, 1, 10])
    monkeypatch.setattr(ambient, "_soupx", lambda counts, **kwargs: (counts * 0.5, 0.5))
    ambient.remove_ambient(few, raw=few, options=options, seed=7, backend="cpu")
    np.testing.assert_array_equal(few.obs["ambient_fraction"].to_numpy(dtype=float), [0.0, 0.5, 0.5])

    class Reached(Exception):
        pass

    def reached(cells, **kwargs):
        raise Reached

    monkeypatch.setattr(ambient, "quick_clusters", reached)
    for cap, outcome in ((clear_cells(raw).X.nnz, Reached), (clear_cells(raw).X.nnz - 1, InputError)):
        monkeypatch.setattr(ambient, "max_gpu_sparse_entries", lambda cap=cap: cap)
        with pytest.raises(outcome):
            ambient.remove_ambient(clear_cells(raw), raw=raw, options=options, seed=7, backend="gpu")


def test_a_barcode_at_the_fdr_threshold_is_a_cell(raw):
    """emptyDrops calls a barcode whose FDR equals ``cells.fdr`` a cell, as DropletUtils' users
    filter (``FDR <= 0.001``)."""
    from omicsprep.cells.calling import call_cells

    tested = np.sort(call_cells(raw, options=CellOptions(niters=2000), backend="cpu").table["fdr"].dropna().to_numpy())
    threshold = float(tested[len(tested) // 2])  # one barcode's FDR, exactly
    table = call_cells(raw, options=CellOptions(niters=2000, fdr=threshold), backend="cpu").table
    assert (table["fdr"] == threshold).any()
    pd.testing.assert_series_equal(table["is_cell"], table["fdr"] <= threshold, check_names=False)


def test_filtered_barcodes_missing_from_the_raw_matrix_are_one_error():
    from omicsprep.cells.calling import call_cells

    given = pd.Index(["B0", "X1", "X2"])
    with pytest.raises(
        InputError, match=r"^2 of the filtered matrix's barcodes are not in the raw matrix \('X1', \.\.\.\)$"
    ):
        call_cells(_droplets([0, 500, 800]), options=CellOptions(), given=given, backend="cpu")
