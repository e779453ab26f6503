"""Deflated HDF5 datasets in threads against HDF5's own filter: a 10x matrix read, .h5ad matrices written and read.

    python -m benchmarks deflate_threads --cells 200000 --dir /tmp [--repeats 2]

1. A generated count matrix stored as Cell Ranger stores it (gzip level 4, shuffle, chunks of
   80,000 values) is read by ``omicsprep.io.read_counts``, its chunks decompressed by HDF5
   (one thread; as before) and by :func:`omicsprep.io.deflated.read_deflated` (every core).
2. Its normalized values, indices and index pointers (a ``processed.h5ad``'s ``X``) are
   written contiguous and uncompressed (``h5ad_compression: null``) and deflated at level 1
   in threads (``gzip``), then read back by HDF5 and in threads.
Each file is written, synced to disk and timed, best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import pandas as pd

from omicsprep import io
from omicsprep.io import counts as counts_module
from omicsprep.io.deflated import codec_threads, create_deflated, read_deflated
from omicsprep.testing.generate import generate, write_10x_h5

CELL_RANGER_CHUNK = 80_000


def best(repeats: int, work) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=200_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--repeats", type=int, default=2)


def run(args: argparse.Namespace) -> None:
    counts = generate(args.cells, args.genes, seed=0)
    counts.sort_indices()
    rows = []

    plain, tenx = args.dir / "deflate_bench_plain.h5", args.dir / "deflate_bench_10x.h5"
    write_10x_h5(counts, plain)
    with h5py.File(plain, "r") as source, h5py.File(tenx, "w") as handle:  # the arrays as Cell Ranger stores them
        matrix = handle.create_group("matrix")
        for name, item in source["matrix"].items():
            if name in ("data", "indices", "indptr"):
                create_deflated(matrix, name, item[...], level=4, chunk_rows=CELL_RANGER_CHUNK)
            else:
                source["matrix"].copy(item, matrix, name=name)
    plain.unlink()
    raw_bytes = counts.nnz * (4 + 8)
    ratio = tenx.stat().st_size / raw_bytes

    def read_by_hdf5() -> None:
        with mock.patch.object(counts_module, "read_deflated", return_value=None):
            io.read_counts(tenx)

    for way, work in (("HDF5 decompresses", read_by_hdf5), ("in threads", lambda: io.read_counts(tenx))):
        seconds = best(args.repeats, work)
        rows.append(("10x matrix as Cell Ranger's", f"read_counts: {way}", seconds, raw_bytes / seconds / 1e9, ratio))
    tenx.unlink()

    totals = np.repeat(np.asarray(counts.sum(axis=1)).ravel(), np.diff(counts.indptr))
    normalized = np.log1p(counts.data * (1e4 / totals)).astype(np.float32)  # normalize_total, log1p
    arrays = {"data": normalized, "indices": counts.indices, "indptr": counts.indptr}
    raw_bytes = sum(values.nbytes for values in arrays.values())
    path = args.dir / "deflate_bench.h5"
    writers = {
        "uncompressed, contiguous": lambda group, name, values: group.create_dataset(name, data=values),
        "gzip level 1, threads": lambda group, name, values: create_deflated(group, name, values),
    }
    for way, create in writers.items():

        def write(create=create) -> None:
            with h5py.File(path, "w") as handle:
                for name, values in arrays.items():
                    create(handle, name, values)
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

        seconds = best(args.repeats, write)
        ratio = path.stat().st_size / raw_bytes
        rows.append((f"processed.h5ad's X, {way}", "write, synced", seconds, raw_bytes / seconds / 1e9, ratio))
        for reader, read in (("HDF5", lambda ds: ds[...]), ("threads", lambda ds: read_deflated(ds))):
            if reader == "threads" and way.startswith("uncompressed"):
                continue

            def read_all(read=read) -> None:
                with h5py.File(path, "r") as handle:
                    for name in arrays:
                        read(handle[name])

            seconds = best(args.repeats, read_all)
            rows.append((f"processed.h5ad's X, {way}", f"read: {reader}", seconds, raw_bytes / seconds / 1e9, ratio))
    path.unlink()
    table = pd.DataFrame(rows, columns=["file", "operation", "seconds", "GB_per_s_of_values", "size_vs_values"])
    print(f"{args.cells:,} cells x {args.genes:,} genes, {counts.nnz:,} non-zeros; {codec_threads()} codec threads")
    print(table.round(3).to_markdown(index=False))
