"""A study's summary: one row per sample, what a user reads first (as Cell Ranger's web summary).

From the tables the rules write: the droplets and the cells called among them, the cells each
QC filter removed, doublets, the cells kept with their median genes, UMIs and mitochondrial
share, the ambient fraction, the clusters and the seconds the sample's rules took.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

# The fail reasons of omicsprep.rna.qc.qc_pass_mask and of doublet removal, in the order they apply.
FAIL_REASONS = (
    "min_genes",
    "max_genes",
    "min_counts",
    "max_counts",
    "max_pct_mt",
    "mad_log1p_total_counts",
    "mad_log1p_n_genes_by_counts",
    "mad_pct_counts_mt",
    "doublet",
)


def sample_row(
    *,
    metrics: pd.DataFrame,
    obs: pd.DataFrame,
    clusters: str,
    barcodes: pd.DataFrame | None = None,
    seconds: float | None = None,
) -> dict[str, float]:
    """One sample's line of the summary.

    Parameters
    ----------
    metrics
        Every cell that entered QC: its metrics, ``fail_reason`` and ``passed`` (rule qc's
        ``qc/cell_metrics.parquet``).
    obs
        The cells kept, with ``predicted_doublet`` and the clusters (rule cluster's ``obs.parquet``).
    clusters
        The column of ``obs`` whose clusters are counted (the markers' clustering).
    barcodes
        Every droplet's barcode with ``is_cell`` and ``ambient_fraction``, where cells were
        called (rule call_cells' ``cells/barcodes.parquet``).
    seconds
        The wall seconds of the sample's rules.

    Returns
    -------
    Column name to value; NaN where the sample has no such figure (no droplets, say).
    """
    kept = metrics[metrics["passed"]]
    row: dict[str, float] = {
        "barcodes": np.nan,
        "cells_called": np.nan,
        "cells_in": len(metrics),
    }
    if barcodes is not None:
        called = barcodes[barcodes["is_cell"]]
        row.update(barcodes=len(barcodes), cells_called=len(called))
    removed = metrics["fail_reason"].value_counts()
    for reason in FAIL_REASONS:
        row[f"removed_{reason}"] = int(removed.get(reason, 0))
    row["doublets_predicted"] = int(
        removed.get("doublet", 0) + obs.get("predicted_doublet", pd.Series(dtype=bool)).sum()
    )
    row["cells_kept"] = len(kept)
    row["median_genes"] = round(float(kept["n_genes_by_counts"].median()), 1)
    row["median_umis"] = round(float(kept["total_counts"].median()), 1)
    row["median_pct_mt"] = round(float(kept["pct_counts_mt"].median()), 2) if "pct_counts_mt" in kept else np.nan
    ambient = barcodes.loc[barcodes["is_cell"], "ambient_fraction"].dropna() if barcodes is not None else None
    row["median_ambient_fraction"] = (
        round(float(ambient.median()), 4) if ambient is not None and len(ambient) else np.nan
    )
    row["clusters"] = int(obs[clusters].nunique())
    row["seconds"] = np.nan if seconds is None else round(seconds, 1)
    return row


def study_summary(rows: Mapping[str, dict[str, float]]) -> pd.DataFrame:
    """The samples' rows as one table, indexed by sample; removal columns no sample needed are left out."""
    table = pd.DataFrame.from_dict(dict(rows), orient="index").rename_axis("sample")
    table[["barcodes", "cells_called"]] = table[["barcodes", "cells_called"]].astype("Int64")  # empty, not 1.0e4
    unused = [f"removed_{reason}" for reason in FAIL_REASONS if not table[f"removed_{reason}"].any()]
    return table.drop(columns=unused)


def seconds_per_sample(run_times: pd.DataFrame) -> pd.Series:
    """Wall seconds of each sample's rules, summed (``results/run_times.tsv``'s ``total`` rows)."""
    totals = run_times[run_times["step"] == "total"]
    return totals.groupby("sample")["seconds"].sum()
