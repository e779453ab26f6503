"""A study end to end, as a user runs it: `snakemake --cores N --resources gpu=1`, the shipped config.

    python -m benchmarks study --samples 16 --cells 10000 --backends gpu cpu --workdir /tmp/study
    python -m benchmarks study --demo --backends gpu cpu --workdir /tmp/study

Generates the study (omicsprep/testing/generate.py: each sample its own cells and depth, drawn from
one set of cell types; cached in the work folder) or takes the bundled demo, runs the
workflow in a fresh folder with the mission's command (``--config backend=cpu`` for the CPU),
and prints one table: wall seconds per run and the CPU's over each GPU run's, then the
seconds of each rule summed over samples, its process start-up (from the rules' logs) and
the most rules that ran at once. The GPU runs twice: first with no pool of warm processes
(the run starts it, as a user's first run does), then again with the pool the first left
(as the next run, after a changed setting, finds it). With ``--warm-up``, each backend first runs
the study once, unmeasured, so that both find the study's kernels compiled (a machine's first
run compiles its Numba and CUDA kernels for the study's types once, and the GPU tests compile
others). With ``--results``, each run's logs (``logs_<study>_<run>.tgz``) and the pool's log go
beside the tables.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import sparse

from benchmarks.common import REPO, machine, stop_pool, user_environment
from omicsprep.jobs import read_phases
from omicsprep.pool import socket_path
from omicsprep.testing import snakemake_command
from omicsprep.testing.generate import CHUNK, chunk_counts, profiles, write_10x_h5


def study_sample(task: tuple[int, int, int]) -> sparse.csr_matrix:
    """One sample's counts (``task``: index, cells, genes): the study's cell types, its own cells and depth."""
    index, n_cells, n_genes = task
    cdfs = profiles(n_genes, np.random.default_rng(0))
    depth = 0.7 + 0.6 * np.random.default_rng([1, index]).random()
    chunks = []
    for chunk, start in enumerate(range(0, n_cells, CHUNK)):
        rng = np.random.default_rng([2, index, chunk])
        counts, _ = chunk_counts(min(CHUNK, n_cells - start), n_genes, cdfs, rng)
        chunks.append(counts)
    counts = sparse.vstack(chunks, format="csr")
    counts.data = np.maximum(np.round(counts.data * depth), 1).astype(np.float32)
    return counts


def write_study(folder: Path, *, n_samples: int, n_cells: int, n_genes: int) -> Path:
    """The study's 10x HDF5 files and its sample sheet (batch: the sample; four donors); the sheet's path."""
    from concurrent.futures import ProcessPoolExecutor

    folder.mkdir(parents=True, exist_ok=True)
    sheet = folder / f"samples_{n_samples}x{n_cells}.tsv"
    paths = [folder / f"sample{index:02d}_{n_cells}x{n_genes}.h5" for index in range(n_samples)]
    missing = [index for index, path in enumerate(paths) if not path.exists()]
    with ProcessPoolExecutor() as pool:
        tasks = [(index, n_cells, n_genes) for index in missing]
        for index, counts in zip(missing, pool.map(study_sample, tasks), strict=True):
            write_10x_h5(counts, paths[index], compression="gzip")
    rows = [f"sample{index:02d}\t{path}\tsample{index:02d}\tdonor{index % 4}" for index, path in enumerate(paths)]
    sheet.write_text("sample\tinput\tbatch\tdonor\n" + "\n".join(rows) + "\n")
    return sheet


def run_study(
    rundir: Path, *, sheet: Path, configfiles: list[Path], backend: str, cores: int, extra: list[str]
) -> float:
    """The mission's command in a fresh ``rundir``; its wall seconds."""
    subprocess.run(["rm", "-rf", *(str(rundir / name) for name in ("results", "logs", "benchmarks", ".snakemake"))])
    rundir.mkdir(parents=True, exist_ok=True)
    command = snakemake_command(
        "--directory",
        str(rundir),
        "--configfile",
        *map(str, configfiles),
        "--config",
        f"samples={sheet}",
        *([f"backend={backend}"] if backend == "cpu" else []),
        "--cores",
        str(cores),
        "--resources",
        "gpu=1",
        *extra,
        "--quiet",
    )
    print("$", shlex.join(command), flush=True)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=user_environment())
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"workflow ({backend}) failed:\n{result.stderr[-5000:]}")
    return wall


def rule_table(rundir: Path, label: str, *, timeline: Path | None = None) -> tuple[pd.DataFrame, int]:
    """Per rule: jobs, seconds summed over them (benchmark files), mean start-up (logs), most at once.

    With ``timeline``, each job's start, waiting and end (seconds from the first job's start) go there as CSV.
    """
    rows, spans = [], []
    for path in sorted((rundir / "benchmarks").glob("*/*.tsv")):
        seconds = float(pd.read_csv(path, sep="\t")["s"].iloc[0])
        phases = read_phases(rundir / "logs" / path.parent.name / f"{path.stem}.log") or {}
        rows.append({"rule": path.parent.name, "job": path.stem, "seconds": seconds, **phases})
        if "started_at" in phases:
            spans.append((phases["started_at"], phases["ended_at"]))
    frame = pd.DataFrame(rows)
    if "startup" not in frame:
        frame["startup"] = np.nan
    if timeline is not None and "started_at" in frame:
        first = frame["started_at"].min()
        jobs = frame.assign(start=frame["started_at"] - first, end=frame["ended_at"] - first).sort_values("start")
        jobs.drop(columns=["started_at", "ended_at"]).round(2).to_csv(timeline, index=False)
    table = frame.groupby("rule").agg(jobs=("seconds", "size"), seconds=("seconds", "sum"), startup=("startup", "mean"))
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = np.cumsum([step for _, step in events]) if events else np.zeros(1)
    table.columns = pd.MultiIndex.from_product([[label], table.columns])
    return table.round(2), int(running.max())


def keep_logs(rundir: Path, archive: Path) -> None:
    """The rules' logs and Snakemake's of a run, in one archive."""
    with tarfile.open(archive, "w:gz") as tar:
        for folder in ("logs", ".snakemake/log"):
            if (rundir / folder).exists():
                tar.add(rundir / folder, arcname=folder)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--demo", action="store_true", help="the bundled demo instead of a generated study")
    parser.add_argument("--backends", nargs="+", default=["gpu", "cpu"], choices=["gpu", "cpu"])
    parser.add_argument("--cores", type=int, default=16)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-study"))
    parser.add_argument("--extra", default="", help="more Snakemake arguments (a tuning tip, not the default)")
    parser.add_argument("--warm-up", action="store_true", help="run each backend once, unmeasured, first")
    parser.add_argument("--results", type=Path, help="append the tables to this Markdown file")


def run(args: argparse.Namespace) -> None:
    configfiles = [REPO / "config" / "config.yaml"]
    if args.demo:
        sheet, name = REPO / "resources" / "demo" / "samples.tsv", "demo"
        configfiles.append(REPO / "resources" / "demo" / "config.yaml")
    else:
        name = f"{args.samples}x{args.cells}"
        sheet = write_study(args.workdir / "data", n_samples=args.samples, n_cells=args.cells, n_genes=args.genes)
    if os.environ.get("OMICSPREP_POOL_WORKERS"):  # a tuning tip, named in the tables it gives
        name += f"_{os.environ['OMICSPREP_POOL_WORKERS']}workers"
    walls, tables, at_once = {}, [], {}
    runs = [
        label
        for backend in args.backends
        for label in ((f"{backend}-first", f"{backend}-next") if backend == "gpu" else (backend,))
    ]
    warm_ups = [f"{backend}-warm-up" for backend in args.backends] if args.warm_up else []
    for label in [*warm_ups, *runs]:
        backend = label.split("-")[0]
        rundir = args.workdir / f"{name}_{backend}"
        if args.demo:  # the demo's sheet names files under resources/
            rundir.mkdir(parents=True, exist_ok=True)
            (rundir / "resources").unlink(missing_ok=True)
            (rundir / "resources").symlink_to(REPO / "resources")
        if label == "gpu-first":
            stop_pool()
        wall = run_study(
            rundir, sheet=sheet, configfiles=configfiles, backend=backend, cores=args.cores, extra=args.extra.split()
        )
        if label in warm_ups:
            print(f"{label}: {wall:.2f} s (not measured)", flush=True)
            continue
        walls[label] = wall
        timeline = args.results.with_name(f"timeline_{name}_{label}.csv") if args.results else None
        table, at_once[label] = rule_table(rundir, label, timeline=timeline)
        tables.append(table)
        if args.results:  # the next run of the folder writes over them
            keep_logs(rundir, args.results.with_name(f"logs_{name}_{label}.tgz"))
    pool_log = socket_path().with_suffix(".log")
    if args.results and pool_log.exists():
        shutil.copyfile(pool_log, args.results.with_name("pool.log"))
    summary = pd.DataFrame(
        {"wall_s": {label: round(s, 2) for label, s in walls.items()}, "most_rules_at_once": at_once}
    ).rename_axis("run")
    if "cpu" in walls:
        summary["cpu_over_this"] = [round(walls["cpu"] / wall, 2) for wall in walls.values()]
    command = shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]])
    text = (
        f"#### {name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `{command}`\n\n"
        f"{machine()}\n\n{summary.to_markdown()}\n\n{pd.concat(tables, axis=1).to_markdown()}\n"
    )
    print(text, flush=True)
    if args.results:
        with args.results.open("a") as handle:
            handle.write(text + "\n")
