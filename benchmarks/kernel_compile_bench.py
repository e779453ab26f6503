"""Where a fresh machine's first GPU run spends its compile time, and what compiling ahead in threads saves.

    python benchmarks/kernel_compile_bench.py [--cells 4000] [--threads 16] [--out DIR]

Each step is a fresh process running :func:`omicsprep.warmup.warm_kernels` (rule qc_cluster's
steps on a generated sample), with CuPy's, Numba's and the CUDA driver's caches in folders of
its own:

1. ``cold``: from empty caches, recording every kernel CuPy is asked for (``kernels.json``):
   its seconds, and whether NVRTC compiled it.
2. ``warm``: again on those caches: the floor.
3. ``ahead``: from empty caches, the recorded kernels compiled first in ``--threads`` threads,
   then the steps (what a manifest of kernels shipped with omicsprep would give).

Prints a table and writes it (``kernel_compile_bench.tsv``) under ``--out``.
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

CACHES = ("CUPY_CACHE_DIR", "NUMBA_CACHE_DIR", "CUDA_CACHE_PATH")


def record_compiles(records: list[dict]) -> None:
    """Wrap CuPy's compiler so that each kernel request lands in ``records``."""
    from cupy.cuda import compiler

    # CuPy offers no hook on its compiles: its module functions are wrapped (CuPy 13-14).
    with_cache, nvrtc = compiler._compile_module_with_cache, compiler._compile_using_nvrtc_no_warning  # noqa: SLF001
    compiled: list[float] = []

    def timed_nvrtc(*args, **kwargs):
        start = time.perf_counter()
        try:
            return nvrtc(*args, **kwargs)
        finally:
            compiled.append(time.perf_counter() - start)

    def recorded(source, options=(), arch=None, cache_dir=None, extra_source=None, backend="nvrtc", **kwargs):
        before, start = len(compiled), time.perf_counter()
        try:
            return with_cache(source, options, arch, cache_dir, extra_source, backend, **kwargs)
        finally:
            records.append(
                {
                    "source": source,
                    "options": list(options),
                    "arch": arch,
                    "extra_source": extra_source,
                    "backend": backend,
                    "kwargs": {key: value for key, value in kwargs.items() if key != "log_stream"},
                    "seconds": time.perf_counter() - start,
                    "nvrtc_seconds": sum(compiled[before:]),
                    "compiled": len(compiled) > before,
                }
            )

    compiler._compile_module_with_cache = recorded  # noqa: SLF001
    compiler._compile_using_nvrtc_no_warning = timed_nvrtc  # noqa: SLF001


def compile_ahead(kernels: list[dict], *, threads: int) -> float:
    """Compile ``kernels`` into CuPy's cache in ``threads`` threads; seconds."""
    from concurrent.futures import ThreadPoolExecutor

    import cupy as cp
    from cupy.cuda import compiler

    def bind() -> None:
        cp.cuda.Device(0).use()
        cp.cuda.runtime.free(0)

    def compile_one(kernel: dict) -> None:
        kwargs = dict(kernel["kwargs"])
        if kwargs.get("name_expressions") is not None:
            kwargs["name_expressions"] = tuple(kwargs["name_expressions"])
        positional = (kernel["source"], tuple(kernel["options"]), kernel["arch"], None, kernel["extra_source"])
        compiler._compile_module_with_cache(*positional, kernel["backend"], **kwargs)  # noqa: SLF001

    start = time.perf_counter()
    with ThreadPoolExecutor(threads, initializer=bind) as pool:
        list(pool.map(compile_one, kernels))
    return time.perf_counter() - start


def child(args: argparse.Namespace) -> None:
    """One step in this process: compile ahead (``ahead``), then warm_kernels, recording."""
    start = time.perf_counter()
    from omicsprep.cli import workflow_config
    from omicsprep.warmup import warm_kernels

    imported = time.perf_counter() - start
    records: list[dict] = []
    ahead = 0.0
    if args.child == "ahead":
        kernels = json.loads((args.out / "kernels.json").read_text())
        timing = {"seconds": 0, "nvrtc_seconds": 0, "compiled": 0}
        keys = [json.dumps(kernel | timing, sort_keys=True) for kernel in kernels]
        unique = list(dict(zip(keys, kernels, strict=True)).values())
        ahead = compile_ahead(unique, threads=args.threads)
    record_compiles(records)
    steps_start = time.perf_counter()
    warm_kernels(workflow_config([]), backend="gpu", n_cells=args.cells)
    steps = time.perf_counter() - steps_start
    if args.child == "cold":
        (args.out / "kernels.json").write_text(json.dumps(records))
    row = {
        "step": args.child,
        "imports_s": round(imported, 2),
        "ahead_s": round(ahead, 2),
        "steps_s": round(steps, 2),
        "requests": len(records),
        "compiled": sum(record["compiled"] for record in records),
        "nvrtc_s": round(sum(record["nvrtc_seconds"] for record in records), 2),
        "name_expressions": sum(record["kwargs"].get("name_expressions") is not None for record in records),
    }
    print(json.dumps(row))


def run_step(step: str, args: argparse.Namespace, caches: dict[str, str]) -> dict:
    command = [sys.executable, __file__, "--child", step, "--cells", str(args.cells), "--threads", str(args.threads)]
    command += ["--out", str(args.out)]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False, env={**os.environ, **caches})
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"step {step} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1]) | {"process_s": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("kernel_compile_bench"))
    parser.add_argument("--child", choices=["cold", "warm", "ahead"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args)
        return
    root = Path(tempfile.mkdtemp(prefix="kernel-caches-"))
    first = {name: str(root / "first" / name) for name in CACHES}
    second = {name: str(root / "second" / name) for name in CACHES}
    rows = [run_step("cold", args, first), run_step("warm", args, first), run_step("ahead", args, second)]
    kernels = json.loads((args.out / "kernels.json").read_text())
    slowest = sorted(kernels, key=lambda kernel: -kernel["nvrtc_seconds"])[:15]
    for kernel in slowest:
        print(f"{kernel['nvrtc_seconds']:.2f} s  {len(kernel['source'])} chars  {kernel['source'][-300:]!r}")
    options = sorted({" ".join(kernel["options"]) for kernel in kernels})
    print("option sets:", *options, sep="\n  ")
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    table.to_csv(args.out / "kernel_compile_bench.tsv", sep="\t", index=False)


if __name__ == "__main__":
    main()
