"""The figures a rule draws in its second process (:func:`omicsprep.background.background_process`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


def write_qc_figures(metrics: pd.DataFrame, *, sample: str, histograms: str, scatter: str) -> None:
    """Draw and write the QC figures of every input cell (rule qc, in its second process).

    Parameters
    ----------
    metrics
        The QC metrics table of :func:`omicsprep.rna.pipeline.run_qc`.
    sample
        The figures' title.
    histograms, scatter
        Where the histograms and the UMIs-against-genes scatter go.
    """
    from omicsprep import io, plotting

    io.write_figure(plotting.qc_histograms(metrics, title=sample), histograms)
    io.write_figure(plotting.qc_scatter(metrics, title=sample), scatter)


def write_embedding_figure(coords: np.ndarray, obs: pd.DataFrame, *, sample: str, keys: list[str], path: str) -> None:
    """Draw and write the UMAP with a panel per column of ``obs`` among ``keys`` (those present).

    Rule cluster draws the metrics' figure once UMAP is done, beside clustering, and the
    clusters' after.

    Parameters
    ----------
    coords
        The UMAP coordinates, one row per cell.
    obs
        The cells' table.
    sample
        The figure's title.
    keys
        The columns to colour by.
    path
        Where the figure goes.
    """
    from omicsprep import io, plotting

    present = [key for key in keys if key in obs]
    io.write_figure(plotting.embedding_panels(coords, obs, keys=present, title=sample), path)


def write_cell_types(
    obs: pd.DataFrame, coords: np.ndarray, *, key: str, clusters: str | None, sample: str, table: str, figure: str
) -> None:
    """Write CellTypist's types (:func:`omicsprep.rna.annotation.celltypist`) as a table and a UMAP.

    Parameters
    ----------
    obs
        The cells' table, with the columns ``key``, ``{key}_confidence`` and ``{key}_predicted``.
    coords
        The UMAP coordinates, one row per cell.
    key
        The types' column; the table names its columns ``cell_type``, ``cell_type_confidence``
        and ``cell_type_predicted`` whatever ``key`` is.
    clusters
        The clusters the types were voted over (drawn beside them), or ``None``.
    sample
        The figure's title.
    table, figure
        Where the table and the figure go.
    """
    from omicsprep import io

    columns = {key: "cell_type", f"{key}_confidence": "cell_type_confidence", f"{key}_predicted": "cell_type_predicted"}
    io.write_table(obs[list(columns)].rename(columns=columns), table, index=True)
    write_embedding_figure(coords, obs, sample=sample, keys=[key, *([clusters] if clusters else [])], path=figure)
