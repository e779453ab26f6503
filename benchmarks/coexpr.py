"""Gene co-expression speed and memory, CPU against GPU.

    python -m benchmarks coexpr --sizes 5000x100000 20000x50000 --backends cpu gpu

Per size (genes x cells) it generates counts with planted modules (generate.py), then, in a
fresh process per backend, log-normalizes them and times the chain correlation + graph +
modules (the target's chain) and, apart, the eigengenes, twice: the first call in the
process (libraries, kernels, memory pools; ``first_chain_s``) and the second, warm one
(the step columns); it records the process's peak
host memory, on the CPU the correlation step's peak allocation (tracemalloc, which NumPy
reports to), on the GPU RMM's peak allocation, and the size of the dense cells x genes
matrix for scale. The
planted modules' recovery (adjusted Rand index) is checked. The table, with machine and
date, is appended to ``--results``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import tracemalloc
from pathlib import Path

import pandas as pd

from benchmarks.common import RESULTS, append_results, device_statistics, measure_in_child
from omicsprep.testing.generate import generate_coexpression


def measure(n_genes: int, n_cells: int, backend: str, top_k: int) -> dict:
    """One backend on one size, in this process."""
    import anndata as ad
    from scipy import sparse
    from sklearn.metrics import adjusted_rand_score

    from omicsprep.backend import array_module, resolve_backend, synchronize
    from omicsprep.network import coexpression
    from omicsprep.rna.preprocessing import normalize

    resolve_backend(backend)
    statistics = device_statistics() if backend == "gpu" else None
    counts, planted = generate_coexpression(n_cells, n_genes, n_modules=20, module_size=50, seed=0)
    adata = ad.AnnData(counts)
    adata.var_names = [f"g{i}" for i in range(n_genes)]
    normalize(adata, target_sum=1e4, backend="cpu")
    genes = coexpression.check_expression(
        adata, genes=adata.var_names, top_k=top_k, min_cells=50, min_expressing_cells=20
    )
    expression = sparse.csr_matrix(adata[:, genes].X)

    def chain(*, trace_memory: bool) -> tuple[dict, pd.DataFrame]:
        """The correlation + graph + modules chain, then the eigengenes: seconds per step."""
        if trace_memory and backend == "cpu":  # NumPy reports its allocations to tracemalloc
            tracemalloc.start()
        start = time.perf_counter()
        standardized = coexpression.standardize(expression, method="pearson", backend=backend)
        synchronize(backend=backend)
        on_device = time.perf_counter()
        graph = coexpression.correlation_graph(standardized, top_k=top_k, min_correlation=0.1, power=1, backend=backend)
        synchronize(backend=backend)
        correlated = time.perf_counter()
        del standardized
        seconds = {"correlation_peak": tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else None}
        tracemalloc.stop()
        modules = coexpression.find_modules(
            graph, genes=genes, algorithm="leiden", resolution=1.0, min_module_size=10, seed=0, backend=backend
        )
        clustered = time.perf_counter()
        coexpression.module_eigengenes(adata, modules=modules, backend=backend)
        synchronize(backend=backend)
        seconds.update(
            standardize=on_device - start,
            correlation_graph=correlated - on_device,
            modules=clustered - correlated,
            chain=clustered - start,
            eigengenes=time.perf_counter() - clustered,
        )
        return seconds, modules

    # The first call in a process also loads libraries, compiles kernels and grows memory
    # pools; the table's steps are those of the second, warm call (both recorded).
    first, _ = chain(trace_memory=False)
    seconds, modules = chain(trace_memory=True)
    correlation_peak = seconds["correlation_peak"]
    found = modules.set_index("gene")["module"].astype(str).reindex(adata.var_names, fill_value="left out")
    row = {
        "genes": n_genes,
        "cells": n_cells,
        "backend": backend,
        "genes_used": len(genes),
        "first_chain_s": round(first["chain"], 2),
        **{
            f"{step}_s": round(seconds[step], 2)
            for step in ("standardize", "correlation_graph", "modules", "chain", "eigengenes")
        },
        "modules": int(
            (modules["module"] != coexpression.UNASSIGNED).groupby(modules["module"], observed=True).any().sum()
        ),
        "planted_ari": round(adjusted_rand_score(planted[planted >= 0], found.to_numpy()[planted >= 0]), 3),
        "peak_host_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    if correlation_peak is not None:
        row["correlation_peak_gb"] = round(correlation_peak / 2**30, 2)
    row["dense_matrix_gb"] = round(n_cells * len(genes) * 4 / 2**30, 2)
    row["sparse_input_gb"] = round(
        sum(a.nbytes for a in (expression.data, expression.indices, expression.indptr)) / 2**30, 2
    )
    if backend == "gpu":  # the floor of standardize: the sparse input crossing to the device
        xp = array_module(backend)
        start = time.perf_counter()
        on_gpu = [xp.asarray(a) for a in (expression.data, expression.indices, expression.indptr)]
        synchronize(backend=backend)
        row["to_device_s"] = round(time.perf_counter() - start, 3)
        del on_gpu
    if statistics is not None:
        row["peak_gpu_gb"] = round(statistics.get_statistics().peak_bytes / 2**30, 2)
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", nargs="+", default=["5000x100000", "20000x50000"], help="GENESxCELLS")
    parser.add_argument("--backends", nargs="+", choices=["cpu", "gpu"], default=["cpu"])
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--one", nargs=3, metavar=("GENES", "CELLS", "BACKEND"), help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.one:
        print(json.dumps(measure(int(args.one[0]), int(args.one[1]), args.one[2], args.top_k)))
        return
    rows = []
    for size in args.sizes:
        n_genes, n_cells = (int(x) for x in size.split("x"))
        for backend in args.backends:
            row = measure_in_child("coexpr", "--one", str(n_genes), str(n_cells), backend, "--top-k", str(args.top_k))
            rows += [row] if row else []
        if {"cpu", "gpu"} <= {r["backend"] for r in rows if (r["genes"], r["cells"]) == (n_genes, n_cells)}:
            chains = {r["backend"]: r["chain_s"] for r in rows if (r["genes"], r["cells"]) == (n_genes, n_cells)}
            rows[-1]["gpu_speedup_chain"] = round(chains["cpu"] / max(chains["gpu"], 1e-3), 1)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    append_results(
        args.results,
        title="Co-expression",
        table=table,
        note=f"Planted data: 20 modules of 50 genes, top_k={args.top_k}, Pearson, no metacells, Leiden 1.0; "
        "step seconds of a second, warm call (first_chain_s: the first); chain = correlation + graph + "
        "modules.",
    )
