"""Writing and reading the rules' AnnData outputs in each store and codec: seconds and size.

    python -m benchmarks output_codecs RESULT.h5ad [...] [--threads N] [--results benchmarks/RESULTS.md]

Issue 21 asks for outputs at half today's size at the same speed or better. Each input (a
``qc.h5ad`` or ``processed.h5ad`` of a run) is read once, then written and read back in
every mode: ``.h5ad`` uncompressed (today's default), with HDF5's lzf or gzip (level 4,
anndata's), with 16-bit indices where genes allow (anndata's
``write_csr_csc_indices_with_min_possible_dtype``), and as a zarr store, format 2 and format
3 (zarr's default codec, Zstandard), format 3 sharded too (``auto_shard_zarr_v3``). zarr's
codecs run on ``--threads`` threads; HDF5's on one. ``--results`` appends the table, with
machine, date and command, to that file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import anndata as ad
import pandas as pd

from benchmarks.common import append_results

# name: (suffix, write options, anndata settings)
MODES: dict[str, tuple[str, dict, dict]] = {
    "h5ad": (".h5ad", {}, {}),
    "h5ad lzf": (".h5ad", {"compression": "lzf"}, {}),
    "h5ad gzip": (".h5ad", {"compression": "gzip"}, {}),
    "h5ad 16-bit indices": (".h5ad", {}, {"write_csr_csc_indices_with_min_possible_dtype": True}),
    "zarr 2": (".zarr", {}, {"zarr_write_format": 2}),
    "zarr 3": (".zarr", {}, {"zarr_write_format": 3}),
    "zarr 3 sharded": (".zarr", {}, {"zarr_write_format": 3, "auto_shard_zarr_v3": True}),
}


def size_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(adata: ad.AnnData, folder: Path, mode: str) -> dict:
    suffix, options, settings = MODES[mode]
    path = folder / f"out{suffix}"
    with ad.settings.override(**settings):
        start = time.perf_counter()
        if suffix == ".h5ad":
            adata.write_h5ad(path, **options)
        else:
            adata.write_zarr(path)
        written = time.perf_counter() - start
    start = time.perf_counter()
    back = ad.read_h5ad(path) if suffix == ".h5ad" else ad.read_zarr(path)
    read = time.perf_counter() - start
    if back.shape != adata.shape or back.X.nnz != adata.X.nnz:
        msg = f"{mode}: read back {back.shape}, {back.X.nnz} non-zeros; wrote {adata.shape}, {adata.X.nnz}"
        raise RuntimeError(msg)
    size = size_bytes(path)
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    return {"mode": mode, "write_s": round(written, 2), "read_s": round(read, 2), "size_mb": round(size / 1e6, 1)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", type=Path, nargs="+")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--workdir", type=Path, default=None, help="where the outputs are written (a temporary folder)")
    parser.add_argument("--results", type=Path, default=None)


def run(args: argparse.Namespace) -> None:
    import zarr

    zarr.config.set({"threading.max_workers": args.threads})
    rows = []
    for source in args.inputs:
        adata = ad.read_h5ad(source)
        with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
            for mode in args.modes:
                row = {"input": source.name, "cells": adata.n_obs, "nnz": adata.X.nnz}
                row |= measure(adata, Path(folder), mode)
                print(row, flush=True)
                rows.append(row)
    table = pd.DataFrame(rows)
    baseline = table[table["mode"] == "h5ad"].set_index("input")
    table["size_vs_h5ad"] = (table["size_mb"] / table["input"].map(baseline["size_mb"])).round(2)
    table["write_vs_h5ad"] = (table["write_s"] / table["input"].map(baseline["write_s"])).round(2)
    print(table.to_string(index=False))
    if args.results:
        note = f"{args.threads} threads for zarr's codecs; anndata {ad.__version__}, zarr {zarr.__version__}."
        append_results(args.results, title="Stores and codecs of the outputs", note=note, table=table)
