"""Synthetic raw droplets with planted truth, and reads that count back to them.

Every barcode of a droplet run: cells of types with exclusive marker genes, each with a
planted share of ambient UMIs, among empty droplets holding ambient UMIs only, so the
barcode-rank curve has the knee and plateau of real runs; the truth per barcode (cell or
not, type, ambient fraction). Also the reads of such a run, whose UMI deduplication gives
its counts back exactly. Deterministic from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import sparse

from omicsprep.testing.genes import HEMOGLOBIN, N_MITO, N_RIBO, gene_names


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
    """Reads whose UMI deduplication gives ``droplets.counts`` back, as :func:`~.reads.write_bam` takes them.

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
