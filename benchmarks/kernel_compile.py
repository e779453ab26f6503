"""A fresh machine's kernel compiles in qc's and cluster's steps, and what compiling them ahead saves.

    python -m benchmarks kernel_compile [--processes 16] [--out DIR]

Each step is a fresh process running :func:`omicsprep.warmup.warm_kernels` (qc's and cluster's
steps on a generated sample of 4,000 cells), with CuPy's, Numba's and the CUDA driver's caches
in folders of its own:

1. ``cold``: from empty caches, recording CuPy's kernel requests into a manifest
   (``cupy_kernels.json.gz`` under ``--out``: what ``omicsprep warm-kernels --record`` writes);
2. ``warm``: again on those caches: the floor;
3. ``ahead``: from empty caches, that manifest compiled first in ``--processes`` processes
   (:mod:`omicsprep.kernels`, as ``omicsprep warm-kernels`` does), then the steps.

For each: seconds, requests, and kernels compiled during the steps (files added to CuPy's
cache). Prints a table and writes it (``kernel_compile_bench.tsv``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks.common import child_environment, kernel_caches


def cached_kernels() -> int:
    folder = Path(os.environ["CUPY_CACHE_DIR"])
    return len(list(folder.glob("*.cubin"))) if folder.is_dir() else 0


def child(args: argparse.Namespace) -> None:
    """One step in this process."""
    from omicsprep.backend import cupy
    from omicsprep.cli import workflow_config
    from omicsprep.kernels import manifest_of, recorded_requests, start_compiling_ahead, write_manifest
    from omicsprep.warmup import warm_kernels

    cp = cupy()
    cp.cuda.runtime.free(0)
    manifest = args.out / "cupy_kernels.json.gz"
    ahead = 0.0
    if args.child == "ahead":
        start = time.perf_counter()
        start_compiling_ahead(processes=args.processes, manifest_path=manifest).finish()
        ahead = time.perf_counter() - start
    before = cached_kernels()
    start = time.perf_counter()
    with recorded_requests() as requests:
        warm_kernels(workflow_config([]), backend="gpu", n_cells=args.cells)
    steps = time.perf_counter() - start
    if args.child == "cold":
        write_manifest(manifest_of(requests, cupy_version=cp.__version__), manifest)
    row = {
        "step": args.child,
        "ahead_s": round(ahead, 2),
        "steps_s": round(steps, 2),
        "requests": len(requests),
        "compiled_in_steps": cached_kernels() - before,
        "manifest_kb": round(manifest.stat().st_size / 1e3, 1) if manifest.exists() else 0,
    }
    print(json.dumps(row))


def run_step(step: str, args: argparse.Namespace, caches: dict[str, str]) -> dict:
    command = [sys.executable, "-m", "benchmarks", "kernel_compile", "--child", step, "--cells", str(args.cells)]
    command += ["--processes", str(args.processes), "--out", str(args.out)]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=child_environment(caches))
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"step {step} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1]) | {"process_s": round(wall, 2)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=4000)
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("kernel_compile_bench"))
    parser.add_argument("--child", choices=["cold", "warm", "ahead"], help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args)
        return
    root = Path(tempfile.mkdtemp(prefix="kernel-caches-"))
    first, second = kernel_caches(root / "first"), kernel_caches(root / "second")
    rows = [run_step("cold", args, first), run_step("warm", args, first), run_step("ahead", args, second)]
    import cupy

    print("cupy", cupy.__version__)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    table.to_csv(args.out / "kernel_compile_bench.tsv", sep="\t", index=False)
