"""Barcode ranks, knee and inflection against DropletUtils' barcodeRanks, run live in R."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omicsprep.cells.ranks import BarcodeRanks, barcode_ranks, smooth_spline
from omicsprep.testing.droplets import generate_raw_droplets
from omicsprep.testing.reference_runs import missing_r_package, run_reference

BARCODE_RANKS_R = r"""
suppressMessages(library(DropletUtils))
args <- commandArgs(trailingOnly = TRUE)
for (path in args) {
    totals <- scan(path, quiet = TRUE)
    options <- scan(paste0(path, ".options"), quiet = TRUE)  # lower, exclude.from, df, fit.bounds
    bounds <- if (is.na(options[4])) NULL else options[4:5]
    result <- tryCatch(
        suppressWarnings(barcodeRanks(
            matrix(totals, nrow = 1),
            lower = options[1], exclude.from = options[2], df = options[3], fit.bounds = bounds
        )),
        error = function(e) conditionMessage(e)
    )
    if (is.character(result)) {
        writeLines(result, paste0(path, ".error"))
        next
    }
    meta <- metadata(result)
    write(sprintf("%.17g", c(meta$knee, meta$inflection)), paste0(path, ".points"), ncolumns = 1)
    write(sprintf("%.17g", result$rank), paste0(path, ".rank"), ncolumns = 1)
    write(sprintf("%.17g", result$fitted), paste0(path, ".fitted"), ncolumns = 1)
}
"""

SMOOTH_SPLINE_R = r"""
args <- commandArgs(trailingOnly = TRUE)
xy <- read.table(args[1])
fit <- suppressWarnings(smooth.spline(xy[, 1], xy[, 2], df = as.numeric(args[2])))
write(sprintf("%.17g", c(fit$df, fit$x, fit$y, predict(fit, deriv = 2)$y, fit$spar)), args[3], ncolumns = 1)
"""


needs_r = pytest.mark.skipif(
    missing_r_package("DropletUtils") is not None, reason=str(missing_r_package("DropletUtils"))
)


def _real_like_totals(seed: int) -> np.ndarray:
    """A 10x-like curve unlike generate's: 5,000 cells (log-normal, median 4,000) over 200,000 ambient droplets."""
    rng = np.random.default_rng(seed)
    cells = rng.lognormal(np.log(4_000), 0.8, 5_000)
    ambient = rng.negative_binomial(0.4, 0.05, 200_000)
    return np.rint(np.concatenate([cells, ambient]))


def _generated_totals(n_cells: int, n_barcodes: int, seed: int) -> np.ndarray:
    return generate_raw_droplets(n_cells, n_barcodes, 500, seed=seed).truth["total"].to_numpy()


CASES: dict[str, tuple[Callable[[], np.ndarray], dict[str, Any]]] = {
    "cells500_barcodes30000": (lambda: _generated_totals(500, 30_000, 1), {}),
    "cells3000_barcodes100000": (lambda: _generated_totals(3_000, 100_000, 2), {}),
    "cells300_barcodes20000": (lambda: _generated_totals(300, 20_000, 3), {}),
    "real_like": (lambda: _real_like_totals(4), {}),
    "options": (lambda: _generated_totals(500, 30_000, 1), {"lower": 50, "exclude_from": 100, "df": 12.5}),
    "fit_bounds": (lambda: _real_like_totals(5), {"fit_bounds": (300.0, 20_000.0)}),
    # Totals at the fit's bounds: left out of the fit (R compares strictly).
    "fit_bounds_at_totals": (
        lambda: np.concatenate([_real_like_totals(5), [300, 20_000]]),
        {"fit_bounds": (300.0, 20_000.0)},
    ),
    # Exactly 4 unique totals within the bounds: the fewest that R fits a spline to.
    "four_in_bounds": (
        lambda: np.array([5_000, 4_000, 3_000, 2_000, 1_000, 500, 300, 150] + [3] * 50),
        {"fit_bounds": (600.0, 4_500.0)},
    ),
    # 12 unique totals above 100: fewer than df=20 points to fit, so R's smooth.spline falls back to GCV.
    "few_unique": (
        lambda: np.array([5_000, 4_000, 3_500, 3_000, 2_000, 1_500, 900, 600, 400, 300, 200, 150] + [3] * 200),
        {},
    ),
    # 4 unique totals above 100: fewer than 4 points between the bounds, so no spline (knee at the left bound).
    "no_spline": (lambda: np.array([5_000, 4_000, 300, 150] + [3] * 50 + [1] * 50), {}),
    # 3 unique totals above 100, the least of them 101: the fewest DropletUtils goes on with.
    "three_unique": (lambda: np.array([5_000, 4_000, 101, 100] + [3] * 50 + [1] * 50), {}),
    # The steepest fall between ranks 50 and 51: exclude_from=50 skips the slope from rank 50 (R counts x <= it).
    "fall_at_exclude_from": (
        lambda: np.concatenate([np.linspace(10_000, 5_000, 50).round(), np.linspace(500, 200, 40).round(), [3] * 200]),
        {},
    ),
    # The flattest slope before the inflection lies right after it: R looks no further than the inflection.
    "flat_after_inflection": (
        lambda: np.array(
            [10_000 - 10 * i for i in range(50)] + [8_000, 4_000, 2_000, 1_000, 110, *range(109, 100, -1)] + [3] * 200
        ),
        {},
    ),
    # 2 unique totals above 100: DropletUtils stops.
    "too_few": (lambda: np.array([5_000, 5_000, 200] + [3] * 100), {}),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[np.ndarray, Path]]:
    """Totals of every case and the folder where R wrote its barcodeRanks of them."""
    folder = tmp_path_factory.mktemp("barcode_ranks")
    totals = {name: make() for name, (make, _) in CASES.items()}
    for name, values in totals.items():
        np.savetxt(folder / name, values, fmt="%d")
        options = {"lower": 100, "exclude_from": 50, "df": 20.0, "fit_bounds": (np.nan, np.nan)} | CASES[name][1]
        row = [options["lower"], options["exclude_from"], options["df"], *options["fit_bounds"]]
        np.savetxt(folder / f"{name}.options", [row])
    run_reference(["Rscript", "-e", BARCODE_RANKS_R, *(str(folder / name) for name in CASES)], folder, check=True)
    return {name: (values, folder / name) for name, values in totals.items()}


def _read_r(path: Path) -> np.ndarray:
    return np.genfromtxt(path, missing_values="NA", filling_values=np.nan)


@needs_r
@pytest.mark.parametrize("case", [name for name in CASES if name != "too_few"])
def test_barcode_ranks_match_dropletutils(reference: dict[str, tuple[np.ndarray, Path]], case: str) -> None:
    totals, r_prefix = reference[case]
    knee, inflection = _read_r(r_prefix.with_name(f"{case}.points"))
    ranks = barcode_ranks(totals, **CASES[case][1])
    # The knee and inflection are totals of the curve: equal, not merely close.
    assert ranks.knee == pytest.approx(knee, rel=1e-12)
    assert ranks.inflection == pytest.approx(inflection, rel=1e-12)
    np.testing.assert_array_equal(ranks.rank, _read_r(r_prefix.with_name(f"{case}.rank")))
    r_fitted = _read_r(r_prefix.with_name(f"{case}.fitted"))
    np.testing.assert_array_equal(np.isnan(ranks.fitted), np.isnan(r_fitted))
    np.testing.assert_allclose(ranks.fitted, r_fitted, rtol=1e-8)


@needs_r
def test_too_few_unique_totals_stop_as_in_dropletutils(reference: dict[str, tuple[np.ndarray, Path]]) -> None:
    totals, r_prefix = reference["too_few"]
    r_message = r_prefix.with_name("too_few.error").read_text().strip()
    with pytest.raises(ValueError, match=r_message):
        barcode_ranks(totals)


@needs_r
def test_smooth_spline_merges_close_x_as_r(tmp_path: Path) -> None:
    """x closer than R's tol (1e-6 IQR) are one point with the mean y, as R groups them; df=20 among 300 points."""
    rng = np.random.default_rng(5)
    x = np.sort(rng.uniform(0, 5, 300))
    x[100:110] = x[100] + np.arange(10) * 1e-9
    # Pairs at gaps about tol: which of them merge follows tol (its quartiles) to the percent.
    tol = 1e-6 * np.subtract(*np.percentile(x, [75, 25]))
    x[200:240:2] = x[201:241:2] - tol * np.linspace(0.3, 1.5, 20)
    y = np.sin(x) + rng.normal(0, 0.2, x.size)
    np.savetxt(tmp_path / "xy", np.column_stack([x, y]), fmt="%.17g")
    run_reference(
        ["Rscript", "-e", SMOOTH_SPLINE_R, str(tmp_path / "xy"), "20", str(tmp_path / "fit")], tmp_path, check=True
    )
    r_out = _read_r(tmp_path / "fit")
    fit = smooth_spline(x, y, df=20.0)
    n = len(fit.x)
    assert n == (len(r_out) - 2) // 3
    assert n < len(x)
    assert fit.df == pytest.approx(r_out[0], abs=1e-3)
    np.testing.assert_array_equal(fit.x, r_out[1 : n + 1])
    np.testing.assert_allclose(fit.y, r_out[n + 1 : 2 * n + 1], rtol=1e-8)
    np.testing.assert_allclose(fit.derivative(fit.x, 2), r_out[2 * n + 1 : 3 * n + 1], rtol=1e-6, atol=1e-8)


@needs_r
@pytest.mark.parametrize(
    ("df", "rtol", "spar_tol"),
    [(20.0, 1e-8, 1e-6), (1.0, 1e-8, 1e-6), (1.5, 1e-3, 0.01), (15.0, 1e-6, 0.5)],
    ids=["over_unique_x_gcv", "one_gcv", "just_over_one", "as_many_as_unique_x"],
)
def test_smooth_spline_takes_or_refuses_df_as_r(tmp_path: Path, df: float, rtol: float, spar_tol: float) -> None:
    """15 unique x (5 of them twice): R takes a df above 1 and up to the unique x; for others it
    falls back to generalised cross-validation, whose criterion counts the spread of y within
    tied x. The same smoothing as R's, the same fitted values (near the smoothest spline, df 1.5,
    the search ends at its bound, where the fits are 4e-5 apart). Near either end the df hardly
    moves with the smoothing parameter, spar, and the searches stop at different spar (0.002 and
    0.23 apart) for the same fit; elsewhere at R's spar."""
    rng = np.random.default_rng(7)
    x = np.sort(rng.uniform(0, 5, 15))
    x = np.concatenate([x, x[:5]])
    y = np.sin(x) + rng.normal(0, 0.3, x.size)
    np.savetxt(tmp_path / "xy", np.column_stack([x, y]), fmt="%.17g")
    run_reference(
        ["Rscript", "-e", SMOOTH_SPLINE_R, str(tmp_path / "xy"), str(df), str(tmp_path / "fit")], tmp_path, check=True
    )
    r_out = _read_r(tmp_path / "fit")
    fit = smooth_spline(x, y, df=df)
    assert len(fit.x) == 15
    assert fit.df == pytest.approx(r_out[0], rel=max(rtol, 1e-7))
    assert fit.spar == pytest.approx(r_out[-1], abs=spar_tol)
    np.testing.assert_allclose(fit.y, r_out[16:31], rtol=rtol)


@needs_r
def test_spline_knots_are_rs_for_every_range_of_unique_x() -> None:
    """R's .nknots.smspl, to its rounding: 2^log2(50) is just under 50, so 50 unique x get 49 knots."""
    from omicsprep.cells.ranks import _n_knots

    sizes = sorted({*range(4, 4_001, 11), 49, 50, 51, 199, 200, 201, 799, 800, 801, 3199, 3200, 3201, 10_000})
    script = f"cat(sapply(c({', '.join(map(str, sizes))}), .nknots.smspl))"
    theirs = subprocess.run(["Rscript", "-e", script], capture_output=True, text=True, check=True).stdout.split()
    assert [_n_knots(n) for n in sizes] == [int(value) for value in theirs]


def test_smooth_spline_needs_four_unique_x_as_r() -> None:
    with pytest.raises(ValueError, match=r"^need at least four unique 'x' values$"):
        smooth_spline(np.array([1.0, 2.0, 3.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0]), df=2.0)


def test_spline_fitted_values_only_at_its_own_x() -> None:
    """R's ``fitted``: the smoothed value at each of the spline's own x, NaN between them and past the last."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 5, 40))
    fit = smooth_spline(x, np.sin(x) + rng.normal(0, 0.1, x.size), df=8.0)
    values = fit.fitted(np.array([x[3], (x[3] + x[4]) / 2, x[-1], x[-1] + 1]))
    np.testing.assert_array_equal(values[[0, 2]], fit.y[[3, -1]])
    assert np.isnan(values[[1, 3]]).all()


def test_float32_totals_rank_as_float64() -> None:
    """Totals summed in float32 (counts matrices are) give the knee, inflection and fit of the same
    totals in float64: they are rounded in float64, as R's doubles."""
    totals = _real_like_totals(4)
    ours, double = barcode_ranks(totals.astype(np.float32)), barcode_ranks(totals)
    assert (ours.knee, ours.inflection) == (double.knee, double.inflection)
    np.testing.assert_array_equal(ours.fitted, double.fitted)


def test_fit_bounds_restrict_the_fit() -> None:
    totals = generate_raw_droplets(500, 30_000, 500, seed=1).truth["total"].to_numpy()
    ranks = barcode_ranks(totals, fit_bounds=(200, 5_000))
    fitted = ~np.isnan(ranks.fitted)
    assert totals[fitted].min() > 200
    assert totals[fitted].max() < 5_000
    assert 200 < ranks.knee < 5_000
    assert isinstance(ranks, BarcodeRanks)
    with pytest.raises(ValueError, match="fewer than 4"):
        barcode_ranks(totals, fit_bounds=(5_000, 5_001))


def test_barcode_rank_figure_draws_cells_fit_knee_and_inflection(tmp_path: Path) -> None:
    from matplotlib.collections import PathCollection
    from matplotlib.figure import Figure

    from omicsprep.plotting import barcode_rank_figure

    droplets = generate_raw_droplets(300, 20_000, 500, seed=3)
    totals = droplets.truth["total"].to_numpy()
    ranks = barcode_ranks(totals)
    fig = barcode_rank_figure(ranks, totals, is_cell=droplets.truth["is_cell"].to_numpy(), title="sample")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_xscale() == ax.get_yscale() == "log"
    points = [artist for artist in ax.collections if isinstance(artist, PathCollection)]
    assert [points.get_label() for points in points] == ["other barcodes (19,700)", "cells (300)"]
    fitted, knee, inflection = ax.get_lines()
    np.testing.assert_allclose(
        np.sort(fitted.get_ydata())[::-1], np.sort(ranks.fitted[np.isfinite(ranks.fitted)])[::-1]
    )
    assert knee.get_ydata()[0] == ranks.knee
    assert inflection.get_ydata()[0] == ranks.inflection
    assert {text.get_text() for text in ax.texts} == {f"knee {ranks.knee:,.0f}", f"inflection {ranks.inflection:,.0f}"}
    fig.savefig(tmp_path / "ranks.png")
