"""PCA of a matrix in row blocks, the way omicsprep takes it against rapids-singlecell's Dask PCA, on the GPU.

    python -m benchmarks blocked_pca --cells 1000000 --entries-per-cell 800 --results RESULTS.md

A matrix of more than 2^31 - 1 entries goes to the GPU in row blocks
(:func:`omicsprep.backend.to_device`). Its PCA was rapids-singlecell's Dask PCA, which selects
the highly variable genes lazily, once for the covariance and again for the projection:
19.0 s at 3,000,000 cells against 0.23 s for one matrix at 1,000,000. omicsprep now takes the
genes once and joins them into one matrix where they fit (``preprocessing._pca_of_row_blocks``).

Here a log-normalized matrix is made on the GPU (cells in ``--clusters`` groups, each with its
own gene means, so that the leading components are well separated) and cut into blocks of at
most ``--block-entries``; the timings of both ways, and of one matrix, are reported with the
smallest absolute correlation of each way's leading components with one matrix's. Each way
runs twice: the first run compiles kernels.
"""

from __future__ import annotations

import argparse
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from anndata import AnnData

from benchmarks.common import append_results
from omicsprep import backend
from omicsprep.rna import preprocessing


def generated(n_cells: int, n_genes: int, per_cell: int, n_clusters: int, seed: int) -> tuple[Any, np.ndarray]:
    """A canonical CuPy CSR matrix of log1p counts, and a mask of the genes with the largest means."""
    cp, sparse = backend.cupy(), backend.cupyx_sparse()
    rng = cp.random.RandomState(seed)
    means = cp.exp(rng.normal(0.0, 1.0, size=n_genes))
    effects = cp.exp(rng.normal(0.0, 0.7, size=(n_clusters, n_genes)))
    cluster = rng.randint(0, n_clusters, size=n_cells)
    rows = cp.repeat(cp.arange(n_cells, dtype=cp.int64), per_cell)
    # Genes drawn by their means: each cell's entries fall mostly on the expressed genes.
    cumulative = cp.cumsum(means / means.sum())
    genes = cp.minimum(cp.searchsorted(cumulative, rng.random_sample(rows.size)), n_genes - 1)
    keys = cp.unique(rows * n_genes + genes)  # one entry per (cell, gene), sorted
    rows, genes = keys // n_genes, (keys % n_genes).astype(cp.int32)
    del keys
    counts = 1 + cp.floor(2 * means[genes] * effects[cluster[rows], genes] * rng.random_sample(rows.size))
    indptr = cp.concatenate([cp.zeros(1, cp.int64), cp.cumsum(cp.bincount(rows, minlength=n_cells))])
    matrix = sparse.csr_matrix(
        (cp.log1p(counts).astype(cp.float32), genes, indptr.astype(cp.int32)), shape=(n_cells, n_genes)
    )
    variable = np.zeros(n_genes, dtype=bool)
    variable[np.argsort(-backend.asnumpy(means))[:2000]] = True
    return matrix, variable


def timed(run, adata: AnnData) -> tuple[float, np.ndarray]:
    backend.synchronize(backend="gpu")
    start = time.perf_counter()
    run(adata)
    backend.synchronize(backend="gpu")
    return time.perf_counter() - start, backend.asnumpy(adata.obsm["X_pca"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=1_000_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--entries-per-cell", type=int, default=800)
    parser.add_argument("--clusters", type=int, default=12)
    parser.add_argument("--block-entries", type=int, default=1 << 26)
    parser.add_argument("--n-comps", type=int, default=50)
    parser.add_argument("--results", type=Path)


def run(args: argparse.Namespace) -> None:

    backend.prepare_gpu(backend.resolve_backend("gpu"))
    start = time.perf_counter()
    matrix, variable = generated(args.cells, args.genes, args.entries_per_cell, args.clusters, seed=0)
    bounds = backend.row_block_bounds(backend.asnumpy(matrix.indptr), max_entries=args.block_entries)
    blocks = backend.row_blocks([matrix[a:b] for a, b in pairwise(bounds)])
    print(
        f"{matrix.shape[0]:,} x {matrix.shape[1]:,}, {matrix.nnz:,} entries in {len(bounds) - 1} blocks "
        f"(made in {time.perf_counter() - start:.1f} s)",
        flush=True,
    )

    def rapids_dask(adata: AnnData) -> None:  # the way before: rapids-singlecell's Dask PCA
        backend.rapids_singlecell().pp.pca(adata, n_comps=args.n_comps, mask_var="highly_variable", rng=0)
        adata.obsm["X_pca"] = backend.gather(adata.obsm["X_pca"])

    def omicsprep_blocks(adata: AnnData) -> None:
        preprocessing.pca(adata, n_comps=args.n_comps, seed=0, backend="gpu")

    var = pd.DataFrame({"highly_variable": variable}, index=[f"g{i}" for i in range(args.genes)])
    ways = {
        "one matrix (omicsprep = rapids-singlecell)": (omicsprep_blocks, matrix),
        "row blocks, rapids-singlecell's Dask PCA (before)": (rapids_dask, blocks),
        "row blocks, genes taken once and joined (now)": (omicsprep_blocks, blocks),
    }
    rows, reference = [], None
    for name, (run, X) in ways.items():
        seconds = []
        for _ in range(2):
            adata = AnnData(X=X, var=var.copy())
            adata.obs_names = [f"c{i}" for i in range(args.cells)]
            elapsed, embedding = timed(run, adata)
            seconds.append(elapsed)
        reference = embedding if reference is None else reference
        leading = min(
            abs(np.corrcoef(embedding[:, k], reference[:, k])[0, 1]) for k in range(min(10, embedding.shape[1]))
        )
        rows.append({"way": name, "first s": seconds[0], "second s": seconds[1], "min |r| of 10 PCs vs one": leading})
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows).round(3)
    print(table.to_markdown(index=False))
    if args.results:
        title = f"Blocked PCA, {args.cells:,} cells x {args.genes:,} genes"
        note = f"{matrix.nnz:,} entries in {len(bounds) - 1} row blocks of at most {args.block_entries:,}; 2,000 genes."
        append_results(args.results, title=title, note=note, table=table)
