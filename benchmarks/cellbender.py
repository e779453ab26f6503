"""CellBender and omicsprep's SoupX and DecontX on a generated raw matrix: wall time and quality against the truth.

    python -m benchmarks cellbender [--cells 5000 --barcodes 100000 --genes 20000]
        [--ours soupx decontx] [--settings fast default] [--fpr 0.01 0.1] [--total-droplets N]
        [--workdir /tmp/cellbender-bench] [--cpu]

Generates raw droplets (omicsprep/testing/droplets.py: cells of types with exclusive markers among
empty droplets, a planted ambient share of 5-20% per cell). Runs omicsprep's ``call_cells``
step (emptyDrops, then each of ``--ours`` with the workflow's default settings; on the GPU
where there is one, unless ``--cpu``), then CellBender once per setting and FPR (on the GPU
unless ``--cpu``; the first FPR trains, the others resume from its checkpoint and only redo
the output), read with :func:`omicsprep.io.cellbender.read_cellbender`. Each is scored
against the planted truth: cells called (CellBender's: probability > 0.5) against the true
cells (precision, recall); in the true cells called, the share of each one's counts
removed against its planted ambient share, and the other types' markers (counts that can
only be ambient) before and after. Prints a table and writes it (``cellbender_bench.tsv``)
and each CellBender run's log to ``$OUT`` (or the work folder).

On the GPU machine (offline): CellBender and the packages it needs beyond the machine's
image and the RAPIDS bundle (anndata) travel as wheels in ``.gpu/cellbender/`` (cellbender
0.4.0, pyro-ppl 1.9.2, pyro-api 0.1.2, dill 0.4.1, tables 3.11.1, numexpr 2.14.2, ipython
9.18.1, traitlets 5.16.1; 9.1 MB). With the bundle unpacked (carry ``.gpu/manifest``,
``.gpu/stage.sh``, ``.gpu/env.sh`` and ``.gpu/cellbender``):

    bash .gpu/stage.sh && source .gpu/env.sh &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cb .gpu/cellbender/*.whl &&
    export PYTHONPATH=/tmp/cb:$PYTHONPATH PATH=/tmp/cb/bin:$PATH PYTHONUNBUFFERED=1 &&
    timeout 560 python -m benchmarks cellbender --cells 2000 --barcodes 40000 --genes 10000 --total-droplets 6000

Without Jupyter there CellBender logs that it could not make its HTML report; the rest is
written.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.cells.cellbender import remove_background_command
from omicsprep.io.cellbender import read_cellbender
from omicsprep.options import CellbenderOptions
from omicsprep.testing.droplets import generate_raw_droplets
from omicsprep.testing.generate import write_10x_h5
from omicsprep.testing.scoring import called_by_cellbender, quality

# CellBender's defaults, and the workflow's (omicsprep.options.CellbenderOptions): faster
# within what CellBender's docs call safe: a third of the epochs (its docs: 150 typical) at
# three times the learning rate (they advise at most 1e-3), larger posterior batches (GPU
# memory allowing), and only features expected to carry at least one ambient count in cells
# (the docs' speed-up; the rest are left as they are).
SETTINGS: dict[str, dict] = {
    "default": {},
    "fast": {
        name: value
        for name, value in dataclasses.asdict(CellbenderOptions()).items()
        if name not in ("fpr", "total_droplets")  # given per run
    },
}


def run_omicsprep(raw: Path, method: str, *, backend: str) -> tuple[float, AnnData]:
    """Run the call_cells step (emptyDrops, then ambient ``method``, default settings): seconds, called cells."""
    from omicsprep.cells.pipeline import run_call_cells
    from omicsprep.io import read_counts
    from omicsprep.options import AmbientOptions, CellOptions

    counts = read_counts(raw)
    start = time.perf_counter()
    cells, _ = run_call_cells(
        counts,
        filtered=None,
        cellbender=None,
        options=CellOptions(ambient=AmbientOptions(method=method)),  # type: ignore[arg-type]
        backend=backend,  # type: ignore[arg-type]
    )
    return time.perf_counter() - start, cells


def seconds_to_trained(log: str) -> float:
    """Seconds from CellBender's start to the end of training (data loading and training), from its log."""
    stamps = [(m.start(), pd.Timestamp(m[1])) for m in re.finditer(r": (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\n", log)]
    done = log.find("Inference procedure complete")
    before = [stamp for position, stamp in stamps if position < done]
    return (before[-1] - stamps[0][1]).total_seconds() if done >= 0 and before else np.nan


def run_cellbender(
    raw: Path, folder: Path, setting: str, *, fpr: float, log: Path, **options
) -> tuple[float, Path, str]:
    """Run CellBender with one of :data:`SETTINGS` in ``folder``, its output to ``log``: wall seconds, output, log.

    A checkpoint left in the folder by a run of the same setting is resumed (CellBender's own
    behaviour; its hash leaves out the FPR), so a second FPR costs only the output step.
    """
    output = folder / f"cellbender_fpr{fpr}.h5"
    command = remove_background_command(raw, output, fpr=fpr, **options, **SETTINGS[setting])
    start = time.perf_counter()
    with log.open("w") as handle:  # in $OUT as it runs: a run cut short still shows its seconds per epoch
        result = subprocess.run(command, cwd=folder, stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed; see {log}")
    return seconds, output, log.read_text()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=5000)
    parser.add_argument("--barcodes", type=int, default=100_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument(
        "--total-droplets", type=int, help="barcodes analysed (CellBender picks when unset; set it for small matrices)"
    )
    parser.add_argument("--ours", nargs="*", choices=["soupx", "decontx"], default=["soupx", "decontx"])
    parser.add_argument("--settings", nargs="*", choices=list(SETTINGS), default=["fast", "default"])
    parser.add_argument(
        "--fpr", nargs="+", type=float, default=[0.01, 0.1], help="target FPRs; the first trains, the others resume"
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/cellbender-bench"))
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (default: the GPU)")


def run(args: argparse.Namespace) -> None:
    out = Path(os.environ.get("OUT") or args.workdir)
    args.workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    droplets = generate_raw_droplets(args.cells, args.barcodes, args.genes, seed=0)
    raw = args.workdir / f"raw_{args.cells}_{args.barcodes}_{args.genes}.h5"
    if not raw.exists():
        write_10x_h5(droplets.counts, raw, barcodes=droplets.barcodes)
    print(f"generated {raw} in {time.perf_counter() - start:.0f} s", flush=True)
    device = "CPU" if args.cpu else _gpu_name()
    options = {"expected_cells": args.cells, "total_droplets": args.total_droplets, "cuda": not args.cpu}
    rows = []
    table = out / "cellbender_bench.tsv"
    for method in args.ours:
        seconds, cells = run_omicsprep(raw, method, backend="cpu" if args.cpu else "gpu")
        rows.append(
            {"setting": f"omicsprep {method}", "fpr": np.nan, "seconds": round(seconds, 1)} | quality(cells, droplets)
        )
        print(rows[-1], flush=True)
        pd.DataFrame(rows).to_csv(table, sep="\t", index=False)
    for setting in args.settings:
        folder = args.workdir / setting
        shutil.rmtree(folder, ignore_errors=True)  # a checkpoint of an earlier run would be resumed
        folder.mkdir(parents=True)
        for fpr in args.fpr:  # the table is rewritten after each run: one cut short keeps what was measured
            log_path = out / f"cellbender_{setting}_fpr{fpr}.log"
            seconds, output, log = run_cellbender(raw, folder, setting, fpr=fpr, log=log_path, **options)
            row = {
                "setting": f"CellBender {setting}",
                "fpr": fpr,
                "seconds": round(seconds, 1),
                "to_trained_s": seconds_to_trained(log),
            }
            row |= quality(called_by_cellbender(read_cellbender(output)), droplets)
            print(row, flush=True)
            rows.append(row)
            pd.DataFrame(rows).to_csv(table, sep="\t", index=False)
    print(f"\n{args.cells} cells among {args.barcodes} barcodes x {args.genes} genes, {device} ({platform.node()})")
    print(pd.DataFrame(rows).to_string(index=False, float_format="%.3f"))


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
