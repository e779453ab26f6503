"""Fragments to a cells x tiles matrix, CPU against GPU: fragments/s and peak memory.

    python -m benchmarks fragments --fragments 10000000 100000000 --backends cpu gpu

Per size it writes a 10x ``fragments.tsv`` (fragments.py: 10,000 cells, 20% background
barcodes, sorted; cached in ``--work``), then, in a fresh process per backend, counts it
into 5 kb tiles with ``omicsprep.atac.fragments.count_fragments`` over
``io.fragment_chunks``. Reported: seconds and fragments/s for the file to the matrix; on
the GPU also the counting alone, from chunks already parsed into GPU memory (the
target's "counts"); host memory: the process's peak, and the peak above what it held
before counting (libraries, warm-up), next to one parsed chunk's size and the output
matrix's (the target: no more than the two together); on the GPU RMM's peak allocation.
The table, with machine and date, is appended to ``--results``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import pandas as pd

from benchmarks.common import RESULTS, append_results, device_statistics, measure_in_child
from omicsprep.testing.fragments import fragment_barcodes, write_fragments

N_CELLS = 10_000


def measure(path: Path, backend: str, chunk_rows: int | None) -> dict:
    """Count ``path`` into tiles on one backend, in this process."""
    from omicsprep import io
    from omicsprep.atac.fragments import count_fragments
    from omicsprep.backend import resolve_backend, synchronize
    from omicsprep.jobs import return_freed_memory

    resolve_backend(backend)
    chunk_rows = io.FRAGMENT_CHUNK_ROWS[backend] if chunk_rows is None else chunk_rows
    return_freed_memory()  # as the workflow's rules do
    statistics = device_statistics() if backend == "gpu" else None
    barcodes = pd.Index(fragment_barcodes(N_CELLS, seed=0))  # the generator's cells
    warm = io.fragment_chunks(path, chunk_rows=10_000, backend=backend)  # load libraries, compile kernels
    count_fragments([next(iter(warm))], barcodes=barcodes, backend=backend)
    before = resident_mb()
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here on
    start = time.perf_counter()
    adata = count_fragments(
        io.fragment_chunks(path, chunk_rows=chunk_rows, backend=backend), barcodes=barcodes, backend=backend
    )
    seconds = time.perf_counter() - start
    n_fragments = int(adata.obs["n_fragments"].sum()) + adata.uns["fragments"]["outside_cells"]
    row = {
        "fragments": n_fragments,
        "backend": backend,
        "chunk_rows": chunk_rows,
        "seconds": round(seconds, 2),
        "fragments_per_s_M": round(n_fragments / seconds / 1e6, 1),
    }
    if backend == "gpu":  # the counting alone: chunks parsed into GPU memory first
        chunks = list(io.fragment_chunks(path, chunk_rows=chunk_rows, backend=backend))
        synchronize(backend=backend)
        start = time.perf_counter()
        count_fragments(chunks, barcodes=barcodes, backend=backend)
        counting = time.perf_counter() - start
        row["counting_only_s"] = round(counting, 2)
        row["counting_per_s_M"] = round(n_fragments / counting / 1e6, 1)
        del chunks
    row["tiles"] = adata.n_vars
    row["peak_host_mb"] = round(peak_resident_mb())
    row["counting_host_mb"] = round(peak_resident_mb() - before)
    first = next(iter(io.fragment_chunks(path, chunk_rows=chunk_rows, backend=backend)))
    row["chunk_mb"] = round(int(first.memory_usage(deep=True).sum()) / 2**20)
    row["output_mb"] = round(sum(a.nbytes for a in (adata.X.data, adata.X.indices, adata.X.indptr)) / 2**20)
    if statistics is not None:
        row["peak_gpu_gb"] = round(statistics.get_statistics().peak_bytes / 2**30, 2)
    return row


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def peak_resident_mb() -> float:
    """The process's peak resident memory (VmHWM), since its last reset."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fragments", nargs="+", type=int, default=[10_000_000])
    parser.add_argument("--backends", nargs="+", choices=["cpu", "gpu"], default=["cpu"])
    parser.add_argument("--chunk-rows", type=int, help="fragments per chunk (default: the backend's default)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/omicsprep_fragments"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--one", nargs=2, metavar=("PATH", "BACKEND"), help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.one:
        print(json.dumps(measure(Path(args.one[0]), args.one[1], args.chunk_rows)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.fragments:
        path = args.work / f"fragments_{n}.tsv"
        if not path.exists():
            start = time.perf_counter()
            write_fragments(path.with_suffix(".part"), n, n_cells=N_CELLS, jobs=os.cpu_count() or 1)
            path.with_suffix(".part").rename(path)
            print(
                f"wrote {path} ({path.stat().st_size / 2**30:.1f} GB) in {time.perf_counter() - start:.0f} s",
                flush=True,
            )
        for backend in args.backends:
            rows = ["--chunk-rows", str(args.chunk_rows)] if args.chunk_rows else []
            row = measure_in_child("fragments", "--one", str(path), backend, *rows)
            rows += [row] if row else []
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    append_results(
        args.results,
        title="Fragments to tiles",
        table=table,
        note=f"Generated 10x fragments (plain TSV, {N_CELLS:,} cells + background barcodes), 5 kb tiles; "
        "seconds after a warm-up call.",
    )
