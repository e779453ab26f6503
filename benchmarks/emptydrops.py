"""EmptyDrops speed: DropletUtils' ``emptyDrops`` (R, one core) against omicsprep's on CPU and GPU.

    python -m benchmarks emptydrops [--niters 10000] [--retain 2000] [--skip-r] [--gpu] [--profile]

Generates the raw droplets of ``generate_raw_droplets`` (defaults: 10,000 cells among 500,000
barcodes x 33,000 genes), runs ``emptyDrops`` in R (one core, SerialParam) and
:func:`omicsprep.cells.emptydrops.empty_drops` on the CPU backend (all cores Numba is given)
and, with ``--gpu``, on the GPU backend, all with the same ``niters`` and ``retain``; prints
seconds, speedup over R and agreement of the calls (FDR <= 0.001) with R's and with the truth.
Our timings exclude Numba's compilation (a small warm-up run first). R's time is that of the
``emptyDrops`` call alone (reading the matrix excluded). ``--profile`` also prints, per backend,
the seconds of each phase of the timed call (the GPU's synchronised before its phase ends).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numba
import numpy as np
import pandas as pd

from omicsprep.cells import emptydrops, montecarlo
from omicsprep.cells.emptydrops import empty_drops
from omicsprep.testing.droplets import generate_raw_droplets

CALLED = 0.001
# Phase -> (module, function) timed by --profile; what they leave out is totals, ranks and subsetting.
PHASES = {
    "rounding, totals, detected": (emptydrops, "_integer_counts"),
    "ambient (Good-Turing)": (emptydrops, "_safe_good_turing"),
    "alpha MLE": (emptydrops, "_estimate_alpha"),
    "observed log-probabilities": (emptydrops, "_data_log_prob"),
    "Monte Carlo inputs": (montecarlo, "simulation_inputs"),
    "Monte Carlo (cpu)": (montecarlo, "count_cpu"),
    "FDR": (emptydrops, "_fdr"),
}

R_SCRIPT = """
suppressPackageStartupMessages({library(DropletUtils); library(Matrix)})
args <- commandArgs(trailingOnly=TRUE)
dims <- as.integer(strsplit(args[2], ",")[[1]])  # genes, barcodes, nonzeros
read_int <- function(name, n) readBin(file.path(args[1], name), "integer", n=n, size=4)
m <- new("dgCMatrix", i=read_int("indices.bin", dims[3]), p=read_int("indptr.bin", dims[2] + 1L),
         x=as.numeric(read_int("data.bin", dims[3])), Dim=dims[1:2])
set.seed(0)
elapsed <- system.time(out <- emptyDrops(m, niters=as.integer(args[3]), retain=as.numeric(args[4])))[["elapsed"]]
writeBin(as.numeric(out$FDR), file.path(args[1], "fdr.bin"))
cat(elapsed, "\\n")
"""


def time_dropletutils(counts, *, niters: int, retain: float) -> tuple[float, np.ndarray]:
    """Seconds of DropletUtils' ``emptyDrops`` and its FDR per barcode."""
    csc = counts.T.tocsc()  # genes x barcodes, as R's dgCMatrix
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        csc.indices.astype(np.int32).tofile(folder / "indices.bin")
        csc.indptr.astype(np.int32).tofile(folder / "indptr.bin")
        np.rint(csc.data).astype(np.int32).tofile(folder / "data.bin")
        (folder / "run.R").write_text(R_SCRIPT)
        dims = f"{csc.shape[0]},{csc.shape[1]},{csc.nnz}"
        result = subprocess.run(
            ["Rscript", str(folder / "run.R"), directory, dims, str(niters), str(retain)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode:
            raise RuntimeError(f"Rscript failed:\n{result.stderr[-3000:]}")
        return float(result.stdout.split()[-1]), np.fromfile(folder / "fdr.bin")


def _timed(function: Callable, seconds: list[float], synchronize: Callable[[], None]) -> Callable:
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = function(*args, **kwargs)
        synchronize()
        seconds.append(time.perf_counter() - start)
        return out

    return timed


@contextmanager
def profiled(backend: str) -> Iterator[dict[str, list[float]]]:
    """Times each call of :data:`PHASES`' functions (and the GPU Monte Carlo) while inside."""
    phases = dict(PHASES)
    synchronize: Callable[[], None] = lambda: None  # noqa: E731
    if backend == "gpu":
        from numba import cuda

        from omicsprep.cells import montecarlo_cuda

        phases["Monte Carlo (gpu)"] = (montecarlo_cuda, "count_gpu")
        synchronize = cuda.synchronize
    seconds: dict[str, list[float]] = defaultdict(list)
    originals = {name: getattr(module, function) for name, (module, function) in phases.items()}
    for name, (module, function) in phases.items():
        setattr(module, function, _timed(originals[name], seconds[name], synchronize))
    try:
        yield seconds
    finally:
        for name, (module, function) in phases.items():
            setattr(module, function, originals[name])


def time_ours(counts, *, niters: int, retain: float, backend: str, profile: bool) -> tuple[float, np.ndarray]:
    """Seconds of :func:`empty_drops` (after a warm-up that compiles the kernels) and its FDR."""
    empty_drops(counts[:20_000], niters=10, retain=retain, backend=backend)  # type: ignore[arg-type]
    with profiled(backend) as phases:
        start = time.perf_counter()
        result = empty_drops(counts, niters=niters, retain=retain, backend=backend)  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
    if profile:
        print(f"phases of omicsprep {backend} (s):", flush=True)
        for name, times in phases.items():
            if times:
                print(f"  {name:30} {sum(times):7.3f}", flush=True)
        rest = seconds - sum(map(sum, phases.values()))
        print(f"  {'rest (totals, ranks, subsets)':30} {rest:7.3f}\n  {'total':30} {seconds:7.3f}", flush=True)
    return seconds, result.table["fdr"].to_numpy()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--barcodes", type=int, default=500_000)
    parser.add_argument("--genes", type=int, default=33_000)
    parser.add_argument("--niters", type=int, default=10_000)
    parser.add_argument("--retain", type=float, default=2000.0, help="total at and above which barcodes are cells")
    parser.add_argument("--skip-r", action="store_true", help="do not run DropletUtils (machines without R)")
    parser.add_argument("--gpu", action="store_true", help="also time the GPU backend")
    parser.add_argument("--profile", action="store_true", help="print the seconds of each phase per backend")


def run(args: argparse.Namespace) -> None:

    start = time.perf_counter()
    droplets = generate_raw_droplets(args.cells, args.barcodes, args.genes, seed=0)
    counts = droplets.counts
    print(
        f"generated {counts.shape[0]:,} barcodes x {counts.shape[1]:,} genes, {counts.nnz:,} nonzeros "
        f"in {time.perf_counter() - start:.0f} s; niters {args.niters}, retain {args.retain:g}",
        flush=True,
    )
    truth = droplets.truth["is_cell"].to_numpy()
    runs: dict[str, tuple[float, np.ndarray]] = {}
    if not args.skip_r:
        runs["DropletUtils (R, 1 core)"] = time_dropletutils(counts, niters=args.niters, retain=args.retain)
    runs[f"omicsprep cpu ({numba.get_num_threads()} threads)"] = time_ours(
        counts, niters=args.niters, retain=args.retain, backend="cpu", profile=args.profile
    )
    if args.gpu:
        runs["omicsprep gpu"] = time_ours(
            counts, niters=args.niters, retain=args.retain, backend="gpu", profile=args.profile
        )
    reference = next(iter(runs.values()))
    rows = []
    for name, (seconds, fdr) in runs.items():
        called, called_reference = fdr <= CALLED, reference[1] <= CALLED
        rows.append(
            {
                "run": name,
                "seconds": round(seconds, 2),
                "speedup": round(reference[0] / seconds, 1),
                "cells": int(called.sum()),
                "agree_with_first": float(np.mean(called == called_reference)),
                "differ_from_first": int(np.sum(called != called_reference)),
                "recall_of_truth": float(called[truth].mean()),
                "false_calls": int(called[~truth].sum()),
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
