"""Realistic synthetic single-cell counts for benchmarks, deterministic from a seed.

    python -m omicsprep.testing.generate --cells 100000 --out data/100k.h5 [--genes 20000] [--h5ad]

Model: 12 clusters of 3 sub-clusters, each with its own gene profile over a heavy-tailed
baseline (3% of genes differential per cluster, 0.5% per sub-cluster); gamma-distributed
library sizes (mean 1,500 UMIs), so within a profile each gene's counts are negative
binomial (Poisson with gamma-distributed rates); 13 mitochondrial genes (``MT-``) at 1-5%
of counts, 8% damaged cells with 20-60%; highly expressed ribosomal genes (``RPL``/``RPS``)
and hemoglobin genes; 4% heterotypic doublets (two profiles, summed library). Cells are
drawn in chunks, each from its own seed, and written as a 10x HDF5 file (the format Cell
Ranger writes; optionally also ``.h5ad``): about 2-5% of entries are non-zero.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import h5py
import numpy as np
from scipy import sparse

from omicsprep.testing.droplets import droplet_reads, generate_raw_droplets
from omicsprep.testing.genes import N_MITO, N_RIBO, gene_names
from omicsprep.testing.reads import write_bam

N_CLUSTERS = 12
SUBCLUSTERS = 3
CHUNK = 20_000


def profiles(n_genes: int, rng: np.random.Generator) -> np.ndarray:
    """Cumulative gene probabilities (mitochondrial genes excluded) per sub-cluster."""
    base = rng.lognormal(mean=0.0, sigma=2.0, size=n_genes)
    base[N_MITO : N_MITO + N_RIBO] *= 40
    base[:N_MITO] = 0.0  # the mitochondrial share is drawn per cell
    rows = []
    for _ in range(N_CLUSTERS):
        lfc = np.zeros(n_genes)
        de = rng.choice(np.arange(N_MITO, n_genes), size=int(0.03 * n_genes), replace=False)
        lfc[de] = rng.normal(0, 2.0, size=de.size)
        for _ in range(SUBCLUSTERS):
            sub = lfc.copy()
            shifted = rng.choice(np.arange(N_MITO, n_genes), size=int(0.005 * n_genes), replace=False)
            sub[shifted] += rng.normal(0, 1.0, size=shifted.size)
            weights = base * np.exp(sub)
            rows.append(np.cumsum(weights / weights.sum()))
    return np.asarray(rows)


def chunk_counts(
    n_cells: int, n_genes: int, cdfs: np.ndarray, rng: np.random.Generator
) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Counts of ``n_cells`` cells as CSR, and each cell's cluster (a doublet's first).

    Every cell's UMIs are drawn from its profile(s).
    """
    n_profiles = len(cdfs)
    sizes = np.maximum(rng.gamma(shape=2.0, scale=750.0, size=n_cells).astype(np.int64), 50)
    damaged = rng.random(n_cells) < 0.08
    mito_share = np.where(damaged, rng.uniform(0.2, 0.6, n_cells), rng.uniform(0.01, 0.05, n_cells))
    n_mito = rng.binomial(sizes, mito_share)
    # Each cell is one part, a doublet two parts with different profiles.
    first = rng.integers(n_profiles, size=n_cells)
    doublet = rng.random(n_cells) < 0.04
    second = (first + SUBCLUSTERS * rng.integers(1, N_CLUSTERS, size=n_cells)) % n_profiles
    part_cell = np.concatenate([np.arange(n_cells), np.flatnonzero(doublet)])
    part_profile = np.concatenate([first, second[doublet]])
    part_size = np.concatenate([sizes - n_mito, (sizes - n_mito)[doublet]])
    rows, cols = [np.repeat(np.arange(n_cells), n_mito)], [rng.integers(N_MITO, size=int(n_mito.sum()))]
    for profile in range(n_profiles):
        parts = part_profile == profile
        cells = np.repeat(part_cell[parts], part_size[parts])
        rows.append(cells)
        cols.append(np.minimum(np.searchsorted(cdfs[profile], rng.random(cells.size)), n_genes - 1))
    row, col = np.concatenate(rows), np.concatenate(cols)
    # Building from (row, col) pairs sums the duplicates: one entry per (cell, gene).
    counts = sparse.csr_matrix(
        (np.ones(row.size, dtype=np.float32), (row.astype(np.int32), col.astype(np.int32))), shape=(n_cells, n_genes)
    )
    return counts, first // SUBCLUSTERS


def _chunk(args: tuple[int, int, int, int, np.ndarray]) -> tuple[sparse.csr_matrix, np.ndarray]:
    seed, index, n_cells, n_genes, cdfs = args
    return chunk_counts(n_cells, n_genes, cdfs, np.random.default_rng([seed, index]))


def generate(n_cells: int, n_genes: int = 20_000, *, seed: int = 0, jobs: int = 1) -> sparse.csr_matrix:
    """Cells x genes raw counts (CSR, float32 holding integers); the same for any ``jobs``."""
    return generate_with_clusters(n_cells, n_genes, seed=seed, jobs=jobs)[0]


def generate_with_clusters(
    n_cells: int, n_genes: int = 20_000, *, seed: int = 0, jobs: int = 1
) -> tuple[sparse.csr_matrix, np.ndarray]:
    """:func:`generate`'s counts and each cell's cluster (0 to ``N_CLUSTERS - 1``)."""
    cdfs = profiles(n_genes, np.random.default_rng(seed))
    tasks = [
        (seed, index, min(CHUNK, n_cells - start), n_genes, cdfs)
        for index, start in enumerate(range(0, n_cells, CHUNK))
    ]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            chunks = list(pool.map(_chunk, tasks))
    else:
        chunks = [_chunk(task) for task in tasks]
    return sparse.vstack([counts for counts, _ in chunks], format="csr"), np.concatenate([c for _, c in chunks])


def write_10x_h5(
    counts: sparse.csr_matrix,
    path: Path,
    *,
    barcodes: list[str] | None = None,
    compression: str | None = None,
    antibodies: tuple[str, ...] = (),
) -> None:
    """Write counts in Cell Ranger's HDF5 layout (genes x cells, CSC by cell).

    Barcodes are ``CELL00000000-1``... unless given; ``compression`` (``"gzip"``, as Cell Ranger
    writes) applies to the matrix's arrays. The last ``len(antibodies)`` columns of ``counts``
    are antibody tags (``Antibody Capture``) with these names, as in a CITE-seq run's matrix.
    """
    names = [*gene_names(counts.shape[1] - len(antibodies)), *antibodies]
    types = ["Gene Expression"] * (len(names) - len(antibodies)) + ["Antibody Capture"] * len(antibodies)
    barcodes = barcodes if barcodes is not None else [f"CELL{i:08d}-1" for i in range(counts.shape[0])]
    from omicsprep.io import atomic_path

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as handle:
        matrix = handle.create_group("matrix")
        matrix["barcodes"] = np.array(barcodes, dtype="S")
        matrix.create_dataset("data", data=counts.data.astype(np.int32), compression=compression)
        matrix.create_dataset("indices", data=counts.indices.astype(np.int64), compression=compression)
        matrix.create_dataset("indptr", data=counts.indptr.astype(np.int64), compression=compression)
        matrix["shape"] = np.array([counts.shape[1], counts.shape[0]], dtype=np.int32)
        features = matrix.create_group("features")
        features["id"] = np.array([f"ENSG{i:011d}" for i in range(len(names))], dtype="S")
        features["name"] = np.array(names, dtype="S")
        features["feature_type"] = np.array(types, dtype="S")
        features["genome"] = np.array(["synthetic"] * len(names), dtype="S")
        features["_all_tag_keys"] = np.array([b"genome"])


def main() -> None:
    """Write generated counts as a 10x HDF5 file (``python -m omicsprep.testing.generate``)."""
    parser = argparse.ArgumentParser(description="Generate synthetic single-cell counts (10x HDF5).")
    parser.add_argument("--cells", type=int, required=True)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="processes (the output does not depend on it)")
    parser.add_argument("--out", type=Path, required=True, help="10x HDF5 file to write")
    parser.add_argument("--h5ad", action="store_true", help="also write OUT with suffix .h5ad")
    parser.add_argument(
        "--raw-barcodes",
        type=int,
        help="write a raw droplet matrix: the cells among this many barcodes (the rest empty droplets), "
        "with the truth per barcode in OUT with suffix .truth.parquet",
    )
    parser.add_argument("--bam", type=Path, help="with --raw-barcodes, also write the droplets' reads as this BAM")
    args = parser.parse_args()
    if args.raw_barcodes:
        droplets = generate_raw_droplets(args.cells, args.raw_barcodes, args.genes, seed=args.seed)
        write_10x_h5(droplets.counts, args.out, barcodes=droplets.barcodes)
        droplets.truth.to_parquet(args.out.with_suffix(".truth.parquet"))
        if args.bam:
            write_bam(droplet_reads(droplets, seed=args.seed), args.bam)
        print(f"{args.out}: {args.cells} cells among {args.raw_barcodes} barcodes x {args.genes} genes")
        return
    counts = generate(args.cells, args.genes, seed=args.seed, jobs=args.jobs)
    write_10x_h5(counts, args.out)
    if args.h5ad:
        from omicsprep.io import read_counts, write_h5ad

        write_h5ad(read_counts(args.out), args.out.with_suffix(".h5ad"))
    density = counts.nnz / (counts.shape[0] * counts.shape[1])
    print(f"{args.out}: {counts.shape[0]} cells x {counts.shape[1]} genes, {density:.2%} non-zero")


def generate_coexpression(
    n_cells: int, n_genes: int, *, n_modules: int = 5, module_size: int = 40, seed: int = 0
) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Counts with planted gene modules, for co-expression tests and benchmarks.

    The first ``n_modules * module_size`` genes form modules: a module's genes follow one
    log-normal activity per cell. The other genes are independent. Library sizes vary
    (log-normal); counts are Poisson; 2-10% of entries are non-zero.

    Returns
    -------
    Counts (cells x genes, CSR) and each gene's planted module (-1 for none).
    """
    rng = np.random.default_rng(seed)
    module = np.full(n_genes, -1)
    module[: n_modules * module_size] = np.repeat(np.arange(n_modules), module_size)
    base = np.where(module >= 0, rng.lognormal(-1.0, 0.5, n_genes), rng.lognormal(-4.5, 1.2, n_genes))
    chunks = []
    for start in range(0, n_cells, 10_000):
        size = min(10_000, n_cells - start)
        rate = np.outer(rng.lognormal(0, 0.3, size), base).astype(np.float32)
        activity = rng.lognormal(0, 1.0, (size, n_modules)).astype(np.float32)
        rate[:, module >= 0] *= activity[:, module[module >= 0]]
        chunks.append(sparse.csr_matrix(rng.poisson(rate).astype(np.float32)))
    return sparse.vstack(chunks, format="csr"), module


if __name__ == "__main__":
    main()
