"""Drawing the workflow's figures for many cells: seconds to draw and write each, as the rules do.

    python -m benchmarks figures [--cells 1000000] [--all-points] [--results benchmarks/RESULTS.md] [--note TEXT]

Draws the QC histograms and scatter (rule plot_qc) and the UMAP coloured by clusters and by
the QC metrics (rule plot_umap) for random cells and writes them as PNG, timing each.
``--all-points`` draws every cell, as before scatter plots were capped at
``omicsprep.plotting.MAX_POINTS_SHOWN`` points. ``--results`` appends the table, with
machine, date and command, to that file.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import append_results
from omicsprep import plotting
from omicsprep.io.figures import write_embedding_figure, write_qc_figures


def random_cells(n_cells: int) -> tuple[np.ndarray, pd.DataFrame]:
    """An embedding and a cells' table with 30 clusters and the QC metrics the figures show."""
    rng = np.random.default_rng(0)
    obs = pd.DataFrame(
        {
            "leiden_1.0": pd.Categorical(rng.integers(0, 30, n_cells).astype(str)),
            "total_counts": rng.gamma(2.0, 1000.0, n_cells),
            "n_genes_by_counts": rng.gamma(2.0, 500.0, n_cells),
            "pct_counts_mt": rng.uniform(0.0, 20.0, n_cells),
            "doublet_score": rng.uniform(0.0, 1.0, n_cells),
            "passed": rng.uniform(size=n_cells) > 0.1,
        }
    )
    return rng.normal(size=(n_cells, 2)).astype(np.float32), obs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=1_000_000)
    parser.add_argument("--all-points", action="store_true", help="draw every cell (no cap)")
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--note", default="", help="said under the table (the machine's load, say)")


def run(args: argparse.Namespace) -> None:
    if args.all_points:
        plotting.MAX_POINTS_SHOWN = args.cells
    coords, obs = random_cells(args.cells)
    seconds = {}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        start = time.perf_counter()
        write_qc_figures(obs, sample="bench", histograms=str(out / "h.png"), scatter=str(out / "s.png"))
        seconds["qc figures (plot_qc)"] = time.perf_counter() - start
        start = time.perf_counter()
        write_embedding_figure(coords, obs, sample="bench", keys=["leiden_1.0"], path=str(out / "c.png"))
        metrics = ["total_counts", "n_genes_by_counts", "pct_counts_mt", "doublet_score"]
        write_embedding_figure(coords, obs, sample="bench", keys=metrics, path=str(out / "m.png"))
        seconds["UMAP figures (plot_umap)"] = time.perf_counter() - start
    table = pd.DataFrame(
        {
            "cells": args.cells,
            "points drawn": min(args.cells, plotting.MAX_POINTS_SHOWN),
            "figures": list(seconds),
            "seconds": [round(value, 2) for value in seconds.values()],
        }
    )
    print(table.to_string(index=False))
    if args.results is not None:
        append_results(args.results, title="Figures", note=args.note, table=table)
