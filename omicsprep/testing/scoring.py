"""Called cells and their corrected counts scored against the planted truth of generated droplets."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from anndata import AnnData

    from omicsprep.testing.droplets import RawDroplets


def foreign_marker_counts(counts, cell_type: np.ndarray, markers: list[np.ndarray]) -> float:
    """Counts of other types' markers in true cells: ambient, since markers are exclusive to their type.

    ``counts`` are barcodes x genes; ``cell_type`` is each barcode's type (-1: empty droplet).
    """
    total = 0.0
    for own, genes in enumerate(markers):
        others = np.flatnonzero((cell_type >= 0) & (cell_type != own))
        total += counts[others][:, genes].sum()
    return total


def quality(cells: AnnData, droplets: RawDroplets) -> dict[str, float]:
    """Called cells with corrected counts (``cells``) scored against the planted truth of ``droplets``."""
    truth = droplets.truth.loc[cells.obs_names]
    is_cell = truth["is_cell"].to_numpy()
    corrected = cells.X[is_cell]
    raw = droplets.counts[droplets.truth.index.get_indexer(cells.obs_names[is_cell])]
    removed = 1 - np.asarray(corrected.sum(axis=1)).ravel() / np.asarray(raw.sum(axis=1)).ravel()
    planted = truth["ambient_fraction"].to_numpy()[is_cell]
    cell_type = truth["cell_type"].to_numpy()[is_cell]
    foreign_raw = foreign_marker_counts(raw, cell_type, droplets.markers)
    foreign_kept = foreign_marker_counts(corrected, cell_type, droplets.markers)
    return {
        "cells_called": cells.n_obs,
        "precision": float(is_cell.mean()),
        "recall": float(is_cell.sum() / droplets.truth["is_cell"].sum()),
        "removed_fraction": float(removed.mean()),
        "planted_fraction": float(planted.mean()),
        "removed_planted_corr": float(np.corrcoef(removed, planted)[0, 1]),
        "foreign_marker_reduction": float(1 - foreign_kept / foreign_raw),
        "entries_above_raw": int(((corrected - raw) > 0).sum()),
    }


def called_by_cellbender(output: AnnData) -> AnnData:
    """The barcodes of CellBender's output that it calls cells (probability above 0.5, its cut-off)."""
    return output[output.obs["cell_probability"] > 0.5]
