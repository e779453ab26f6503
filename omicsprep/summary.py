"""A study's summary: one row per sample, what a user reads first (as Cell Ranger's web summary).

From the tables the rules write: the droplets and the cells called among them, the cells each
QC filter removed, doublets, the cells kept with their median genes, UMIs and mitochondrial
share, the ambient fraction and the clusters. It waits for no other rule (the seconds each rule
took are ``results/run_times.tsv``'s, the workflow's last job), so that it runs beside the
rules that follow clustering.
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
    return row


# What a reader looks for first comes first (as in Cell Ranger's web summary); then the cells'
# way from droplets through QC.
HEADLINE = ("cells_kept", "median_genes", "median_umis", "median_pct_mt", "doublets_predicted", "clusters")


def study_summary(rows: Mapping[str, dict[str, float]]) -> pd.DataFrame:
    """The samples' rows as one table, indexed by sample, headline columns first.

    Removal columns that no sample needed are left out.
    """
    table = pd.DataFrame.from_dict(dict(rows), orient="index").rename_axis("sample")
    table[["barcodes", "cells_called"]] = table[["barcodes", "cells_called"]].astype("Int64")  # empty, not 1.0e4
    unused = [f"removed_{reason}" for reason in FAIL_REASONS if not table[f"removed_{reason}"].any()]
    table = table.drop(columns=unused)
    return table[[*HEADLINE, *(column for column in table if column not in HEADLINE)]]


# The summary's columns as MultiQC shows them: title, description and number format (a
# removal column's are made from its filter's name).
WHOLE, TENTHS = "{:,.0f}", "{:,.1f}"
COLUMN_HEADERS = {
    "cells_kept": ("Cells kept", "Cells kept after QC and doublet removal", WHOLE),
    "median_genes": ("Median genes", "Median genes detected per kept cell", TENTHS),
    "median_umis": ("Median UMIs", "Median UMIs per kept cell", TENTHS),
    "median_pct_mt": ("% mito", "Median percentage of counts in mitochondrial genes, kept cells", "{:.2f}"),
    "doublets_predicted": ("Doublets", "Doublets predicted by Scrublet (removed or flagged)", WHOLE),
    "clusters": ("Clusters", "Clusters of the markers' clustering", WHOLE),
    "barcodes": ("Droplets", "Barcodes in the raw droplets (samples given as raw droplets)", WHOLE),
    "cells_called": ("Cells called", "Droplets called cells (emptyDrops, or the chosen method)", WHOLE),
    "cells_in": ("Cells into QC", "Cells that entered QC", WHOLE),
    "median_ambient_fraction": ("Ambient", "Median ambient RNA fraction of the called cells", "{:.3f}"),
}


def multiqc_sections(summary: pd.DataFrame, *, starsolo: Mapping[str, pd.Series] | None = None) -> dict[str, dict]:
    """The study summary (and STARsolo's) as MultiQC custom content.

    Parameters
    ----------
    summary
        :func:`study_summary`'s table, indexed by sample.
    starsolo
        Sample to its STARsolo ``Summary.csv`` (:func:`omicsprep.io.read_solo_summary`), for
        samples given as FASTQ.

    Returns
    -------
    A custom-content name (MultiQC finds it as ``<name>_mqc.json``) to its content: the whole
    summary as a table; its headline columns in General Statistics, the table MultiQC's report
    opens on; with FASTQ samples, STARsolo's statistics as a table. Missing values are left
    out (MultiQC shows them empty).
    """
    headers = {column: _column_header(column) for column in summary.columns}
    data = _multiqc_data(summary)
    sections = {
        "omicsprep_summary": {
            "id": "omicsprep_summary",
            "section_name": "omicsprep: study summary",
            "description": "One row per sample (results/summary.tsv): the cells through calling, QC and doublets.",
            "plot_type": "table",
            "pconfig": {"id": "omicsprep_summary_table", "title": "omicsprep: study summary", "col1_header": "Sample"},
            "headers": headers,
            "data": data,
        },
        "omicsprep_general_statistics": {
            "id": "omicsprep_general_statistics",
            "plot_type": "generalstats",
            "namespace": "omicsprep",
            "headers": {column: headers[column] for column in HEADLINE},
            "data": {sample: {key: row[key] for key in HEADLINE if key in row} for sample, row in data.items()},
        },
    }
    if starsolo:
        statistics = pd.DataFrame(dict(starsolo)).T
        fractions = statistics.apply(lambda values: values.dropna().between(0, 1).all())
        sections["starsolo_summary"] = {
            "id": "starsolo_summary",
            "section_name": "STARsolo",
            "description": "STARsolo's Summary.csv of each sample given as FASTQ (fractions as 0-1).",
            "plot_type": "table",
            "pconfig": {"id": "starsolo_summary_table", "title": "STARsolo: Summary.csv", "col1_header": "Sample"},
            "headers": {
                str(column): {"format": "{:.3f}" if fraction else WHOLE} for column, fraction in fractions.items()
            },
            "data": _multiqc_data(statistics),
        }
    return sections


def _column_header(column: str) -> dict[str, str]:
    if column.startswith("removed_"):
        reason = column.removeprefix("removed_")
        title, description, number_format = f"Removed: {reason}", f"Cells removed by QC filter {reason}", WHOLE
    else:
        title, description, number_format = COLUMN_HEADERS[column]
    return {"title": title, "description": description, "format": number_format}


def _multiqc_data(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Sample to column to value, without missing values (JSON has no NaN)."""
    data = {}
    for sample, row in table.astype(object).iterrows():
        values = row.dropna()
        data[str(sample)] = {
            str(column): value.item() if isinstance(value, np.generic) else value for column, value in values.items()
        }
    return data
