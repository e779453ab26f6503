"""Each rule's peak host memory and output size against its inputs': the rules' mem_mb and disk_mb.

Calibrates :mod:`omicsprep.resources`.

    python -m benchmarks resources --cells 20000 100000 [--backend cpu] [--cores 2]
        [--workdir /tmp/omicsprep-resources] [--results benchmarks/RESULTS.md]

For each size: generates counts (omicsprep/testing/generate.py, as benchmarks/e2e.py does), runs the
workflow on them, and reads each job's
inputs and outputs from ``snakemake --detailed-summary`` and its peak resident memory from
its ``benchmark:`` file. Prints, per rule: inputs MB, peak RSS MB, outputs MB, the ratios to
the inputs, and what :mod:`omicsprep.resources` asks for those inputs (first attempt).
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pandas as pd

from benchmarks.common import (
    append_results,
    bench_config,
    dataset,
    run_arguments,
    run_snakemake,
)
from omicsprep.resources import disk_mb, memory_mb, paths_mb
from omicsprep.testing import snakemake_command


def job_sizes(rundir: Path, config: Path, sheet: Path, settings: list[str]) -> pd.DataFrame:
    """Per job (rule, sample): its inputs' and outputs' MB, from Snakemake's detailed summary."""
    result = subprocess.run(
        snakemake_command(*run_arguments(rundir, config=config, sheet=sheet), *settings, "--detailed-summary"),
        capture_output=True,
        text=True,
        check=True,
    )
    summary = pd.read_csv(io.StringIO(result.stdout), sep="\t", dtype=str).fillna("")
    rows = []
    for rule, files in summary.groupby("rule"):
        inputs = {Path(path) for field in files["input-file(s)"] for path in field.split(",") if path}
        outputs = [rundir / path for path in files["output_file"]]
        rows.append(
            {
                "rule": rule,
                "inputs_mb": paths_mb([str(path if path.is_absolute() else rundir / path) for path in inputs]),
                "outputs_mb": paths_mb([str(path) for path in outputs]),
            }
        )
    return pd.DataFrame(rows).set_index("rule")


def peak_memory(rundir: Path) -> pd.Series:
    """Each rule's peak resident memory (MB) from its benchmark file."""
    peaks = {
        path.parent.name: float(pd.read_csv(path, sep="\t")["max_rss"].max())
        for path in (rundir / "benchmarks").glob("*/*.tsv")
    }
    return pd.Series(peaks, name="peak_rss_mb")


def measure(workdir: Path, counts: Path, *, backend: str, cores: int) -> pd.DataFrame:
    config = bench_config(workdir)
    rundir = workdir / f"{backend}_{counts.stem}"
    rundir.mkdir(parents=True, exist_ok=True)
    sheet = rundir / "samples.tsv"
    sheet.write_text(f"sample\tinput\nbench\t{counts}\n")
    settings = [f"backend={backend}"]
    run_snakemake(rundir, config=config, sheet=sheet, backend=backend, cores=cores)
    table = job_sizes(rundir, config, sheet, settings).join(peak_memory(rundir), how="inner")
    table["rss_per_input_mb"] = table["peak_rss_mb"] / table["inputs_mb"]
    table["outputs_per_input_mb"] = table["outputs_mb"] / table["inputs_mb"]
    table["mem_mb_asked"] = [memory_mb(rule, inputs_mb=size, attempt=1) for rule, size in table["inputs_mb"].items()]
    table["disk_mb_asked"] = [disk_mb(rule, inputs_mb=size) for rule, size in table["inputs_mb"].items()]
    return table.round(2).rename_axis("rule").reset_index()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-resources"))
    parser.add_argument("--results", type=Path, help="append the table to this Markdown file")


def run(args: argparse.Namespace) -> None:
    tables = []
    for n_cells in args.cells:
        counts = dataset(args.workdir, n_cells, args.genes, jobs=args.cores)
        table = measure(args.workdir, counts, backend=args.backend, cores=args.cores)
        table.insert(0, "cells", n_cells)
        tables.append(table)
        print(table.to_string(index=False), flush=True)
    table = pd.concat(tables, ignore_index=True)
    if args.results:
        append_results(
            args.results,
            title="Memory and disk per rule against its inputs",
            note=f"Backend {args.backend}; generated counts x {args.genes} genes; "
            "`mem_mb_asked`, `disk_mb_asked`: omicsprep.resources for these inputs, first attempt.",
            table=table,
        )
