"""Barcode-rank curve, knee and inflection, as DropletUtils' ``barcodeRanks`` (1.18) computes them.

The knee comes from R's ``smooth.spline(x, y, df=df)``; this module reproduces that smoother
(its knots, its penalty matrix, its search of the smoothing parameter for the requested degrees
of freedom) so that the knee equals DropletUtils' rather than a look-alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import linalg, sparse
from scipy.interpolate import BSpline
from scipy.stats import rankdata

from omicsprep.cells.optimize import brent_minimum


@dataclass(frozen=True)
class BarcodeRanks:
    """The barcode-rank curve of a sample.

    Attributes
    ----------
    knee
        Total count at the knee (maximum curvature of the smoothed curve).
    inflection
        Total count at the inflection (steepest descent of the curve).
    rank
        Rank of each input barcode by decreasing total, ties averaged.
    fitted
        Smoothed total of each barcode; NaN outside the fitted part of the curve.
    """

    knee: float
    inflection: float
    rank: np.ndarray
    fitted: np.ndarray


def rank_totals(totals: np.ndarray) -> np.ndarray:
    """Each barcode's rank by total, largest first, ties averaged (R's ``rank(-totals)``)."""
    return rankdata(-totals, method="average")


def barcode_ranks(
    totals: np.ndarray,
    *,
    lower: int = 100,
    fit_bounds: tuple[float, float] | None = None,
    exclude_from: int = 50,
    df: float = 20.0,
) -> BarcodeRanks:
    """Knee and inflection of the log-log curve of total counts against rank.

    Parameters
    ----------
    totals
        Total count of each barcode (rounded to integers, as DropletUtils does).
    lower
        Only unique totals above this take part in finding the knee and inflection.
    fit_bounds
        Totals (low, high) between which the spline is fitted; by default from the
        steepest rise before the inflection to the inflection.
    exclude_from
        Ranks up to this are ignored when looking for the inflection.
    df
        Degrees of freedom of the smoothing spline.

    Returns
    -------
    BarcodeRanks

    Raises
    ------
    ValueError
        When fewer than 3 unique totals lie above ``lower`` (DropletUtils stops there too) or
        fewer than 4 points lie within ``fit_bounds``.
    """
    totals = np.rint(np.asarray(totals, dtype=float))
    rank = rank_totals(totals)
    run_totals, run_first = np.unique(-totals, return_index=True)
    run_totals = -run_totals
    run_rank = rank[run_first]
    keep = run_totals > lower
    if keep.sum() < 3:
        raise ValueError("insufficient unique points for computing knee/inflection points")
    y = np.log10(run_totals[keep])
    x = np.log10(run_rank[keep])
    left, right = _curve_bounds(x, y, exclude_from=exclude_from)
    inflection = float(10 ** y[right])
    if fit_bounds is None:
        fit_points = np.arange(left, right + 1)
    else:
        fit_points = np.flatnonzero((y > np.log10(fit_bounds[0])) & (y < np.log10(fit_bounds[1])))
    fitted_runs = np.full(len(run_totals), np.nan)
    if len(fit_points) >= 4:
        spline = smooth_spline(x[fit_points], y[fit_points], df=df)
        fitted_kept = np.full(len(y), np.nan)
        fitted_kept[fit_points] = 10 ** spline.fitted(x[fit_points])
        fitted_runs[keep] = fitted_kept
        d1 = spline.derivative(spline.x, 1)
        d2 = spline.derivative(spline.x, 2)
        curvature = d2 / (1 + d1**2) ** 1.5
        # DropletUtils indexes the fitted points by the spline's unique x, as here.
        knee = float(10 ** y[fit_points][np.argmin(curvature)])
    elif fit_bounds is None:
        knee = float(10 ** y[fit_points[0]])
    else:
        raise ValueError(f"fewer than 4 unique totals within fit_bounds {fit_bounds}")
    run_of_barcode = np.searchsorted(-run_totals, -totals)
    return BarcodeRanks(knee=knee, inflection=inflection, rank=rank, fitted=fitted_runs[run_of_barcode])


def _curve_bounds(x: np.ndarray, y: np.ndarray, *, exclude_from: int) -> tuple[int, int]:
    """Indices of the steepest rise before the inflection and of the inflection (steepest fall)."""
    slope = np.diff(y) / np.diff(x)
    skip = min(len(slope) - 1, int(np.sum(x <= np.log10(exclude_from))))
    slope = slope[skip:]
    right = int(np.argmin(slope))
    left = int(np.argmax(slope[: right + 1]))
    return left + skip, right + skip


@dataclass(frozen=True)
class SmoothingSpline:
    """A cubic smoothing spline as R's ``smooth.spline`` returns it.

    Attributes
    ----------
    x
        The unique x values (R's ``fit$x``).
    y
        The smoothed value at each of them (R's ``fit$y``).
    df
        Equivalent degrees of freedom (trace of the smoother matrix).
    spar
        The smoothing parameter found.
    spline
        The B-spline on x scaled to [0, 1].
    x_min, x_range
        The scaling of x.
    """

    x: np.ndarray
    y: np.ndarray
    df: float
    spar: float
    spline: BSpline
    x_min: float
    x_range: float

    def fitted(self, x: np.ndarray) -> np.ndarray:
        """Smoothed value at each input x; NaN where x is not one of the unique x (as R's ``fitted``)."""
        position = np.searchsorted(self.x, x).clip(max=len(self.x) - 1)
        return np.where(self.x[position] == x, self.y[position], np.nan)

    def derivative(self, x: np.ndarray, order: int) -> np.ndarray:
        """Derivative of the spline at x within the data range (R's ``predict(fit, x, deriv)``)."""
        scaled = (x - self.x_min) / self.x_range
        return self.spline(scaled, nu=order) / self.x_range**order


def smooth_spline(x: np.ndarray, y: np.ndarray, *, df: float) -> SmoothingSpline:
    """R's ``smooth.spline(x, y, df=df)`` with unit weights.

    Parameters
    ----------
    x, y
        The points; x values closer than R's ``tol`` (1e-6 IQR) are merged, their y averaged.
    df
        Degrees of freedom to match; outside (1, number of unique x] R falls back to
        generalised cross-validation, as here.

    Returns
    -------
    SmoothingSpline

    Notes
    -----
    Where GCV's minimum lies at interpolation (a few points on a smooth curve), the
    criterion there is rounding noise in R as here, and the spar found may differ from R's.
    """
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    tol = 1e-6 * np.subtract(*np.percentile(x, [75, 25]))
    groups = np.round((x - x.mean()) / tol)
    first = np.concatenate([[True], groups[1:] > groups[:-1]])
    group_of = np.cumsum(first) - 1
    unique_x = x[first]
    weights = np.bincount(group_of).astype(float)
    y_mean = np.bincount(group_of, weights=y) / weights
    # Per group, as R: a lone x adds exactly 0, where one global difference would add rounding noise
    # that GCV, near interpolation, takes for residual.
    residual_ss = float(np.sum(np.bincount(group_of, weights=y**2) - weights * y_mean**2))
    if len(unique_x) <= 3:
        raise ValueError("need at least four unique 'x' values")
    x_range = float(unique_x[-1] - unique_x[0])
    scaled = (unique_x - unique_x[0]) / x_range
    inner = scaled[_knot_positions(len(scaled))]
    knots = np.concatenate([np.repeat(scaled[0], 3), inner, np.repeat(scaled[-1], 3)])
    n_coef = len(inner) + 2
    basis = BSpline.design_matrix(scaled, knots, 3)
    weighted_basis = sparse.diags(weights) @ basis
    xtwx = (basis.T @ weighted_basis).toarray()
    xtwy = basis.T @ (weights * y_mean)
    penalty = _penalty_matrix(knots, n_coef)
    # R scales the smoothing parameter by tr(X'WX) / tr(penalty) over the inner coefficients.
    ratio = np.trace(xtwx[2:-3, 2:-3]) / np.trace(penalty[2:-3, 2:-3])
    match_df = 1 < df <= len(unique_x)

    def solve(spar: float) -> tuple[np.ndarray, float]:
        """Coefficients and degrees of freedom (trace of the smoother matrix) at this spar."""
        system = xtwx + ratio * 16.0 ** (6 * spar - 2) * penalty
        # Cubic B-splines overlap 4 at a time: the system is banded, as R solves it.
        banded = np.zeros((4, n_coef))
        for offset in range(4):
            banded[3 - offset, offset:] = np.diagonal(system, offset)
        factor = (linalg.cholesky_banded(banded), False)
        coef = linalg.cho_solve_banded(factor, xtwy)
        return coef, float(np.trace(linalg.cho_solve_banded(factor, xtwx)))

    def criterion(spar: float) -> float:
        coef, trace = solve(spar)
        if match_df:
            return 3 + (df - trace) ** 2
        # Generalised cross-validation, R's fallback for an impossible df.
        n = weights.sum()
        rss = residual_ss + float(np.sum(weights * (y_mean - basis @ coef) ** 2))
        return (rss / n) / (1 - trace / n) ** 2

    # sbart's search: spar in [-1.5, 1.5], its constants, at most 500 steps.
    spar, last_spar = brent_minimum(criterion, -1.5, 1.5, tol=1e-4, eps=2e-8, max_iter=500, zero_step_up=True)
    # R keeps the fit of the last spar it evaluated, not of the best one.
    coef, trace = solve(last_spar)
    return SmoothingSpline(
        x=unique_x,
        y=basis @ coef,
        df=trace,
        spar=spar,
        spline=BSpline(knots, coef, 3),
        x_min=float(unique_x[0]),
        x_range=x_range,
    )


def _knot_positions(n: int) -> np.ndarray:
    """Indices of the inner knots among n unique x: R's ``seq.int(1, n, length.out=)``, truncated."""
    n_knots = _n_knots(n)
    positions = 1 + np.arange(n_knots) * ((n - 1) / (n_knots - 1))
    positions[-1] = n
    return positions.astype(int) - 1


def _n_knots(n: int) -> int:
    """R's ``.nknots.smspl``: number of inner knots for n unique x."""
    if n < 50:
        return n
    a1, a2, a3, a4 = np.log2([50, 100, 140, 200])
    if n < 200:
        exponent = a1 + (a2 - a1) * (n - 50) / 150
    elif n < 800:
        exponent = a2 + (a3 - a2) * (n - 200) / 600
    elif n < 3200:
        exponent = a3 + (a4 - a3) * (n - 800) / 2400
    else:
        return int(200 + (n - 3200) ** 0.2)
    return int(2**exponent)


def _penalty_matrix(knots: np.ndarray, n_coef: int) -> np.ndarray:
    """Integral of B_i'' B_j'' as R's ``sgram`` computes it.

    B'' is linear on each knot interval; R integrates the product of two such lines with
    the constant 0.3330 in place of 1/3, which is kept so the smoothing matches R's.
    """
    second = BSpline(knots, np.eye(n_coef), 3)
    left, right = knots[3:n_coef], knots[4 : n_coef + 1]
    interval = np.arange(len(left))[:, None]
    # The 4 B-splines that are non-zero on each interval.
    active = interval + np.arange(4)
    start = second(left, nu=2)[interval, active][:, :, None]
    change = second(right, nu=2)[interval, active][:, :, None] - start
    row_start, row_change = start.transpose(0, 2, 1), change.transpose(0, 2, 1)
    blocks = (right - left)[:, None, None] * (
        start * row_start + (change * row_start + start * row_change) * 0.5 + change * row_change * 0.3330
    )
    penalty = np.zeros((n_coef, n_coef))
    np.add.at(penalty, (active[:, :, None], active[:, None, :]), blocks)
    return penalty
