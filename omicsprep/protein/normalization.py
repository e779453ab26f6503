"""Antibody-derived tags (CITE-seq): QC, CLR and dsb normalization, on either backend.

Array code is written once against NumPy's API and runs on CuPy arrays on the GPU. The
per-cell two-component Gaussian mixtures of dsb are fitted for all cells at once (a
vectorized EM), which is what lets them run on the GPU; muon fits one scikit-learn model
per cell instead.
"""

from __future__ import annotations

import re
from types import ModuleType

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend, array_module, asnumpy
from omicsprep.errors import InputError


def _dense(matrix, xp: ModuleType):
    values = matrix.toarray() if sparse.issparse(matrix) else np.asarray(matrix)
    return xp.asarray(values, dtype=xp.float64)


def isotype_controls(adata: AnnData, *, pattern: str) -> list[str]:
    """Names of the isotype-control antibodies (matched by ``pattern``)."""
    return [name for name in adata.var_names if re.search(pattern, name)]


def protein_qc(adata: AnnData, *, isotypes: list[str]) -> None:
    """Per-cell ADT metrics in ``obs``: ``total_adt``, ``isotype_adt`` and ``pct_isotype``.

    ``total_adt`` counts all tags, ``isotype_adt`` the isotype controls, and ``pct_isotype``
    is their share (%).
    """
    counts = adata.X
    total = np.asarray(counts.sum(axis=1)).ravel()
    isotype = np.asarray(adata[:, isotypes].X.sum(axis=1)).ravel() if isotypes else np.zeros(adata.n_obs)
    adata.obs["total_adt"] = total
    adata.obs["isotype_adt"] = isotype
    adata.obs["pct_isotype"] = 100 * isotype / np.maximum(total, 1)


def clr(adata: AnnData, *, backend: Backend) -> None:
    """Centred log-ratio per cell, as Seurat (``margin = 2``) and muon (``axis=1``) compute it.

    ``X`` becomes ``log1p(x / exp(mean(log1p(x))))`` with the mean over each cell's tags;
    raw counts are kept in ``layers["counts"]``.

    Parameters
    ----------
    adata
        Cells x antibodies, raw counts in ``X``.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    xp = array_module(backend)
    counts = _dense(adata.X, xp)
    geometric = xp.exp(xp.log1p(counts).mean(axis=1, keepdims=True))
    adata.layers["counts"] = adata.X.copy()
    adata.X = asnumpy(xp.log1p(counts / geometric)).astype(np.float32)


def dsb(
    adata: AnnData,
    *,
    empty: AnnData,
    isotypes: list[str],
    pseudocount: float = 10,
    denoise: bool = True,
    backend: Backend,
) -> None:
    """Denoised and scaled by background (dsb; Mulè, Martins and Tsang, 2022), in place.

    1. ``log(x + pseudocount)`` of cells and empty droplets; each antibody is centred and
       scaled by its mean and standard deviation in the empty droplets (ambient noise).
    2. With ``denoise``: every cell's tags are fitted with a two-component Gaussian
       mixture; the lower component's mean is that cell's background. The technical
       component is the first principal component of the isotype controls and that
       background (the background alone without isotypes), and each antibody's linear
       dependence on it is removed. As in muon, the principal component is taken on the
       centred values; the R package scales them first (``prcomp(scale = TRUE)``).

    Raw counts are kept in ``layers["counts"]``; ``obs["dsb_background"]`` and
    ``obs["dsb_technical"]`` hold the per-cell background and technical component.

    Parameters
    ----------
    adata
        Cells x antibodies, raw counts in ``X``.
    empty
        Empty droplets x the same antibodies, raw counts.
    isotypes
        Isotype-control antibodies; may be empty (the background alone is then regressed).
    pseudocount
        Added before the logarithm.
    denoise
        Remove the per-cell technical component (step 2).
    backend
        ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    InputError
        The empty droplets lack some of the cells' antibodies, or an isotype is not an
        antibody of ``adata``.
    """
    missing = adata.var_names.difference(empty.var_names)
    if len(missing):
        raise InputError(f"empty droplets lack {len(missing)} antibodies of the cells, e.g. {missing[0]!r}")
    absent = [name for name in isotypes if name not in adata.var_names]
    if absent:
        raise InputError(f"isotype controls not among the antibodies: {', '.join(absent)}")
    xp = array_module(backend)
    cells = xp.log(_dense(adata.X, xp) + pseudocount)
    ambient = xp.log(_dense(empty[:, adata.var_names].X, xp) + pseudocount)
    scaled = (cells - ambient.mean(axis=0)) / ambient.std(axis=0, ddof=1)
    adata.layers["counts"] = adata.X.copy()
    if denoise:
        background = _two_component_low_means(scaled, xp=xp)
        isotype_columns = [adata.var_names.get_loc(name) for name in isotypes]
        noise = xp.concatenate([scaled[:, isotype_columns], background[:, None]], axis=1)
        technical = _first_component(noise, xp=xp)
        centred = technical - technical.mean()
        slopes = centred @ (scaled - scaled.mean(axis=0)) / (centred @ centred)
        scaled = scaled - centred[:, None] * slopes[None, :]
        adata.obs["dsb_background"] = asnumpy(background)
        adata.obs["dsb_technical"] = asnumpy(technical)
    adata.X = asnumpy(scaled).astype(np.float32)


def _first_component(values, *, xp: ModuleType):
    """Scores on the first principal component of the centred columns, rising with the columns' mean."""
    centred = values - values.mean(axis=0)
    _, vectors = xp.linalg.eigh(centred.T @ centred)
    scores = centred @ vectors[:, -1]
    return -scores if float((scores * centred.mean(axis=1)).sum()) < 0 else scores


def _two_component_low_means(values, *, xp: ModuleType, n_iterations: int = 200):
    """Mean of the lower component of a two-component 1-D Gaussian mixture, per row.

    EM for every row at once, each component with its own variance, started from the
    row's lower and upper quartiles.
    """
    ordered = xp.sort(values, axis=1)
    n = values.shape[1]
    means = xp.stack([ordered[:, n // 4], ordered[:, (3 * n) // 4]], axis=1)
    floor = 1e-6 * values.var(axis=1, keepdims=True) + 1e-12
    # Floored from the start: a cell whose values are all one value has no variance.
    variances = xp.repeat(xp.maximum(values.var(axis=1, keepdims=True), floor), 2, axis=1)
    weights = xp.full_like(means, 0.5)
    for _ in range(n_iterations):
        # E step: responsibilities of each component for each value (rows x values x 2).
        deviation = values[:, :, None] - means[:, None, :]
        log_density = (
            xp.log(weights)[:, None, :]
            - 0.5 * xp.log(2 * np.pi * variances)[:, None, :]
            - 0.5 * deviation**2 / variances[:, None, :]
        )
        log_density -= log_density.max(axis=2, keepdims=True)
        responsibility = xp.exp(log_density)
        responsibility /= responsibility.sum(axis=2, keepdims=True)
        # M step.
        mass = responsibility.sum(axis=1) + 1e-12
        weights = mass / n
        means = (responsibility * values[:, :, None]).sum(axis=1) / mass
        deviation = values[:, :, None] - means[:, None, :]
        variances = xp.maximum((responsibility * deviation**2).sum(axis=1) / mass, floor)
    return means.min(axis=1)


def background_droplets(
    raw_tags: AnnData, *, is_cell: pd.Series, log10_library: tuple[float, float] = (1.5, 3.0)
) -> AnnData:
    """The empty droplets that make dsb's background, from raw droplets.

    The barcodes that are not cells and whose antibody library size (log10 of the total)
    lies in ``log10_library``, as dsb's authors select them.

    Parameters
    ----------
    raw_tags
        Every barcode x antibodies, raw counts.
    is_cell
        Whether each barcode is a cell (indexed by barcode, the cell calls' table).
    log10_library
        Lowest and highest log10 antibody total of a background droplet; droplets below hold
        too few tags to estimate the background, those above are likely cells or aggregates.

    Returns
    -------
    The background droplets x antibodies (a copy).

    Raises
    ------
    InputError
        No droplet qualifies.
    """
    cells = is_cell.reindex(raw_tags.obs_names, fill_value=False).to_numpy(dtype=bool)
    with np.errstate(divide="ignore"):
        library = np.log10(np.asarray(raw_tags.X.sum(axis=1)).ravel())
    low, high = log10_library
    keep = ~cells & (library >= low) & (library <= high)
    if not keep.any():
        raise InputError(
            f"no empty droplet with an antibody total of 10^{low:g} to 10^{high:g} among {raw_tags.n_obs} barcodes "
            "for dsb's background (protein.dsb.background_log10_library)"
        )
    return raw_tags[keep].copy()
