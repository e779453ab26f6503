"""DecontX speed: pydecontx (the Python port of celda's decontX) against omicsprep's, CPU and GPU.

    python -m benchmarks decontx [--cells 10000 --barcodes 500000 --genes 33000]
        [--backend cpu gpu] [--skip-reference --reference-seconds S] [--results benchmarks/RESULTS.md]
        [--profile]

Generates raw droplets (omicsprep/testing/droplets.py) and keeps the true cells, clustered by their
planted type. Times ``pydecontx.decontx`` and ``omicsprep.cells.decontx.decontx`` on each
backend, end to end (on the GPU: copies to and from the device included, after a warm-up on
a small slice so CuPy's kernels are compiled), both run to convergence with the same
options, and prints seconds, EM iterations, the speed-up over pydecontx and the largest
difference in per-cell contamination. Where pydecontx is not installed (the GPU machine),
``--skip-reference`` skips it and ``--reference-seconds`` takes its time measured elsewhere
for the speed-up. ``--results`` appends the table to that file. ``--profile`` then runs the
GPU's EM once more phase by phase, with the device synchronised between phases, and prints
the seconds of the set-up and the mean per iteration of each phase.
"""

# The profile runs decontx's private steps one by one.
# ruff: noqa: SLF001
from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import sparse

from benchmarks.common import append_results
from omicsprep.backend import array_module, cupyx_sparse
from omicsprep.cells import decontx as decontx_module
from omicsprep.cells.decontx import decontx
from omicsprep.testing.droplets import generate_raw_droplets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--barcodes", type=int, default=500_000)
    parser.add_argument("--genes", type=int, default=33_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", nargs="+", choices=["cpu", "gpu"], default=["cpu"])
    parser.add_argument("--skip-reference", action="store_true", help="do not run pydecontx")
    parser.add_argument("--reference-seconds", type=float, help="pydecontx's time measured elsewhere, for the ratio")
    parser.add_argument("--results", type=Path, help="append the table to this file (RESULTS.md)")
    parser.add_argument("--profile", action="store_true", help="time the GPU's EM phase by phase")


def run(args: argparse.Namespace) -> None:

    raw = generate_raw_droplets(args.cells, args.barcodes, args.genes, seed=args.seed)
    is_cell = raw.truth["is_cell"].to_numpy()
    cells = raw.counts[is_cell]
    clusters = raw.truth["cell_type"].to_numpy()[is_cell]
    print(f"{cells.shape[0]} cells x {cells.shape[1]} genes, {cells.nnz:,} non-zero entries", flush=True)

    rows = []
    reference_contamination = None
    reference_seconds = args.reference_seconds
    if not args.skip_reference:
        import pydecontx

        start = time.perf_counter()
        reference = pydecontx.decontx(cells.T.tocsc(), z=clusters)
        reference_seconds = time.perf_counter() - start
        reference_contamination = reference.contamination
        rows.append(
            {
                "tool": f"pydecontx {pydecontx.__version__}",
                "seconds": round(reference_seconds, 2),
                "iterations": reference.estimates["all_cells"]["iteration"],
            }
        )
        print(rows[-1], flush=True)
    for backend in args.backend:
        if backend == "gpu":  # compile CuPy's kernels outside the timing
            decontx(cells[:500], clusters=clusters[:500], backend="gpu")
        start = time.perf_counter()
        ours = decontx(cells, clusters=clusters, backend=backend)
        seconds = time.perf_counter() - start
        row: dict[str, object] = {"tool": f"omicsprep ({backend})", "seconds": round(seconds, 3)}
        row["iterations"] = ours.iterations
        if reference_seconds is not None:
            row["speed-up"] = round(reference_seconds / seconds, 1)
        if reference_contamination is not None:
            row["max |contamination - pydecontx|"] = f"{np.abs(ours.contamination - reference_contamination).max():.1e}"
        rows.append(row)
        print(row, flush=True)
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False))
    if args.results is not None:
        note = (
            f"DecontX on {cells.shape[0]:,} generated cells x {cells.shape[1]:,} genes ({cells.nnz:,} non-zero), "
            f"clustered by planted type; to convergence (0.001), default options."
        )
        append_results(args.results, title="DecontX", note=note, table=table)
    if args.profile:
        profile_gpu(cells, clusters)


def profile_gpu(cells: sparse.csr_matrix, clusters: np.ndarray) -> None:
    """Run ``decontx``'s EM on the GPU (default options) phase by phase and print where the time goes.

    The steps are those of :func:`omicsprep.cells.decontx.decontx` (its private helpers),
    called one by one with the device synchronised around each, so a phase's time is its
    kernels' and transfers' time.
    """
    import cupy

    dx = decontx_module
    device = cupy.cuda.Device()
    seconds: dict[str, list[float]] = {}

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        device.synchronize()
        start = time.perf_counter()
        yield
        device.synchronize()
        seconds.setdefault(name, []).append(time.perf_counter() - start)

    xp = array_module("gpu")
    with phase("setup and transfer"):
        entries = dx._entries(cells, clusters, xp=xp, sparse_module=cupyx_sparse(), bins_by_product=True)
    theta = xp.asarray(np.random.default_rng(12345).beta(10.0, 10.0, size=cells.shape[0]))
    with phase("first profiles"):
        phi, eta = dx._profiles(entries.counts * theta[entries.cell], entries, floor=dx.PSEUDOCOUNT)
    for _ in range(500):
        with phase("native counts"):
            native = dx._native_counts(entries, theta, phi, eta)
        with phase("profiles"):
            phi, eta = dx._profiles(native, entries, floor=0.0)
        with phase("per-cell sums"):
            native_totals = entries.per_cell(native)
        with phase("Dirichlet fit"):
            contamination = xp.clip((entries.cell_totals - native_totals) / entries.cell_totals, 0.0, 1.0)
            prior = dx.fit_dirichlet_shares(contamination, xp=xp)
        with phase("convergence check"):
            updated = (native_totals + prior[0]) / (entries.cell_totals + prior.sum())
            change = float(xp.abs(updated - theta).max())
        theta = updated
        if change < 0.001:
            break
    with phase("corrected counts back"):
        cupy.asnumpy(dx._native_counts(entries, theta, phi, eta))
    print(f"GPU profile ({len(seconds['native counts'])} iterations): milliseconds, total and mean per call")
    for name, times in seconds.items():
        print(f"  {name:24s} total {1e3 * sum(times):9.2f}  mean {1e3 * np.mean(times):8.3f}")
