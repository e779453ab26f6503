"""The study summary as MultiQC custom content (omicsprep.summary.multiqc_sections)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from omicsprep.summary import FAIL_REASONS, HEADLINE, multiqc_sections, study_summary


def _row(kept: int, **changes: float) -> dict[str, float]:
    row = {
        "barcodes": np.nan,
        "cells_called": np.nan,
        "cells_in": kept + 40,
        **{f"removed_{reason}": 0 for reason in FAIL_REASONS},
        "removed_min_genes": 40,
        "doublets_predicted": 3,
        "cells_kept": kept,
        "median_genes": 812.5,
        "median_umis": 2051.0,
        "median_pct_mt": 2.25,
        "median_ambient_fraction": np.nan,
        "clusters": 9,
    }
    return row | changes


def test_summary_puts_the_headline_first_and_drops_unneeded_removals():
    table = study_summary({"a": _row(1000), "b": _row(500, barcodes=20000, cells_called=540)})
    assert list(table.columns[: len(HEADLINE)]) == list(HEADLINE)
    assert [column for column in table if column.startswith("removed_")] == ["removed_min_genes"]
    assert table.loc["b", "cells_called"] == 540 and pd.isna(table.loc["a", "cells_called"])


def test_multiqc_sections_hold_the_summary_as_json_values():
    """Every value as MultiQC needs it (no NaN, plain numbers); General Statistics has the
    headline columns; the whole table keeps every column with its title and format."""
    table = study_summary({"a": _row(1000), "b": _row(500, barcodes=20000, cells_called=540, median_pct_mt=np.nan)})
    sections = multiqc_sections(table)
    json.dumps(sections, allow_nan=False)  # raises on NaN, numpy scalars or pd.NA
    assert set(sections) == {"omicsprep_summary", "omicsprep_general_statistics"}
    whole = sections["omicsprep_summary"]
    assert list(whole["headers"]) == list(table.columns)
    assert whole["headers"]["removed_min_genes"]["title"] == "Removed: min_genes"
    assert whole["headers"]["cells_kept"]["format"] == "{:,.0f}"
    assert whole["data"]["b"]["cells_called"] == 540 and "cells_called" not in whole["data"]["a"]
    assert "median_pct_mt" not in whole["data"]["b"] and whole["data"]["a"]["median_pct_mt"] == 2.25
    general = sections["omicsprep_general_statistics"]
    assert general["plot_type"] == "generalstats"
    assert list(general["headers"]) == list(HEADLINE)
    assert general["data"]["a"] == {column: whole["data"]["a"][column] for column in HEADLINE}


def test_multiqc_sections_add_starsolo_statistics():
    """STARsolo's statistics per FASTQ sample: fractions printed as fractions, counts as counts."""
    table = study_summary({"a": _row(1000), "f": _row(50)})
    starsolo = pd.Series(
        {"Number of Reads": 75000.0, "Reads With Valid Barcodes": 0.994, "Estimated Number of Cells": 50.0}
    )
    section = multiqc_sections(table, starsolo={"f": starsolo})["starsolo_summary"]
    assert section["data"] == {"f": starsolo.to_dict()}
    assert section["headers"]["Reads With Valid Barcodes"]["format"] == "{:.3f}"
    assert section["headers"]["Number of Reads"]["format"] == "{:,.0f}"


def test_the_multiqc_report_leaves_the_rules_log_as_it_found_it(tmp_path):
    """MultiQC replaces the root logger's handlers with its own (WARNING and up): the rule's log lost
    every later line, its phases line among them (rule summary's log was empty)."""
    import logging

    from omicsprep.io.multiqc import write_multiqc_report

    root = logging.getLogger()
    rule_log = logging.FileHandler(tmp_path / "summary.log")
    before = (list(root.handlers), root.level)
    root.addHandler(rule_log)
    root.setLevel(logging.INFO)
    try:
        sections = multiqc_sections(study_summary({"a": _row(1000), "b": _row(500)}))
        write_multiqc_report(
            sections, star_logs={}, report=tmp_path / "multiqc" / "report.html", data=tmp_path / "multiqc" / "data"
        )
        logging.getLogger("omicsprep").info("after MultiQC")
        assert root.handlers[-1] is rule_log and root.level == logging.INFO
    finally:
        root.removeHandler(rule_log)
        rule_log.close()
        root.handlers[:], root.level = before
    assert "after MultiQC" in (tmp_path / "summary.log").read_text()
    assert (tmp_path / "multiqc" / "report.html").is_file()
