"""Brent's minimisation as R runs it, for results equal to R's to the last digits.

R minimises a function of one variable with Brent's method in two places this package
follows: ``optimize`` (C ``Brent_fmin``; DropletUtils' alpha) and ``smooth.spline``'s search
of the smoothing parameter (Fortran ``sbart``; DropletUtils' barcode ranks). Both are the same
golden-section search with parabolic steps; they differ only in their constants, an iteration
cap, and which way a zero step goes, which are the parameters here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0
# R's optimize(): the tolerance's default, and the relative precision of Brent_fmin.
OPTIMIZE_TOLERANCE = float(np.finfo(float).eps ** 0.25)
OPTIMIZE_EPS = math.sqrt(float(np.finfo(float).eps))


def brent_minimum(
    f: Callable[[float], float],
    low: float,
    high: float,
    *,
    tol: float = OPTIMIZE_TOLERANCE,
    eps: float = OPTIMIZE_EPS,
    max_iter: int | None = None,
    zero_step_up: bool = False,
) -> tuple[float, float]:
    """Minimise ``f`` over ``[low, high]`` step for step as R does.

    Parameters
    ----------
    f
        The function.
    low, high
        The interval.
    tol
        Absolute tolerance (R's ``tol``).
    eps
        Relative precision (``Brent_fmin``'s square root of the machine epsilon; ``sbart``'s 2e-8).
    max_iter
        Most evaluations after the first (``sbart``'s 500); ``None``: until converged, as
        ``Brent_fmin``.
    zero_step_up
        A step of exactly zero goes up (Fortran's ``SIGN``, ``sbart``), else down (``Brent_fmin``).

    Returns
    -------
    The minimiser, and the last point evaluated (``smooth.spline`` keeps that one's fit).
    """
    a, b = low, high
    x = w = v = u = a + GOLDEN * (b - a)
    fx = fw = fv = f(x)
    d = e = 0.0
    iteration = 0
    while max_iter is None or iteration < max_iter:
        iteration += 1
        middle = (a + b) / 2
        tol1 = eps * abs(x) + tol / 3
        tol2 = 2 * tol1
        if abs(x - middle) <= tol2 - (b - a) / 2:
            break
        parabola = False
        if abs(e) > tol1:  # fit a parabola
            r = (x - w) * (fx - fv)
            q = (x - v) * (fx - fw)
            p = (x - v) * q - (x - w) * r
            q = 2 * (q - r)
            if q > 0:
                p = -p
            q = abs(q)
            r, e = e, d
            parabola = not (abs(p) >= abs(q * r / 2) or p <= q * (a - x) or p >= q * (b - x))
            if parabola:  # not too close to the ends
                d = p / q
                if x + d - a < tol2 or b - x - d < tol2:
                    d = tol1 if x < middle else -tol1
        if not parabola:  # golden section
            e = (b - x) if x < middle else (a - x)
            d = GOLDEN * e
        away = tol1 if d > 0 or (d == 0 and zero_step_up) else -tol1
        u = x + (d if abs(d) >= tol1 else away)  # not too close to x
        fu = f(u)
        if fu <= fx:
            if u < x:
                b = x
            else:
                a = x
            v, fv, w, fw, x, fx = w, fw, x, fx, u, fu
        else:
            if u < x:
                a = u
            else:
                b = u
            if fu <= fw or w == x:
                v, fv, w, fw = w, fw, u, fu
            elif fu <= fv or v in (x, w):
                v, fv = u, fu
    return x, u
