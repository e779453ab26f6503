"""Molecule tables in to counts out: pyarrow + Numba (CPU) against cuDF + CUDA (GPU).

    python -m benchmarks umi_table --reads 10000000 --formats parquet tsv.gz --backends cpu gpu

Generates a molecule table per size and format (reads.py's reads: skewed genes, PCR
duplicates, UMI errors, N, unassigned and multi-gene reads; cached in ``--workdir``), then
times :func:`omicsprep.reads.counting.count_umis` in this process (directional; each backend warmed
up on a small table first, so kernel compilation is not counted) and reports reads/s.
Where both backends ran, their counts and skipped reads are compared. The table, with
machine and date, is appended to ``--results``.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from benchmarks.common import RESULTS, append_results
from omicsprep.backend import resolve_backend
from omicsprep.options import UmiOptions
from omicsprep.reads import counting
from omicsprep.testing.reads import generate_reads


def molecule_table(workdir: Path, n_reads: int, fmt: str) -> Path:
    path = workdir / f"molecules_{n_reads}.{fmt}"
    if not path.exists():
        reads = generate_reads(n_reads, n_cells=max(100, n_reads // 20_000), n_genes=20_000, umi_length=12, seed=3)
        partial = path.with_name(f".{path.name}")
        columns = ["cell", "umi", "gene"]
        if fmt == "parquet":
            reads[columns].to_parquet(partial)
        else:  # pyarrow's writer and gzip level 1: pandas' (level 9) takes minutes per 10M rows
            text = pa.Table.from_pandas(reads[columns], preserve_index=False)
            options = pacsv.WriteOptions(delimiter="\t", quoting_style="none")
            with gzip.open(partial, "wb", compresslevel=1) if fmt.endswith(".gz") else partial.open("wb") as out:
                pacsv.write_csv(text, out, write_options=options)
        partial.rename(path)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reads", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--formats", nargs="+", default=["parquet", "tsv.gz"], choices=["parquet", "tsv", "tsv.gz"])
    parser.add_argument("--backends", nargs="+", default=["cpu", "gpu"], choices=["cpu", "gpu"])
    parser.add_argument("--chunk-rows", type=int, default=UmiOptions().chunk_rows)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-umi-tables"))
    parser.add_argument("--results", type=Path, default=RESULTS)


def run(args: argparse.Namespace) -> None:
    args.workdir.mkdir(parents=True, exist_ok=True)
    warm_up = molecule_table(args.workdir, 100_000, "tsv")
    for backend in args.backends:
        counting.count_umis(warm_up, fmt="molecules", backend=resolve_backend(backend))
    rows = []
    for n_reads in args.reads:
        for fmt in args.formats:
            path = molecule_table(args.workdir, n_reads, fmt)
            results = {}
            for backend in args.backends:
                start = time.perf_counter()
                adata = counting.count_umis(
                    path,
                    fmt="molecules",
                    options=UmiOptions(chunk_rows=args.chunk_rows),
                    backend=resolve_backend(backend),
                )
                seconds = time.perf_counter() - start
                results[backend] = adata
                rows.append(
                    {
                        "reads": n_reads,
                        "format": fmt,
                        "backend": backend,
                        "seconds": round(seconds, 2),
                        "reads_per_s": round(n_reads / seconds),
                        "molecules": int(adata.X.sum()),
                        "partitions": adata.uns["umi_dedup"]["partitions"],
                    }
                )
                print(rows[-1], flush=True)
            if len(results) == 2:
                tables = [
                    counting.long_table(adata).sort_values(["gene", "cell"]).reset_index(drop=True)
                    for adata in results.values()
                ]
                skipped = [adata.uns["umi_dedup"]["reads_skipped"] for adata in results.values()]
                rows[-1]["same_as_cpu"] = tables[0].equals(tables[1]) and skipped[0] == skipped[1]
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    append_results(
        args.results,
        title="Molecule tables to counts",
        table=table,
        note=f"generate.py's reads, directional, --chunk-rows {args.chunk_rows}, in one process after a "
        f"warm-up per backend (compilation not counted).",
    )
