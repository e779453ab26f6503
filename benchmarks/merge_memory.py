"""Host memory of the merge's reading and concatenation as samples are added, on one backend.

    python -m benchmarks merge_memory --cells 100000 --samples 2 8 --backend gpu --results RESULTS.md

Rule merge reads each sample's counts when it takes them (``io.H5adSamples``); on the GPU
the counts go to the device before the next sample is read, so that host memory holds one
sample at a time however many there are. Here one generated sample (``--cells`` cells,
written as rule cluster writes, gzip) is linked ``N`` times for each ``--samples`` ``N``, and
each way runs in a process of its own, which reports its peak resident memory:

- ``one at a time``: ``concatenate_samples(io.H5adSamples(...))``, as rule merge does;
- ``all read first``: every sample read into memory, then concatenated (the merge before).

The concatenated counts' size (values, indices and index pointers) is given beside.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from anndata import AnnData

from benchmarks.common import append_results
from omicsprep import io
from omicsprep.testing.generate import generate_with_clusters
from omicsprep.testing.genes import gene_names

# Run in a fresh process per way and count (its peak RSS is the way's); prints one JSON line.
MEASURE = """
import json, resource, sys, time
from omicsprep import io
from omicsprep.backend import prepare_gpu, synchronize
from omicsprep.rna.integration import concatenate_samples
paths, way, backend = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
prepare_gpu(backend)
start = time.perf_counter()
samples = io.H5adSamples(paths, skip=("X", "obsm", "obsp", "varm", "uns"))
if way == "all read first":
    samples = dict(samples.items())
merged = concatenate_samples(samples, labels="leiden_1.0", backend=backend)
synchronize(backend=backend)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=100_000, help="cells per sample")
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--samples", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--backend", choices=["cpu", "gpu"], default="gpu")
    parser.add_argument("--results", type=Path)


def run(args: argparse.Namespace) -> None:

    with tempfile.TemporaryDirectory(prefix="merge-memory-") as folder:
        counts, clusters = generate_with_clusters(args.cells, args.genes, seed=0, jobs=os.cpu_count() or 1)
        sample = AnnData(
            layers={"counts": counts},
            obs=pd.DataFrame(
                {"leiden_1.0": pd.Categorical(clusters.astype(str))}, index=[f"c{i}" for i in range(args.cells)]
            ),
            var=pd.DataFrame(index=gene_names(args.genes)),
        )
        first = Path(folder) / "sample_0.h5ad"
        io.write_h5ad(sample, first, compression="gzip")
        entry_bytes = counts.data.itemsize + counts.indices.itemsize  # float32 after the merge, 32-bit indices
        rows = []
        for n_samples in args.samples:
            paths = {}
            for index in range(n_samples):
                paths[f"s{index}"] = Path(folder) / f"sample_{index}.h5ad"
                if not paths[f"s{index}"].exists():
                    os.link(first, paths[f"s{index}"])
            for way in ("one at a time", "all read first"):
                command = [
                    sys.executable,
                    "-c",
                    MEASURE,
                    json.dumps({k: str(v) for k, v in paths.items()}),
                    way,
                    args.backend,
                ]
                result = subprocess.run(command, capture_output=True, text=True, check=False)
                if result.returncode != 0:
                    raise SystemExit(result.stderr[-3000:])
                measured = json.loads(result.stdout.strip().splitlines()[-1])
                rows.append(
                    {
                        "samples": n_samples,
                        "cells": n_samples * args.cells,
                        "merged counts GB": round(n_samples * counts.nnz * entry_bytes / 1e9, 2),
                        "way": way,
                        "seconds": round(measured["seconds"], 1),
                        "peak host RSS GB": round(measured["peak_rss_gb"], 2),
                    }
                )
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False))
    if args.results:
        title = f"Merge reading, {args.cells:,}-cell samples, {args.backend} backend"
        note = f"One generated sample ({counts.nnz:,} entries, {args.genes:,} genes) linked N times."
        append_results(args.results, title=title, note=note, table=table)
