"""End-to-end benchmark: the workflow (CPU and/or GPU backend) against a plain scanpy script.

    python -m benchmarks e2e --cells 20000 100000 --backends cpu gpu --peer
    python -m benchmarks e2e --quick        # ~1 minute on 2 cores; used by the test suite
    python -m benchmarks e2e --cells 5000 --backends cpu gpu --cold   # a fresh machine's first run, then the next

For each size: generates data (omicsprep/testing/generate.py, cached in the work folder), runs the
workflow with each backend and the peer (benchmarks/peer_scanpy.py) with the same settings,
reads per-rule wall time and peak memory from the rules' benchmark files (and logs, for jobs
run by the GPU pool), checks agreement
(Leiden adjusted Rand index and HVG overlap against the peer), prints one table and appends
it with machine, versions, date and command to RESULTS.md, and saves the raw rows under
benchmarks/scaling/ from which the scaling plot (cells vs seconds, per backend) is drawn.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml
from sklearn.metrics import adjusted_rand_score

from benchmarks.common import (
    HERE,
    RESULTS,
    append_results,
    bench_config,
    child_environment,
    dataset,
    kernel_caches,
    run_snakemake,
    stop_pool,
    user_environment,
    versions,
)
from omicsprep.jobs import read_phases

COMPUTE_RULES = ("qc", "cluster")


def run_workflow(
    workdir: Path, counts: Path, config: Path, backend: str, cores: int, *, caches: dict[str, str], label: str
) -> dict:
    """One run of the workflow on ``counts``, its kernels compiled into and loaded from ``caches``.

    ``caches`` (:func:`kernel_caches`; empty: the machine's) go into the run's environment;
    ``label`` is added to the run's name.
    """
    name = backend + label
    rundir = workdir / f"{name}_{counts.stem}"
    rundir.mkdir(parents=True, exist_ok=True)
    sheet = rundir / "samples.tsv"
    sheet.write_text(f"sample\tinput\nbench\t{counts}\n")
    shutil.rmtree(rundir / "results", ignore_errors=True)  # as a first run finds it; not Snakemake's to remove
    launched = time.time()
    wall = run_snakemake(rundir, config=config, sheet=sheet, backend=backend, cores=cores, environment=caches)
    times = pd.read_csv(rundir / "results" / "run_times.tsv", sep="\t")
    totals = times[times["step"] == "total"].set_index("rule")
    steps = times[times["step"] != "total"]
    logged = [phases for phases in map(read_phases, rundir.glob("logs/*/*.log")) if phases]
    return {
        "label": f"workflow-{name}",
        "wall_s": round(wall, 2),
        "rules_in_pool": f"{sum('pool_worker' in phases for phases in logged)}/{len(logged)}",
        "compute_rules_s": round(float(totals.loc[totals.index.isin(COMPUTE_RULES), "seconds"].sum()), 2),
        "steps_s": round(float(steps.loc[~steps["step"].isin(["to_device", "to_host"]), "seconds"].sum()), 2),
        "peak_rss_mb": round(float(totals["max_rss_mb"].max()), 1),
        "obs": pd.read_parquet(rundir / "results" / "bench" / "obs.parquet"),
        "hvg": _hvg(rundir / "results" / "bench" / "processed.h5ad"),
        "steps": times.set_index(["rule", "step"])["seconds"].rename(f"workflow-{name}"),
        "phases": phase_breakdown(rundir, times, label=f"workflow-{name}"),
        "outside": outside_rules(rundir, launched=launched, wall=wall, label=f"workflow-{name}"),
    }


TRANSFER_STEPS = ("to_device", "to_host", "matrices_to_host")


STEP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ omicsprep\.provenance: step (\S+) +([\d.]+) s$")


def step_spans(log: Path) -> list[tuple[str, float, float]]:
    """Each step a rule's log records: its name, start and end (seconds since the epoch).

    From the lines :class:`omicsprep.provenance.StepTimer` logs as a step ends, time-stamped
    in this machine's local time (the rule ran here).
    """
    spans = []
    for line in log.read_text().splitlines():
        if match := STEP_LINE.match(line):
            stamp, name, seconds = match.groups()
            ended = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            spans.append((name, ended - float(seconds), ended))
    return spans


def phase_breakdown(rundir: Path, times: pd.DataFrame, *, label: str) -> pd.DataFrame:
    """Where each rule's wall time went, in seconds: one row per rule and sample.

    ``total`` is the rule's process as Snakemake's ``benchmark:`` measured it; within it
    ``start_imports`` (interpreter, imports, the pipeline's and readers' imports in the
    body, and the RAPIDS imports of a GPU rule), ``read`` and ``write`` (omicsprep.io;
    writing includes waiting for the figures drawn in a second process), ``transfers``
    (steps moving data to and from the GPU), ``compute`` (the rest of the script's body) and
    ``other`` (Snakemake's wrapper around the script, and the process's exit). Beside them,
    ``background_write``: writing done in a background thread while the rule went on
    (:func:`omicsprep.background.background_writes`), overlapping the others. And when,
    on the rule's timeline (:func:`step_spans`): ``first_step_at`` (the process's start
    to its first step's: all the first step waited for), ``steps_span`` (its first step's
    start to its last step's end) and ``after_steps`` (its last step's end to the body's
    end: the writes and figures waited for).
    """
    rows = []
    for _, total in times[times["step"] == "total"].iterrows():
        log = rundir / "logs" / total["rule"] / f"{total['sample']}.log"
        phases = read_phases(log)
        if phases is None:
            continue
        spans = step_spans(log)
        first_start, last_end = (spans[0][1], spans[-1][2]) if spans else (float("nan"), float("nan"))
        steps = times[(times["rule"] == total["rule"]) & (times["sample"] == total["sample"])]
        transfers = float(steps.loc[steps["step"].isin(TRANSFER_STEPS), "seconds"].sum())
        startup, body = phases.get("startup", float("nan")), phases["body"]
        read, write, imports = (phases.get(name, 0.0) for name in ("read", "write", "imports"))
        imports += phases.get("gpu_import", 0.0)
        rows.append(
            {
                "run": label,
                "rule": total["rule"],
                "sample": total["sample"],
                "total": total["seconds"],
                "start_imports": startup + imports,
                "read": read,
                "transfers": transfers,
                "compute": body - read - write - imports - transfers,
                "write": write,
                "background_write": phases.get("background_write", 0.0),
                "other": total["seconds"] - startup - body,
                "first_step_at": first_start - phases["started_at"],
                "steps_span": last_end - first_start,
                "after_steps": phases["ended_at"] - last_end,
            }
        )
    return pd.DataFrame(rows).round(2)


def outside_rules(rundir: Path, *, launched: float, wall: float, label: str) -> dict:
    """Where a run's wall time went outside its rules' processes, in seconds.

    From the rules' start and end (their logs' phases lines) against the run's launch:
    ``before_first_rule`` (Snakemake's start, parsing the workflow and building the DAG),
    ``between_rules`` (no rule's process running: Snakemake finishing one job and
    starting the next), ``after_last_rule`` (Snakemake's end), and ``in_rules`` (at
    least one rule's process running).
    """
    spans = sorted(
        (phases["started_at"], phases["ended_at"])
        for log in (rundir / "logs").glob("*/*.log")
        if (phases := read_phases(log)) is not None and phases.get("started_at", 0.0) >= launched - 1.0
    )
    in_rules, covered_until = 0.0, spans[0][0]
    for start, end in spans:
        in_rules += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    before, after = spans[0][0] - launched, launched + wall - covered_until
    return {
        "run": label,
        "wall": round(wall, 2),
        "in_rules": round(in_rules, 2),
        "before_first_rule": round(before, 2),
        "between_rules": round(wall - in_rules - before - after, 2),
        "after_last_rule": round(after, 2),
    }


def warm_kernels(backend: str, config: Path, caches: dict[str, str]) -> float:
    """Run ``omicsprep warm-kernels`` with the run's configuration into ``caches``; its wall seconds."""
    command = [sys.executable, "-m", "omicsprep.cli", "warm-kernels", "--backend", backend, "--configfile", str(config)]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False, env={**user_environment(), **caches})
    if result.returncode != 0:
        raise RuntimeError(f"omicsprep warm-kernels ({backend}) failed:\n{result.stderr[-5000:]}")
    return round(time.perf_counter() - start, 2)


def _hvg(h5ad: Path) -> set[str]:
    from omicsprep.io import read_h5ad_elements

    var = read_h5ad_elements(h5ad, ["var"])["var"]
    return set(var.index[var["highly_variable"]])


def run_peer(workdir: Path, counts: Path, config: Path) -> dict:
    out = workdir / f"peer_{counts.stem}"
    start = time.perf_counter()
    peer = [sys.executable, "-m", "benchmarks.peer_scanpy", str(counts), str(config), str(out)]
    subprocess.run(peer, check=True, env=child_environment())
    wall = time.perf_counter() - start
    timings = json.loads((out / "timings.json").read_text())
    var = pd.read_parquet(out / "var.parquet")
    return {
        "label": "peer-scanpy",
        "wall_s": round(wall, 2),
        "compute_rules_s": round(wall, 2),
        "steps_s": round(sum(v for k, v in timings["steps"].items() if k not in ("read", "write")), 2),
        "peak_rss_mb": timings["max_rss_mb"],
        "obs": pd.read_parquet(out / "obs.parquet"),
        "hvg": set(var.index[var["highly_variable"]]),
    }


def agreement(result: dict, reference: dict | None) -> dict:
    if reference is None or result is reference:
        return {"ari_vs_peer": None, "hvg_overlap_vs_peer": None}
    common = result["obs"].index.intersection(reference["obs"].index)
    ari = adjusted_rand_score(result["obs"].loc[common, "leiden_1.0"], reference["obs"].loc[common, "leiden_1.0"])
    overlap = len(result["hvg"] & reference["hvg"]) / max(len(reference["hvg"]), 1)
    return {"ari_vs_peer": round(ari, 4), "hvg_overlap_vs_peer": round(overlap, 4)}


def plot(scaling_dir: Path, path: Path) -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    frames = [pd.read_csv(p, sep="\t") for p in sorted(scaling_dir.glob("*.tsv"))]
    if not frames:
        return
    data = pd.concat(frames)
    fig, ax = plt.subplots(figsize=(6.5, 4.5), dpi=120)
    for (label, host), rows in data.groupby(["label", "host"]):
        rows = rows.sort_values("cells")
        ax.plot(rows["cells"], rows["wall_s"], marker="o", label=f"{label} ({host})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cells")
    ax.set_ylabel("seconds, end to end")
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.canvas.draw()
    # 64 colours: a quarter of the bytes of matplotlib's RGBA PNG, for a figure kept in the tree.
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba())
    image.convert("RGB").quantize(colors=64).save(path, optimize=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, nargs="+", default=[20_000])
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--backends", nargs="+", default=["cpu"], choices=["cpu", "gpu"])
    parser.add_argument("--peer", action="store_true", help="also run the plain scanpy script")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="each backend from empty kernel caches (a fresh machine's first run), then again (its next run)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="first run `omicsprep warm-kernels` for each backend into this machine's caches (untimed), "
        "as on a machine that has run the workflow before",
    )
    parser.add_argument("--quick", action="store_true", help="2,000 cells x 5,000 genes, cpu and peer")
    parser.add_argument("--cpu-max-cells", type=int, default=None, help="skip the CPU backend and peer above this")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-bench"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--scaling-dir", type=Path, default=HERE / "scaling")
    parser.add_argument("--plot", type=Path, default=HERE / "scaling.png")
    parser.add_argument("--host", default=None, help="label for this machine in the plot")
    parser.add_argument(
        "--h5ad-compression", choices=["none", "lzf", "gzip"], default=None, help="instead of the shipped config's"
    )


def run(args: argparse.Namespace) -> None:
    if args.quick:
        args.cells, args.genes, args.backends, args.peer = [2_000], 5_000, ["cpu"], True
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = bench_config(args.workdir, h5ad_compression=args.h5ad_compression)
    host = args.host or platform.node()
    args.scaling_dir.mkdir(parents=True, exist_ok=True)
    for n_cells in args.cells:
        # Each size is recorded as soon as it is done, so a run cut short keeps what it measured.
        table, steps, phases, outside = benchmark_size(args, n_cells, config, host)
        print(table.to_string(index=False), flush=True)
        stamp = append_results(
            args.results,
            title=f"{n_cells:,} cells",
            note=f"{versions()}. h5ad_compression: {yaml.safe_load(config.read_text())['h5ad_compression']}.",
            table=table.drop(columns=["host"]),
            level="####",
        )
        append_table(
            args.results,
            "Seconds per rule (`total`: the rule's process, from its `benchmark:` file) and per step within it",
            None if steps is None else steps.astype(str),
        )
        append_table(
            args.results,
            "Where each rule's seconds went (`benchmarks/e2e.py`'s `phase_breakdown`: start-up and imports, "
            "reading, device transfers, computing, writing, and Snakemake's wrapper and the exit as `other`; "
            "on its timeline, when its first step started, the span of its steps, and its end after them)",
            phases,
        )
        append_table(
            args.results,
            "Where each run's seconds went outside its rules' processes (`outside_rules`: Snakemake's start, "
            "its work between jobs, its end)",
            outside,
        )
        table.to_csv(args.scaling_dir / f"{host}-{stamp[:10]}-{n_cells}.tsv", sep="\t", index=False)
        plot(args.scaling_dir, args.plot)


def append_table(path: Path, intro: str, frame: pd.DataFrame | None) -> None:
    """Print ``frame`` and append it to ``path`` (RESULTS.md) after ``intro``; nothing for none or an empty one."""
    if frame is None or frame.empty:
        return
    print(frame.to_string(index=False), flush=True)
    with path.open("a") as handle:
        handle.write(f"\n{intro}:\n\n" + frame.to_markdown(index=False) + "\n")


def benchmark_size(
    args: argparse.Namespace, n_cells: int, config: Path, host: str
) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame | None, pd.DataFrame | None]:
    """Run every backend (and the peer) on one generated dataset: one row each, and the timings.

    The timings are the workflow runs' seconds per rule and step, per rule where they went
    (:func:`phase_breakdown`), and per run where they went outside the rules
    (:func:`outside_rules`); ``None`` without a workflow run.
    """
    counts = dataset(args.workdir, n_cells, args.genes, jobs=args.cores)
    on_cpu = args.cpu_max_cells is None or n_cells <= args.cpu_max_cells
    backends = [b for b in args.backends if b == "gpu" or on_cpu]
    results = []
    for backend in backends:
        if args.warm:
            print(f"warm-kernels ({backend}): {warm_kernels(backend, config, {})} s", flush=True)
        # On the GPU a first run (the GPU pool started by it), then the next (the pool warm): as
        # a user runs the workflow, then again with a setting changed. With --cold, from empty caches.
        stop_pool()
        with tempfile.TemporaryDirectory(prefix="kernel-caches-", dir=args.workdir) as folder:
            caches = kernel_caches(Path(folder)) if args.cold else {}
            run = functools.partial(run_workflow, args.workdir, counts, config, backend, args.cores, caches=caches)
            first = "-cold" if args.cold else "-first" if backend == "gpu" else ""
            results += [run(label=first), *([run(label="-next")] if backend == "gpu" or args.cold else [])]
    peer = run_peer(args.workdir, counts, config) if args.peer and on_cpu else None
    steps = pd.concat([result["steps"] for result in results], axis=1).reset_index() if results else None
    phases = pd.concat([result["phases"] for result in results]) if results else None
    outside = pd.DataFrame([result["outside"] for result in results]) if results else None
    rows = []
    for result in [*results, *([peer] if peer else [])]:
        shown = {k: v for k, v in result.items() if k not in ("obs", "hvg", "steps", "phases", "outside")}
        rows.append(
            {
                "cells": n_cells,
                "genes": args.genes,
                **shown,
                "cells_kept": len(result["obs"]),
                **agreement(result, peer),
                "host": host,
            }
        )
    return pd.DataFrame(rows), steps, phases, outside
