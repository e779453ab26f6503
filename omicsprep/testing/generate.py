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
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
from scipy import sparse

N_MITO = 13
N_RIBO = 80
HEMOGLOBIN = ("HBB", "HBA1", "HBA2", "HBD")
N_CLUSTERS = 12
SUBCLUSTERS = 3
CHUNK = 20_000


def gene_names(n_genes: int) -> list[str]:
    """Mitochondrial, ribosomal and hemoglobin genes first, then ``GENE00000``..."""
    mito = [f"MT-G{i}" for i in range(N_MITO)]
    ribo = [f"RP{'L' if i % 2 else 'S'}{i}" for i in range(N_RIBO)]
    rest = [f"GENE{i:05d}" for i in range(n_genes - N_MITO - N_RIBO - len(HEMOGLOBIN))]
    return [*mito, *ribo, *HEMOGLOBIN, *rest]


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


def _molecules(n_reads: int, *, n_cells: int, n_genes: int, rng: np.random.Generator):
    """Gene and cell of each molecule (log-normal expression), and each read's molecule.

    Each molecule has a geometric number of reads (PCR duplicates).
    """
    n_molecules = max(1, n_reads // 4)
    expression = rng.lognormal(0, 1.5, n_genes)
    gene = rng.choice(n_genes, size=n_molecules, p=expression / expression.sum())
    cell = rng.integers(n_cells, size=n_molecules)
    molecule = np.repeat(np.arange(n_molecules), rng.geometric(0.25, size=n_molecules))[:n_reads]
    return gene, cell, molecule


def generate_read_codes(
    n_reads: int, *, n_cells: int = 10_000, n_genes: int = 20_000, umi_length: int = 12, seed: int = 0
) -> pd.DataFrame:
    """Reads as the UMI kernels take them: ``cell`` and ``gene`` codes, 2-bit packed ``umi``.

    The molecules of :func:`generate_reads`, already encoded (what usable reads of a
    BAM or molecule table become), for benchmarks of deduplication alone at 10^8 reads;
    about 6% of reads carry a one-base UMI error (0.5% a base).
    """
    rng = np.random.default_rng(seed)
    gene, cell, molecule = _molecules(n_reads, n_cells=n_cells, n_genes=n_genes, rng=rng)
    umi = rng.integers(4**umi_length, size=gene.size, dtype=np.uint64)[molecule]
    wrong = np.flatnonzero(rng.random(molecule.size) < 0.06)
    shift = (2 * rng.integers(umi_length, size=wrong.size)).astype(np.uint64)
    umi[wrong] ^= rng.integers(1, 4, size=wrong.size).astype(np.uint64) << shift  # another base there
    return pd.DataFrame({"cell": cell[molecule].astype(np.int32), "gene": gene[molecule].astype(np.int32), "umi": umi})


def generate_reads(
    n_reads: int,
    *,
    n_cells: int = 500,
    n_genes: int = 2000,
    umi_length: int = 10,
    n_rate: float = 0.001,
    multi_gene_rate: float = 0.01,
    secondary_rate: float = 0.02,
    seed: int = 0,
) -> pd.DataFrame:
    """Aligned reads of a droplet experiment: cell, UMI, gene and position per read.

    Genes have log-normal expression, molecules a geometric number of reads (PCR
    duplicates), 0.2% of UMI bases are sequencing errors and 0.1% are N; 5% of reads
    carry an ``Unassigned_*`` gene, 1% two genes (``A;B``), 2% are secondary alignments.
    """
    rng = np.random.default_rng(seed)
    bases = np.frombuffer(b"ACGT", dtype=np.uint8)
    gene, cell, molecule = _molecules(n_reads, n_cells=n_cells, n_genes=n_genes, rng=rng)
    umi = bases[rng.integers(4, size=(gene.size, umi_length))]
    read_umi = umi[molecule].copy()
    errors = rng.random(read_umi.shape) < 0.002
    read_umi[errors] = bases[rng.integers(4, size=int(errors.sum()))]
    read_umi[rng.random(read_umi.shape) < n_rate] = ord("N")
    genes = np.array([f"G{g:05d}" for g in range(n_genes)], dtype=object)[gene[molecule]]
    fate = rng.random(len(molecule))
    genes[fate < 0.05] = "Unassigned_NoFeatures"
    genes[(fate >= 0.05) & (fate < 0.05 + multi_gene_rate)] = "G00000;G00001"
    barcodes = np.array(["".join(map(chr, bases[rng.integers(4, size=16)])) + "-1" for _ in range(n_cells)])
    return (
        pd.DataFrame(
            {
                "position": gene[molecule] * 5000 + rng.integers(0, 4000, size=len(molecule)),
                "cell": barcodes[cell[molecule]],
                "umi": read_umi.view(f"S{umi_length}").ravel().astype(str),
                "gene": genes,
                "secondary": rng.random(len(molecule)) < secondary_rate,
            }
        )
        .sort_values("position", kind="stable")
        .reset_index(drop=True)
    )


def write_bam(reads: pd.DataFrame, path: Path, *, unsorted: bool = False) -> None:
    """Write reads (from :func:`generate_reads`) as a BAM with Cell Ranger's tags (``CB``, ``UB``, ``GX``).

    Coordinate-sorted and indexed; or, ``unsorted``, in the given order and without an index.
    """
    import pysam

    from omicsprep.io import atomic_path

    header = {
        "HD": {"VN": "1.6", "SO": "unsorted" if unsorted else "coordinate"},
        "SQ": [{"SN": "chr1", "LN": int(reads["position"].max()) + 1000}],
    }
    with atomic_path(path) as tmp, pysam.AlignmentFile(str(tmp), "wb", header=header) as bam:
        read = pysam.AlignedSegment(bam.header)
        read.query_sequence = "A" * 50
        read.reference_id = 0
        read.mapping_quality = 60
        read.cigarstring = "50M"
        for i, row in enumerate(reads.itertuples(index=False)):
            read.query_name = f"r{i}"
            read.flag = 0x100 if row.secondary else 0
            read.reference_start = int(row.position)
            read.set_tags([("CB", row.cell), ("UB", row.umi), ("GX", row.gene)])
            bam.write(read)
    if not unsorted:
        pysam.index(str(path))


def umi_tools_count_command(umi_tools: str, bam: Path, out: Path, *, method: str) -> list[str]:
    """The ``umi_tools count`` command per cell and gene of a BAM tagged as :func:`write_bam` tags it."""
    tags = ["--gene-tag=GX", "--extract-umi-method=tag", "--umi-tag=UB", "--cell-tag=CB"]
    return [umi_tools, "count", "--per-gene", "--per-cell", *tags, f"--method={method}", "-I", str(bam), "-S", str(out)]


@dataclass(frozen=True)
class RawDroplets:
    """Every barcode of a droplet run, with the truth behind its counts.

    ``counts`` is barcodes x genes (CSR, float32 holding integers); ``truth`` has, per
    barcode, ``is_cell``, ``cell_type`` (-1 for an empty droplet), ``ambient_fraction`` (the
    planted share of a cell's UMIs drawn from the ambient profile; NaN for empty droplets)
    and ``total``; ``markers[t]`` are the genes expressed only by type ``t``.
    """

    counts: sparse.csr_matrix
    barcodes: list[str]
    truth: pd.DataFrame
    markers: list[np.ndarray]
    ambient: np.ndarray


def _draw_droplets(
    totals: np.ndarray, profile_of: np.ndarray, cdfs: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(droplet, gene) of every UMI: ``totals[i]`` UMIs from the profile ``cdfs[profile_of[i]]``."""
    rows, cols = [], []
    for profile in np.unique(profile_of):
        droplets = np.flatnonzero(profile_of == profile)
        row = np.repeat(droplets, totals[droplets])
        rows.append(row)
        cols.append(np.minimum(np.searchsorted(cdfs[profile], rng.random(row.size)), cdfs.shape[1] - 1))
    return np.concatenate(rows), np.concatenate(cols)


def generate_raw_droplets(
    n_cells: int = 10_000,
    n_barcodes: int = 500_000,
    n_genes: int = 33_000,
    *,
    n_types: int = 6,
    n_markers: int = 20,
    seed: int = 0,
) -> RawDroplets:
    """A raw droplet matrix: ``n_cells`` cells among ``n_barcodes`` barcodes.

    Cell types have a shared heavy-tailed baseline, differ by degree on 5% of the genes
    (log-normal fold changes, sigma 1.5) and have ``n_markers`` exclusive marker genes each
    (expressed by no other type); type frequencies are uneven (the largest about 8x
    the smallest). Cells have log-normal library sizes (median 3,000 UMIs, at least 300),
    of which a planted fraction, uniform in 5-20%, comes from the ambient profile; empty
    droplets hold ambient UMIs only, 1 + log-normal (median about 3, a long tail past 100),
    so the barcode-rank curve has the knee and plateau of real runs. The ambient profile is
    the cells' pooled expression. Barcodes are random 16-mers with ``-1``, in random order.
    """
    rng = np.random.default_rng(seed)
    base = rng.lognormal(mean=0.0, sigma=2.0, size=n_genes)
    base[:N_MITO] = base[N_MITO : 2 * N_MITO]  # mitochondrial genes, moderately expressed
    marker_genes = rng.choice(
        np.arange(N_MITO + N_RIBO + len(HEMOGLOBIN), n_genes), size=(n_types, n_markers), replace=False
    )
    base[marker_genes.ravel()] = 0.0
    weights = np.tile(base, (n_types, 1))
    # Types also differ by degree on 5% of the genes, as real cell types do on hundreds: a cell
    # of the commonest type is then unlike the pooled ambient profile beyond its markers.
    shared = np.setdiff1d(np.arange(N_MITO, n_genes), marker_genes.ravel())
    for type_index in range(n_types):
        varied = rng.choice(shared, size=int(0.10 * n_genes), replace=False)
        weights[type_index, varied] *= np.exp(rng.normal(0, 2.0, varied.size))
    for type_index, genes in enumerate(marker_genes):
        weights[type_index, genes] = np.median(base) * 200 * rng.lognormal(0, 0.5, n_markers)
    type_profiles = weights / weights.sum(axis=1, keepdims=True)
    frequency = np.geomspace(8, 1, n_types)
    frequency /= frequency.sum()
    cell_type = rng.choice(n_types, size=n_cells, p=frequency)
    library = np.maximum(rng.lognormal(np.log(3_000), 0.6, n_cells).astype(np.int64), 300)
    ambient_fraction = rng.uniform(0.05, 0.20, n_cells)
    n_ambient = rng.binomial(library, ambient_fraction)
    # The pooled expression of the cells: what lyses into the droplets' solution.
    ambient = np.bincount(cell_type, weights=library - n_ambient, minlength=n_types) @ type_profiles
    ambient /= ambient.sum()
    cdfs = np.cumsum(np.vstack([type_profiles, ambient]), axis=1)
    n_empty = n_barcodes - n_cells
    empty_totals = 1 + rng.lognormal(np.log(2.0), 1.3, n_empty).astype(np.int64)
    # Droplets 0..n_cells-1 are the cells' endogenous parts, then their ambient parts, then
    # the empty droplets (all from profile n_types, the ambient one).
    part_droplet = np.concatenate([np.arange(n_cells), np.arange(n_cells), n_cells + np.arange(n_empty)])
    part_total = np.concatenate([library - n_ambient, n_ambient, empty_totals])
    part_profile = np.concatenate([cell_type, np.full(n_cells + n_empty, n_types)])
    part, gene = _draw_droplets(part_total, part_profile, cdfs, rng)
    order = rng.permutation(n_barcodes)  # barcode position of each droplet
    counts = sparse.csr_matrix(
        (np.ones(part.size, dtype=np.float32), (order[part_droplet[part]], gene)), shape=(n_barcodes, n_genes)
    )
    codes = np.unique(rng.integers(4**16, size=int(n_barcodes * 1.01) + 10, dtype=np.int64))
    codes = rng.permutation(codes)[:n_barcodes]
    letters = np.frombuffer(b"ACGT", dtype=np.uint8)[(codes[:, None] >> (2 * np.arange(16))) & 3]
    barcodes = [f"{word}-1" for word in letters.view("S16").ravel().astype(str)]
    is_cell = np.zeros(n_barcodes, dtype=bool)
    is_cell[order[:n_cells]] = True
    truth = pd.DataFrame(
        {
            "is_cell": is_cell,
            "cell_type": np.full(n_barcodes, -1, dtype=np.int64),
            "ambient_fraction": np.full(n_barcodes, np.nan),
            "total": np.asarray(counts.sum(axis=1)).ravel().astype(np.int64),
        },
        index=pd.Index(barcodes, name="barcode"),
    )
    truth.iloc[order[:n_cells], 1] = cell_type
    truth.iloc[order[:n_cells], 2] = n_ambient / library
    return RawDroplets(counts, barcodes, truth, list(marker_genes), ambient)


def _molecule_umis(group: np.ndarray, *, umi_length: int, rng: np.random.Generator) -> np.ndarray:
    """A UMI per molecule, distinct within its group and at least two bases from the group's others.

    ``umi_length - 1`` random bases, distinct within the group, and a check base (their sum
    modulo 4): two UMIs that differ in one random base differ in the check base too.
    """
    n_random = umi_length - 1
    codes = rng.integers(4**n_random, size=group.size, dtype=np.int64)
    while True:
        order = np.lexsort((codes, group))
        repeated = (group[order][1:] == group[order][:-1]) & (codes[order][1:] == codes[order][:-1])
        if not repeated.any():
            break
        redraw = order[1:][repeated]
        codes[redraw] = rng.integers(4**n_random, size=redraw.size, dtype=np.int64)
    digits = (codes[:, None] >> (2 * np.arange(n_random))) & 3
    with_check = np.column_stack([digits, digits.sum(axis=1) % 4])
    return np.frombuffer(b"ACGT", dtype=np.uint8)[with_check].view(f"S{umi_length}").ravel().astype(str)


def droplet_reads(droplets: RawDroplets, *, umi_length: int = 12, seed: int = 0) -> pd.DataFrame:
    """Reads whose UMI deduplication gives ``droplets.counts`` back, as :func:`write_bam` takes them.

    Each molecule has 1 + geometric(0.5) reads without sequencing errors; the UMIs of one
    barcode and gene differ in at least two bases (see :func:`_molecule_umis`), so every
    UMI-tools method with an edit distance of 1 recovers the counts exactly (random 12-mers
    would collide: a gene holds thousands of molecules in a cell).
    """
    rng = np.random.default_rng(seed)
    counts = droplets.counts.tocoo()
    n_molecules = counts.data.astype(np.int64)
    barcode = np.repeat(counts.row, n_molecules)
    gene = np.repeat(counts.col, n_molecules)
    reads = rng.geometric(0.5, size=barcode.size)
    umis = _molecule_umis(barcode * droplets.counts.shape[1] + gene, umi_length=umi_length, rng=rng)
    molecule = np.repeat(np.arange(barcode.size), reads)
    names = np.array(gene_names(droplets.counts.shape[1]), dtype=object)
    return (
        pd.DataFrame(
            {
                "position": gene[molecule] * 5000 + rng.integers(0, 4000, size=molecule.size),
                "cell": np.asarray(droplets.barcodes, dtype=object)[barcode[molecule]],
                "umi": umis[molecule],
                "gene": names[gene[molecule]],
                "secondary": np.zeros(molecule.size, dtype=bool),
            }
        )
        .sort_values("position", kind="stable")
        .reset_index(drop=True)
    )


# Human chromosome lengths (GRCh38, Mb), for generated fragments.
CHROMOSOME_MB = [248, 242, 198, 190, 181, 171, 159, 145, 138, 134, 135, 133, 114, 107, 102, 90, 83, 80, 59, 64, 47, 51]


def fragment_barcodes(n: int, *, seed: int) -> list[str]:
    """``n`` random 10x barcodes (16 bases and ``-1``)."""
    rng = np.random.default_rng(seed)
    return [f"{''.join(b)}-1" for b in rng.choice(list("ACGT"), size=(n, 16))]


def write_fragments(path: Path, n_fragments: int, *, n_cells: int = 10_000, seed: int = 0, jobs: int = 1) -> None:
    """A 10x ``fragments.tsv`` (plain text, sorted by chromosome and start).

    80% of fragments come from ``n_cells`` cell barcodes and 20% from 20x as many
    background barcodes; half fall in 50,000 accessible regions (peaks, 500 bp) and half
    anywhere; lengths follow the nucleosome ladder (nucleosome-free, mono-, di-).
    Chromosomes are drawn in ``jobs`` processes, each from its own seed, then joined.
    """
    lengths = np.array(CHROMOSOME_MB) * 1_000_000
    per_chromosome = np.random.default_rng(seed).multinomial(n_fragments, lengths / lengths.sum())
    tasks = [
        (path.with_name(f"{path.name}.chr{number}"), number, int(size), int(n), n_cells, seed)
        for number, (size, n) in enumerate(zip(lengths, per_chromosome, strict=True), start=1)
    ]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        parts = list(pool.map(_write_chromosome_fragments, tasks))
    with path.open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                while block := handle.read(1 << 26):
                    out.write(block)
            part.unlink()


def _write_chromosome_fragments(task: tuple[Path, int, int, int, int, int]) -> Path:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path, number, size, n, n_cells, seed = task
    barcodes = pa.array(fragment_barcodes(21 * n_cells, seed=seed))  # cells first, then background
    rng = np.random.default_rng([seed, number])
    peaks = rng.integers(0, size - 1000, size=max(1, 50_000 * size // (sum(CHROMOSOME_MB) * 1_000_000)))
    in_peak = rng.random(n) < 0.5
    anywhere = rng.integers(0, size - 1000, n)
    start = np.where(in_peak, rng.choice(peaks, size=n) + rng.integers(0, 500, n), anywhere)
    ladder = rng.choice([0, 1, 2], size=n, p=[0.55, 0.35, 0.10])
    length = rng.integers(40, 147, n) + ladder * 147
    cell = np.where(rng.random(n) < 0.8, rng.integers(0, n_cells, n), rng.integers(n_cells, 21 * n_cells, n))
    order = np.argsort(start, kind="stable")
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    schema = pa.schema(
        [
            ("chrom", pa.string()),
            ("start", pa.int64()),
            ("end", pa.int64()),
            ("barcode", pa.string()),
            ("reads", pa.int64()),
        ]
    )
    with pacsv.CSVWriter(path, schema, write_options=options) as writer:
        for part in np.array_split(order, max(1, n // 5_000_000)):
            writer.write_table(
                pa.table(
                    {
                        "chrom": pa.array([f"chr{number}"]).take(np.zeros(part.size, np.int64)),
                        "start": start[part],
                        "end": start[part] + length[part],
                        "barcode": barcodes.take(cell[part]),
                        "reads": rng.integers(1, 5, part.size),
                    }
                )
            )
    return path


if __name__ == "__main__":
    main()
