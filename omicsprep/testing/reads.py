"""Synthetic aligned reads with PCR duplicates and UMI errors, deterministic from a seed.

Reads of a droplet experiment (cell, UMI, gene, position per read; skewed genes, geometric
PCR duplicates, sequencing errors and Ns in the UMIs, unassigned, multi-gene and secondary
reads), the same molecules already encoded for the UMI kernels, a BAM of them with Cell
Ranger's tags, and the ``umi_tools count`` command that counts such a BAM.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


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
