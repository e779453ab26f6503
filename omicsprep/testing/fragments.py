"""A synthetic 10x ATAC ``fragments.tsv``, deterministic from a seed.

Fragments of cell and background barcodes over the human chromosomes' lengths, half in
accessible regions (peaks), with lengths of the nucleosome ladder; drawn per chromosome in
processes and written sorted by chromosome and start.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

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
