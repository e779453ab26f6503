"""UMI deduplication alone, reads already in memory: CPU (pandas + Numba) against GPU (cuDF + CUDA).

    python -m benchmarks umi_dedup --reads 10000000 100000000 --backends cpu gpu \
        [--cpu-max-reads 10000000] [--methods directional unique] [--results benchmarks/RESULTS.md]

For every size, encoded reads (cell and gene codes, packed 12-base UMIs; reads.py's
model: log-normal genes, PCR duplicates, UMI errors) are placed in host memory for the CPU
and in GPU memory for the GPU. Per method it times the collapse into sorted molecules
(group by cell, gene, UMI; sort) and the counting kernel, and reports reads/s over both.
The kernels are compiled first on a small input, and that first call is reported apart.
Where both backends run, their counts are compared. The table, with machine and date, is
appended to ``--results``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import RESULTS, append_results
from omicsprep.options import METHODS
from omicsprep.reads.umi import collapse_reads, count_groups, molecule_groups
from omicsprep.testing.reads import generate_read_codes


class Device:
    """Where the reads sit and which kernel counts them."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        if backend == "gpu":
            from omicsprep.backend import cudf, cupy, resolve_backend
            from omicsprep.reads.umi_cuda import count_groups_gpu

            resolve_backend("gpu")
            self.xp, self._cudf, self._kernel = cupy(), cudf(), count_groups_gpu
        else:
            self.xp = np

    def place(self, reads: pd.DataFrame):
        if self.backend == "cpu":
            return reads
        return self._cudf.DataFrame({name: self.xp.asarray(reads[name].to_numpy()) for name in reads.columns})

    def count(self, umis, counts, starts, method: int):
        if self.backend == "gpu":
            return self._kernel(umis, counts, starts, method, 1, xp=self.xp)
        return count_groups(umis, counts, starts, method, 1)

    def synchronize(self) -> None:
        if self.backend == "gpu":
            self.xp.cuda.get_current_stream().synchronize()

    def to_host(self, array):
        return array.get() if self.backend == "gpu" else array


def dedup(device: Device, frame, method: int) -> tuple[dict, np.ndarray]:
    """Collapse and count once; seconds of each part and the molecules per group."""
    start = time.perf_counter()
    _, _, umis, counts, starts = molecule_groups(collapse_reads(frame), xp=device.xp)
    device.synchronize()
    collapsed = time.perf_counter()
    molecules = device.count(umis, counts, starts, method)
    device.synchronize()
    done = time.perf_counter()
    timings = {
        "molecules_in": int(umis.size),
        "groups": int(starts.size - 1),
        "collapse_s": collapsed - start,
        "count_s": done - collapsed,
    }
    return timings, device.to_host(molecules)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reads", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--backends", nargs="+", choices=["cpu", "gpu"], default=["cpu"])
    parser.add_argument("--cpu-max-reads", type=int, default=10_000_000, help="larger sizes run on the GPU only")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--results", type=Path, default=RESULTS)


def run(args: argparse.Namespace) -> None:
    devices = {backend: Device(backend) for backend in args.backends}
    rows = []
    warmup = generate_read_codes(20_000, n_cells=50, n_genes=500, seed=1)
    for device in devices.values():
        for method in args.methods:
            start = time.perf_counter()
            dedup(device, device.place(warmup), METHODS.index(method))
            print(
                f"{device.backend} {method}: first call (compilation or cache load) "
                f"{time.perf_counter() - start:.2f} s",
                flush=True,
            )
    for n_reads in args.reads:
        reads = generate_read_codes(n_reads, seed=0)
        for method in args.methods:
            results = {}
            for backend, device in devices.items():
                if backend == "cpu" and n_reads > args.cpu_max_reads:
                    continue
                timings, results[backend] = dedup(device, device.place(reads), METHODS.index(method))
                seconds = timings["collapse_s"] + timings["count_s"]
                row = {
                    "backend": backend,
                    "method": method,
                    "reads": n_reads,
                    **timings,
                    "molecules_out": int(results[backend].sum()),
                    "reads_per_s": round(n_reads / seconds),
                }
                rows.append(row)
                print(row, flush=True)
            if len(results) == 2:
                rows[-1]["same_counts_as_cpu"] = bool(np.array_equal(results["cpu"], results["gpu"]))
    table = pd.DataFrame(rows)
    for column in ("collapse_s", "count_s"):
        table[column] = table[column].round(3)
    print(table.to_string(index=False))
    append_results(
        args.results,
        title="UMI deduplication, reads in memory",
        table=table,
        note="Reads from `generate_read_codes` (10,000 cells, 20,000 genes, 12-base UMIs); reads/s over "
        "collapse + count.",
    )
