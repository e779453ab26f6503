"""Where the qc and cluster rules spend their time: both rules' work in one process, profiled.

    python -m benchmarks step_profile --cells 300000 --backend gpu --out prof/

Generates (or reuses) a dataset as the e2e suite does, then reads it, runs the qc rule's chain,
writes and reads its h5ad, runs the cluster rule's chain and writes its h5ad, with the
benchmark settings (``common.BENCH_CONFIG``). Prints each phase's seconds, the steps' seconds and, per
chain, the functions with the most cumulative time (cProfile), and writes them to ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io as text_io
import json
import os
import pstats
import time
from pathlib import Path

from benchmarks.common import bench_settings, clustering_options, dataset


def profiled(function, *args, top: int, **kwargs) -> tuple[object, str]:
    profile = cProfile.Profile()
    result = profile.runcall(function, *args, **kwargs)
    listing = text_io.StringIO()
    pstats.Stats(profile, stream=listing).sort_stats("cumulative").print_stats(top)
    return result, listing.getvalue()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=20_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-bench"))
    parser.add_argument("--out", type=Path, default=Path("profile_steps"))
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--compressions",
        nargs="+",
        default=["lzf"],
        choices=["lzf", "gzip", "none"],
        help="h5ad compressions to time the writes and reads between the rules with",
    )


def run(args: argparse.Namespace) -> None:
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    from omicsprep import io
    from omicsprep.options import DoubletOptions, QcOptions, from_config
    from omicsprep.rna.pipeline import run_clustering, run_qc

    phases: dict[str, float] = {}

    def timed(name: str, function, *a, **kw):
        start = time.perf_counter()
        result = function(*a, **kw)
        phases[name] = round(time.perf_counter() - start, 2)
        print(f"{name:>14} {phases[name]:8.2f} s", flush=True)
        return result

    config = bench_settings(args.workdir)
    counts = timed("generate", dataset, args.workdir, args.cells, args.genes, jobs=os.cpu_count())
    adata = timed("read_counts", io.read_counts, counts)
    (adata, _), qc_profile = timed(
        "qc",
        profiled,
        run_qc,
        adata,
        options=from_config(QcOptions, config["qc"]),
        doublet_options=from_config(DoubletOptions, config["doublets"]),
        seed=config["seed"],
        backend=args.backend,
        top=args.top,
    )
    for name in args.compressions:
        qc_h5ad = args.workdir / f"profile_qc_{args.cells}_{name}.h5ad"
        timed(f"write_qc_{name}", io.write_h5ad, adata, qc_h5ad, compression=None if name == "none" else name)
    for name in args.compressions:
        adata = timed(f"read_qc_{name}", io.read_h5ad, args.workdir / f"profile_qc_{args.cells}_{name}.h5ad")
    _, cluster_profile = timed(
        "cluster",
        profiled,
        run_clustering,
        adata,
        options=clustering_options(config),
        seed=config["seed"],
        backend=args.backend,
        top=args.top,
    )
    for name in args.compressions:
        timed(
            f"write_cluster_{name}",
            io.write_h5ad,
            adata,
            args.workdir / f"profile_cluster_{args.cells}_{name}.h5ad",
            compression=None if name == "none" else name,
        )
    steps = {rule: adata.uns["omicsprep"][rule]["timings"] for rule in ("qc", "cluster")}
    summary = {
        "cells": args.cells,
        "backend": args.backend,
        "phases": phases,
        "steps": steps,
        "cells_kept": adata.n_obs,
        "nnz": int(adata.X.nnz),
    }
    print(json.dumps(summary, indent=1))
    (args.out / f"profile_{args.backend}_{args.cells}.json").write_text(json.dumps(summary, indent=1))
    (args.out / f"profile_{args.backend}_{args.cells}.txt").write_text(qc_profile + "\n" + cluster_profile)
    print(qc_profile[:6000], cluster_profile[:6000], sep="\n")
