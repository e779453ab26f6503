"""A pool worker's first calls: the steps that take longer the first time in a process, and why.

    python -m benchmarks first_calls [--cells 10000] [--backend gpu] [--out DIR]

In a fresh process set up as a pool worker is (the server's imports, then the GPU libraries
it imports while idle), each step below runs three times on one generated sample: the first
call under cProfile (its slowest entries printed), then twice more. On the demo, the
co-expression rule's `metacells` step took 3-4.4 s in a worker's first co-expression job and
0.16 s in its next, and Leiden 3.6-4.8 s against 0.7-2 s: this says which part of a first call
is a once-per-process cost (imports, a Numba cache load, a library's first launch), which a
worker could pay while idle. Prints a table and writes it (``first_calls.tsv``) under ``--out``.

Its first run (H100, fresh machine, 2026-12-07) found the metacells' 8.3 s first call 7.1 s of
Numba compiling fast-array-utils' kernels (scanpy 1.12's normalization), which no process found
in the cache (:func:`omicsprep.jit_cache.name_sparse_matrix_types`), and Leiden's 2.2 s first
call 1.5 s of CuPy compiling ``triu``'s kernels (cached on disk: a fresh machine's only).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd


def _profiled(call: Callable[[], object], *, top: int) -> tuple[float, str]:
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    call()
    profile.disable()
    seconds = time.perf_counter() - start
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(top)
    return seconds, text.getvalue()


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _steps(adata, *, backend: str) -> dict[str, Callable[[], object]]:
    from omicsprep.network import coexpression
    from omicsprep.rna.clustering import partition_graph

    graph = adata.obsp["connectivities"]
    if backend == "gpu":
        from omicsprep.backend import cupyx_sparse

        graph = cupyx_sparse().csr_matrix(graph)
    return {
        "metacells, knn": lambda: coexpression.pool_metacells(
            adata, method="knn", n_metacells=500, seed=0, backend=backend
        ),
        "metacells, kmeans": lambda: coexpression.pool_metacells(
            adata, method="kmeans", n_metacells=500, seed=0, backend=backend
        ),
        "leiden": lambda: partition_graph(graph, algorithm="leiden", resolution=1.0, seed=0, backend=backend),
        "louvain": lambda: partition_graph(graph, algorithm="louvain", resolution=1.0, seed=0, backend=backend),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=10000)
    parser.add_argument("--genes", type=int, default=2000)
    parser.add_argument("--backend", choices=["cpu", "gpu"], default="gpu")
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--out", type=Path, default=Path("first_calls"))


def run(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    from omicsprep.pool import worker

    imported = worker.preload()
    idle = 0.0
    if args.backend == "gpu":
        from omicsprep import backend

        backend.cupy().cuda.runtime.free(0)
        idle_start = time.perf_counter()
        for name in worker.libraries_to_import():
            importlib.import_module(name)
        idle = time.perf_counter() - idle_start
    print(f"worker set-up: server imports {imported:.2f} s, libraries imported while idle {idle:.2f} s")

    import scanpy as sc

    from omicsprep.warmup import generated_counts

    adata = generated_counts(n_cells=args.cells, n_genes=args.genes)
    sc.pp.pca(adata, n_comps=20)
    sc.pp.neighbors(adata, n_neighbors=15, transformer="sklearn")
    print(f"sample ready after {time.perf_counter() - start:.2f} s")
    rows = []
    for name, call in _steps(adata, backend=args.backend).items():
        first, profile = _profiled(call, top=args.top)
        second, third = _timed(call), _timed(call)
        rows.append({"step": name, "first_s": first, "second_s": second, "third_s": third})
        print(f"== {name}: first {first:.3f} s (profiled), then {second:.3f} s, {third:.3f} s")
        print("\n".join(line for line in profile.splitlines() if line.strip())[:4000])
    table = pd.DataFrame(rows).round(3)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "first_calls.tsv", sep="\t", index=False)
    print(table.to_markdown(index=False))
