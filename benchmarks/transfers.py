"""A count matrix's copies between host and GPU memory: CuPy's own against omicsprep's staged copies.

    python -m benchmarks transfers --nnz 800000000 [--threads 1 2 4 8]

A CSR matrix of ``--nnz`` float32 values with int32 indices (about 1M cells of the
benchmark's generated data at 800M) goes to the GPU and back: with CuPy's conversions
(``cupyx.scipy.sparse.csr_matrix(host)``, ``.get()``: what rapids-singlecell's
``anndata_to_GPU`` and a plain ``get`` do), then with ``omicsprep.backend``'s
``host_to_device``/``device_to_host`` in each number of ``--threads``. Each is checked
equal to the original and timed twice; the table gives the faster of the two.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from scipy import sparse

PARTS = ("data", "indices", "indptr")


def synthetic_csr(nnz: int, *, n_genes: int, per_cell: int) -> sparse.csr_matrix:
    n_cells = nnz // per_cell
    data = np.random.default_rng(0).random(n_cells * per_cell, dtype=np.float32)
    indices = np.tile(np.arange(0, n_genes, n_genes // per_cell, dtype=np.int32)[:per_cell], n_cells)
    indptr = np.arange(0, n_cells * per_cell + 1, per_cell, dtype=np.int32)
    return sparse.csr_matrix((data, indices, indptr), shape=(n_cells, n_genes))


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nnz", type=int, default=800_000_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--per-cell", type=int, default=800)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])


def run(args: argparse.Namespace) -> None:

    from omicsprep import backend

    cp = backend.cupy()
    cpx = backend.cupyx_sparse()
    host = synthetic_csr(args.nnz, n_genes=args.genes, per_cell=args.per_cell)
    gigabytes = (host.data.nbytes + host.indices.nbytes + host.indptr.nbytes) / 1e9
    print(f"{host.shape[0]} x {host.shape[1]} CSR, {host.nnz} non-zeros, {gigabytes:.2f} GB")

    def cupy_to_device(matrix):
        device = cpx.csr_matrix(matrix)
        cp.cuda.Device().synchronize()
        return device

    def staged_to_device(threads):
        def copy(matrix):
            parts = (backend.host_to_device(getattr(matrix, part), threads=threads) for part in PARTS)
            return cpx.csr_matrix(tuple(parts), shape=matrix.shape)

        return copy

    def staged_to_host(threads):
        def copy(matrix):
            parts = (backend.device_to_host(getattr(matrix, part), threads=threads) for part in PARTS)
            return sparse.csr_matrix(tuple(parts), shape=matrix.shape)

        return copy

    methods = [("cupy", cupy_to_device, lambda matrix: matrix.get())]
    methods += [(f"staged, {n} threads", staged_to_device(n), staged_to_host(n)) for n in args.threads]
    rows = []
    for name, to_device, to_host in methods:
        seconds = {"to_device": [], "to_host": []}
        for _ in range(2):
            device, elapsed = timed(to_device, host)
            seconds["to_device"].append(elapsed)
            back, elapsed = timed(to_host, device)
            seconds["to_host"].append(elapsed)
            assert all(np.array_equal(getattr(back, part), getattr(host, part)) for part in PARTS)
            del device, back
        best = {direction: min(values) for direction, values in seconds.items()}
        rows.append(
            {
                "method": name,
                "to_device_s": best["to_device"],
                "to_device_GB_s": gigabytes / best["to_device"],
                "to_host_s": best["to_host"],
                "to_host_GB_s": gigabytes / best["to_host"],
            }
        )
        print(rows[-1], flush=True)
    print(pd.DataFrame(rows).round(2).to_markdown(index=False))
