"""Figures of QC metrics and embeddings; each function returns a Matplotlib figure."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from omicsprep.cells.ranks import BarcodeRanks

QC_PANELS = {
    "total_counts": ("UMIs per cell", True),
    "n_genes_by_counts": ("genes per cell", True),
    "pct_counts_mt": ("% mitochondrial", False),
    "pct_counts_ribo": ("% ribosomal", False),
    "pct_counts_hb": ("% hemoglobin", False),
    "doublet_score": ("doublet score", False),
}


def qc_histograms(metrics: pd.DataFrame, *, title: str) -> Figure:
    """Histograms of each QC metric, cells that passed and cells that failed stacked.

    Parameters
    ----------
    metrics
        One row per input cell with metric columns and ``passed``.
    title
        Figure title (the sample's name).
    """
    panels = [name for name in QC_PANELS if name in metrics and metrics[name].notna().any()]
    n_cols = 3
    n_rows = math.ceil(len(panels) / n_cols)
    # Figures made without pyplot: no GUI backend, no global state, nothing to close.
    fig = Figure(figsize=(12, 3.2 * n_rows))
    axes = fig.subplots(n_rows, n_cols)
    axes = np.atleast_1d(axes).ravel()
    for ax, name in zip(axes, panels, strict=False):  # spare axes are turned off below
        label, log_scale = QC_PANELS[name]
        values = metrics[name].astype(float)
        shown = np.log10(values.clip(lower=1)) if log_scale else values
        bins = np.histogram_bin_edges(shown.dropna(), bins=50)
        groups = [shown[metrics["passed"]].dropna(), shown[~metrics["passed"]].dropna()]
        ax.hist(
            groups,
            bins=bins,
            stacked=True,
            histtype="stepfilled",  # one shape per group: 50 bars each cost a second per figure
            color=["#4c72b0", "#dd8452"],
            label=["passed", "failed"],
        )
        ax.set_xlabel(f"log10 {label}" if log_scale else label)
        ax.set_ylabel("cells")
    for ax in axes[len(panels) :]:
        ax.axis("off")
    axes[0].legend(frameon=False)
    n_pass = int(metrics["passed"].sum())
    fig.suptitle(f"{title}: {n_pass} of {len(metrics)} cells passed QC")
    fig.tight_layout()
    return fig


# Scatter plots of more cells show this many, drawn at random (fixed seed): a million points
# take seconds per panel to draw and look the same.
MAX_POINTS_SHOWN = 200_000


def points_shown(n_points: int) -> np.ndarray:
    """The indices of the points a scatter plot of ``n_points`` draws: all, or :data:`MAX_POINTS_SHOWN` at random."""
    if n_points <= MAX_POINTS_SHOWN:
        return np.arange(n_points)
    return np.sort(np.random.default_rng(0).choice(n_points, MAX_POINTS_SHOWN, replace=False))


def shown_title(title: str, n_points: int) -> str:
    """``title``, saying how many of the cells are drawn when not all are."""
    if n_points <= MAX_POINTS_SHOWN:
        return title
    return f"{title} ({MAX_POINTS_SHOWN:,} of {n_points:,} cells drawn)"


def qc_scatter(metrics: pd.DataFrame, *, title: str) -> Figure:
    """UMIs against genes per cell, coloured by mitochondrial share, failed cells marked.

    Of more than :data:`MAX_POINTS_SHOWN` cells, that many are drawn, at random.
    """
    n_cells = len(metrics)
    metrics = metrics.iloc[points_shown(n_cells)]
    title = shown_title(title, n_cells)
    fig = Figure(figsize=(6, 5))
    ax = fig.subplots()
    coords = metrics[["total_counts", "n_genes_by_counts"]].to_numpy(dtype=float)
    if "pct_counts_mt" in metrics:
        _numeric_scatter(ax, coords, metrics["pct_counts_mt"].to_numpy(dtype=float), size=4, label="% mitochondrial")
    else:
        _dots(ax, coords, size=4, color="C0")
    failed = ~metrics["passed"]
    ax.scatter(
        metrics.loc[failed, "total_counts"],
        metrics.loc[failed, "n_genes_by_counts"],
        s=12,
        facecolors="none",
        edgecolors="#dd8452",
        linewidths=0.5,
        label="failed QC",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("UMIs per cell")
    ax.set_ylabel("genes per cell")
    ax.legend(frameon=False, loc="upper left")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def embedding_panels(coords: np.ndarray, obs: pd.DataFrame, *, keys: list[str], title: str) -> Figure:
    """Scatter plots of a 2-D embedding, one panel per ``obs`` column.

    Categorical columns get a colour per category and labels at category centres (of all
    cells); numeric columns a continuous colour map. Of more than :data:`MAX_POINTS_SHOWN`
    cells, that many are drawn, at random.
    """
    n_cols = min(3, len(keys))
    n_rows = math.ceil(len(keys) / n_cols)
    fig = Figure(figsize=(5.2 * n_cols, 4.6 * n_rows))
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    _draw_panels(list(axes.ravel()), coords, obs, keys=keys)
    for ax in axes.ravel()[len(keys) :]:
        ax.axis("off")
    fig.suptitle(shown_title(title, len(obs)))
    fig.tight_layout()
    return fig


def embeddings_grid(embeddings: dict[str, np.ndarray], obs: pd.DataFrame, *, keys: list[str], title: str) -> Figure:
    """:func:`embedding_panels` of several embeddings of the same cells, a row each (named by its key)."""
    fig = Figure(figsize=(5.2 * len(keys), 4.6 * len(embeddings)))
    axes = fig.subplots(len(embeddings), len(keys), squeeze=False)
    for row, (name, coords) in zip(axes, embeddings.items(), strict=True):
        _draw_panels(list(row), coords, obs, keys=keys)
        for ax, key in zip(row, keys, strict=True):
            ax.set_title(f"{name}: {key}")
    fig.suptitle(shown_title(title, len(obs)))
    fig.tight_layout()
    return fig


def _draw_panels(axes: list[Axes], coords: np.ndarray, obs: pd.DataFrame, *, keys: list[str]) -> None:
    """One panel per key on ``axes``: categories coloured and labelled at their centres, numbers on a colour map."""
    centres = {
        key: pd.DataFrame(coords, index=obs.index).groupby(obs[key].to_numpy(), observed=True).median()
        for key in keys
        if isinstance(obs[key].dtype, pd.CategoricalDtype)
    }
    shown = points_shown(len(obs))
    coords, obs = coords[shown], obs.iloc[shown]
    size = max(0.5, min(8.0, 30000 / max(len(obs), 1)))
    cmap = colormaps["tab20"]
    for ax, key in zip(axes, keys, strict=False):
        values = obs[key]
        if isinstance(values.dtype, pd.CategoricalDtype):
            for i, category in enumerate(values.cat.categories):
                mask = (values == category).to_numpy()
                _dots(ax, coords[mask], size=size, color=cmap(i % 20))
                if category in centres[key].index:
                    x, y = centres[key].loc[category]
                    ax.text(x, y, str(category), fontsize=8, weight="bold", ha="center", va="center")
        else:
            _numeric_scatter(ax, coords, values.to_numpy(dtype=float), size=size)
        ax.set_title(key)
        ax.set_xticks([])
        ax.set_yticks([])


COLOUR_LEVELS = 64


def _numeric_scatter(ax: Axes, coords: np.ndarray, values: np.ndarray, *, size: float, label: str = "") -> None:
    """Points coloured by ``values`` (viridis, colour bar), higher on top as scanpy draws them.

    NaN values are drawn in grey underneath.

    The values are drawn in :data:`COLOUR_LEVELS` single-colour layers: Matplotlib draws
    a layer of one colour as repeated markers, and a colour per point far more slowly.
    """
    finite = np.isfinite(values)
    _dots(ax, coords[~finite], size=size, color="lightgrey")
    low, high = (values[finite].min(), values[finite].max()) if finite.any() else (0.0, 1.0)
    norm = Normalize(low, high if high > low else low + 1)
    cmap = colormaps["viridis"]
    levels = np.full(len(values), -1)
    levels[finite] = np.clip((norm(values[finite]) * COLOUR_LEVELS).astype(int), 0, COLOUR_LEVELS - 1)
    for level in range(COLOUR_LEVELS):
        layer = levels == level
        if layer.any():
            _dots(ax, coords[layer], size=size, color=cmap((level + 0.5) / COLOUR_LEVELS))
    ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.8, label=label)


def _dots(ax: Axes, coords: np.ndarray, *, size: float, color: Any) -> None:
    """Points of one colour, ``size`` their area in points² as in ``scatter``, rasterized.

    Drawn as a line's markers: several times faster than a scatter plot's collection, whose
    limits Matplotlib finds from every marker's outline.
    """
    ax.plot(
        coords[:, 0],
        coords[:, 1],
        linestyle="none",
        marker="o",
        markersize=math.sqrt(size),
        markeredgewidth=0,
        color=color,
        rasterized=True,
    )


def module_correlation(eigengenes: pd.DataFrame, *, title: str) -> Figure:
    """Heatmap of the correlation between modules' eigengenes across cells."""
    n_modules = eigengenes.shape[1]
    fig = Figure(figsize=(1.2 + 0.45 * max(n_modules, 4), 0.8 + 0.45 * max(n_modules, 4)))
    ax = fig.subplots()
    if n_modules == 0:
        ax.text(0.5, 0.5, "no module", ha="center", va="center")
        ax.axis("off")
    else:
        image = ax.imshow(
            np.corrcoef(eigengenes.to_numpy().T).reshape(n_modules, n_modules), vmin=-1, vmax=1, cmap="RdBu_r"
        )
        ax.set_xticks(range(n_modules), eigengenes.columns, rotation=90)
        ax.set_yticks(range(n_modules), eigengenes.columns)
        fig.colorbar(image, ax=ax, shrink=0.8, label="correlation of eigengenes")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def module_scores(coords: np.ndarray, eigengenes: pd.DataFrame, *, title: str, max_modules: int = 12) -> Figure:
    """The embedding coloured by the eigengene of each of the first ``max_modules`` modules."""
    keys = list(eigengenes.columns[:max_modules])
    if not keys:
        return module_correlation(eigengenes, title=title)
    return embedding_panels(coords, eigengenes, keys=keys, title=title)


def coexpression_figures(coords: np.ndarray, eigengenes: pd.DataFrame, *, title: str) -> dict[str, Figure]:
    """The co-expression rule's figures: ``correlation`` (modules x modules) and ``umap``.

    ``umap`` shows the module scores on the embedding ``coords``.
    """
    return {
        "correlation": module_correlation(eigengenes, title=title),
        "umap": module_scores(coords, eigengenes, title=title),
    }


def barcode_rank_figure(ranks: BarcodeRanks, totals: np.ndarray, *, is_cell: np.ndarray, title: str) -> Figure:
    """Total UMIs against barcode rank (log-log): cells, other barcodes, fitted curve, knee, inflection.

    The knee and the inflection are horizontal lines labelled with their totals.

    Parameters
    ----------
    ranks
        The barcode ranks of ``totals``.
    totals
        Total UMIs of each barcode.
    is_cell
        Whether each barcode was called a cell.
    title
        Figure title (the sample's name).
    """
    fig = Figure(figsize=(6, 5))
    ax = fig.subplots()
    shown = totals > 0  # a log axis has no room for empty barcodes
    for label, members, colour in (("other barcodes", ~is_cell, "#bbbbbb"), ("cells", is_cell, "#4c72b0")):
        # Barcodes of one total share a rank: a point per rank draws the same curve, far faster.
        rank, first = np.unique(ranks.rank[members & shown], return_index=True)
        ax.scatter(
            rank,
            totals[members & shown][first],
            s=4,
            color=colour,
            label=f"{label} ({int(members.sum()):,})",
            rasterized=True,
        )
    fitted = np.isfinite(ranks.fitted)
    order = np.argsort(ranks.rank[fitted])
    ax.plot(ranks.rank[fitted][order], ranks.fitted[fitted][order], color="#c44e52", linewidth=1.2, label="fitted")
    for name, total, style in (("knee", ranks.knee, "--"), ("inflection", ranks.inflection, ":")):
        if not np.isfinite(total):  # too few distinct totals for DropletUtils' fit
            continue
        ax.axhline(total, color="black", linestyle=style, linewidth=0.8)
        ax.text(
            0.99,
            total,
            f"{name} {total:,.0f}",
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="bottom",
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("barcode rank")
    ax.set_ylabel("total UMIs")
    ax.legend(frameon=False, loc="lower left")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def ambient_figure(
    profile: np.ndarray, genes: pd.Index, ambient_fraction: pd.Series | None, *, title: str, n_genes: int = 20
) -> Figure:
    """The ambient profile's top genes, and each cell's removed ambient share when removed.

    Parameters
    ----------
    profile
        Each gene's share of the ambient UMIs (of the empty droplets).
    genes
        The genes' names.
    ambient_fraction
        Per cell, the share of its UMIs removed as ambient; ``None`` when nothing was removed.
    title
        Figure title (the sample's name).
    n_genes
        Genes shown.
    """
    fig = Figure(figsize=(11, 4))
    top_ax, share_ax = fig.subplots(1, 2)
    top = np.argsort(profile)[::-1][:n_genes]
    top_ax.barh(np.arange(top.size)[::-1], 100 * profile[top], color="#4c72b0")
    top_ax.set_yticks(np.arange(top.size)[::-1], labels=[str(name) for name in genes[top]], fontsize=7)
    top_ax.set_xlabel("% of ambient UMIs")
    top_ax.set_title("ambient profile: top genes")
    if ambient_fraction is None:
        share_ax.text(0.5, 0.5, "ambient RNA not removed\n(cells.ambient.method: none)", ha="center", va="center")
        share_ax.axis("off")
    else:
        values = 100 * ambient_fraction.to_numpy(dtype=float)
        share_ax.hist(values, bins=50, color="#dd8452")
        share_ax.axvline(np.median(values), color="black", lw=1, ls="--", label=f"median {np.median(values):.1f}%")
        share_ax.set_xlabel("% of a cell's UMIs removed as ambient")
        share_ax.set_ylabel("cells")
        share_ax.legend(frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
