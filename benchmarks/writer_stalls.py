"""Why rule cluster's background writes are slow beside its steps: how long each step holds the interpreter.

    python -m benchmarks writer_stalls --cells 200000 --backend gpu

At a million cells on an H100, the normalized matrix and counts that rule cluster writes in a
background thread took 16-17 s beside its steps (about 5 s alone, `deflate_threads`), and
threads switching every 0.5 ms instead of 5 did not change that (benchmarks/RESULTS.md). If a
step's library calls hold the interpreter's lock throughout (C++ called without releasing it),
the writer waits for the whole call, and only a second process would write beside it.

This runs the cluster rule's steps (``run_clustering``, the benchmark settings) on generated
counts three ways: alone; with a thread that wakes every millisecond and records how long it
waited (the longest wait per step is how long the step held the lock at once); and with that
thread beside the rule's own background write of the normalized matrix (compressed as
``h5ad_compression: gzip``), whose seconds are compared with the same write alone.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks.common import BackgroundThread, bench_settings, clustering_options
from omicsprep.testing.generate import generate


class Ticker(BackgroundThread):
    """A thread that sleeps a millisecond at a time and keeps each wake-up's time and wait."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes: list[tuple[float, float]] = []

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.wakes.append((now, now - last))
            last = now

    def longest_wait(self, start: float, end: float) -> float:
        """The longest wait that ended between ``start`` and ``end`` (seconds)."""
        return max((wait for at, wait in self.wakes if start < at <= end), default=0.0)


def clustered(counts, *, backend: str, options, after_step=None) -> list[tuple[str, float]]:
    """Run the cluster rule's steps on a copy of ``counts``; each step's name and end time."""
    from anndata import AnnData

    from omicsprep.rna.pipeline import run_clustering

    ends: list[tuple[str, float]] = []

    def ended(step: str, adata: AnnData) -> None:
        ends.append((step, time.perf_counter()))
        if after_step is not None:
            after_step(step, adata)

    run_clustering(AnnData(counts.copy()), options=options, seed=0, backend=backend, after_step=ended)
    return ends


def write_normalized(adata, folder: Path) -> float:
    """The normalized matrix and counts written as rule cluster writes them (gzip); the seconds taken."""
    from anndata import AnnData

    from omicsprep import io
    from omicsprep.backend import asnumpy

    start = time.perf_counter()
    normalized, counts = asnumpy(adata.X), asnumpy(adata.layers["counts"])
    on_host = AnnData(normalized, obs=adata.obs[[]], var=adata.var[[]], layers={"counts": counts})
    with io.h5ad_in_parts(on_host, folder / "processed.h5ad", compression="gzip") as parts:
        parts.write("X", normalized)
        parts.write_layers({"counts": counts}, x=normalized)
        parts.finish(on_host)
    return time.perf_counter() - start


def windows(ends: list[tuple[str, float]], start: float) -> list[tuple[str, float, float]]:
    """Each step's name, start and end, from the steps' end times and the first step's start."""
    starts = [start] + [end for _, end in ends[:-1]]
    return [(step, begun, end) for (step, end), begun in zip(ends, starts, strict=True)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=200_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--backend", choices=["cpu", "gpu"], default="gpu")


def run(args: argparse.Namespace) -> None:
    from concurrent.futures import ThreadPoolExecutor

    counts = generate(args.cells, args.genes, seed=0)
    options = clustering_options(bench_settings(Path(tempfile.mkdtemp())))
    print(f"{args.cells} cells x {args.genes} genes, {counts.nnz} non-zeros; backend {args.backend}", flush=True)
    clustered(counts, backend=args.backend, options=options)  # unmeasured: imports, kernels, handles

    start = time.perf_counter()
    alone = clustered(counts, backend=args.backend, options=options)
    rows = {step: {"alone_s": end - begun} for step, begun, end in windows(alone, start)}

    with Ticker() as ticker:
        start = time.perf_counter()
        ticked = clustered(counts, backend=args.backend, options=options)
    for step, begun, end in windows(ticked, start):
        rows[step]["longest_hold_ms"] = 1000 * ticker.longest_wait(begun, end)

    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(max_workers=1) as writer:
        normalized: list = []

        def write_after_normalize(step: str, adata) -> None:  # as the rule starts its background write
            if step == "normalize":
                normalized.append(adata.copy())
                normalized.append(writer.submit(write_normalized, normalized[0], Path(folder)))

        with Ticker() as ticker:
            start = time.perf_counter()
            beside = clustered(counts, backend=args.backend, options=options, after_step=write_after_normalize)
            seconds_beside = normalized[1].result()
        for step, begun, end in windows(beside, start):
            rows[step]["longest_hold_ms_writing"] = 1000 * ticker.longest_wait(begun, end)
        seconds_alone = write_normalized(normalized[0], Path(folder))
    print(pd.DataFrame(rows).T.round(3).to_markdown())
    print(f"normalized matrix and counts written: {seconds_beside:.2f} s beside the steps, {seconds_alone:.2f} s alone")
