"""A synthetic genome, its annotation and droplet FASTQs with a planted truth, for STARsolo.

    python -m omicsprep.testing.generate_fastq --out data/fastq [--cells 50] [--reads-per-cell 1500]

Genome: random sequence; genes of 2-4 exons (100-300 bases) and introns (200-800 bases) on
both strands, apart from each other; optionally a few genes annotated twice (their reads are
multi-gene). Reads (10x 3' layout by default): read 1 is the cell barcode and the UMI (plus
``extra_bases`` of poly-T), read 2 a 90-base cDNA read of the molecule's sense strand
(antisense, from the 5' end, for ``10x5p``): from the spliced transcript (crossing
junctions), or, for ``intronic_fraction`` of the molecules, from inside an intron (pre-mRNA;
counted by STARsolo's GeneFull, not Gene). Each molecule has 1 + Poisson(2) reads; reads
carry independent substitution errors in the barcode, the UMI and the cDNA. The truth
table has one row per planted molecule: cell, gene, UMI, reads and whether it is intronic.
Deterministic from the seeds; ~75,000 read pairs take about three seconds.
"""

from __future__ import annotations

import argparse
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

BASES = np.frombuffer(b"ACGT", dtype=np.uint8)
COMPLEMENT = bytes.maketrans(b"ACGTN", b"TGCAN")
READ_LENGTH = 90
# Cell barcode and UMI lengths; 10x 5' read 2 is antisense, from the transcript's 5' end.
LAYOUTS = {"10xv2": (16, 10), "10xv3": (16, 12), "10xv4": (16, 12), "10x5p": (16, 10), "dropseq": (12, 8)}
ANTISENSE = ("10x5p",)


@dataclass(frozen=True)
class Gene:
    """A gene: ``exons`` are 0-based half-open genome intervals, in genome order."""

    gene_id: str
    name: str
    chromosome: str
    strand: str
    exons: tuple[tuple[int, int], ...]

    def transcript(self, genome: Genome) -> bytes:
        """The spliced mRNA, 5' to 3'."""
        sequence = genome.sequences[self.chromosome]
        spliced = b"".join(sequence[start:end] for start, end in self.exons)
        return spliced if self.strand == "+" else reverse_complement(spliced)

    def introns(self) -> list[tuple[int, int]]:
        """Genome intervals between consecutive exons."""
        return [(end, start) for (_, end), (start, _) in zip(self.exons, self.exons[1:], strict=False)]


@dataclass(frozen=True)
class Genome:
    """Chromosome sequences (upper-case ACGT), their genes, and unexpressed twins of some genes.

    A twin has its gene's exons under another gene_id: every read of that gene then matches
    two genes (a multi-gene read, which STARsolo's Gene and GeneFull do not count).
    """

    sequences: dict[str, bytes]
    genes: tuple[Gene, ...]
    twins: tuple[Gene, ...] = ()

    @property
    def length(self) -> int:
        """The genome's length in bases."""
        return sum(len(sequence) for sequence in self.sequences.values())


@dataclass(frozen=True)
class Planted:
    """What :func:`generate_fastqs` wrote.

    ``fastq_1``/``fastq_2`` are the barcode and cDNA reads, one file per lane; ``truth`` has a
    row per molecule: ``cell``, ``gene`` (gene_id), ``umi``, ``reads``, ``intronic``;
    ``barcodes`` are the cells' barcodes, ``whitelist`` lists them with decoys;
    ``unusable_umi_reads`` counts the added reads whose UMI is a homopolymer or holds an N
    (kept out of the truth: STARsolo drops them); ``empty_droplets`` are the barcodes of
    droplets with ambient RNA only (their molecules are in ``truth`` too).
    """

    fastq_1: tuple[Path, ...]
    fastq_2: tuple[Path, ...]
    whitelist: Path
    barcodes: tuple[str, ...]
    truth: pd.DataFrame
    unusable_umi_reads: dict[str, int]
    empty_droplets: tuple[str, ...] = ()


def reverse_complement(sequence: bytes) -> bytes:
    """The sequence of the other strand, read 5' to 3'."""
    return sequence.translate(COMPLEMENT)[::-1]


def _random_sequence(rng: np.random.Generator, length: int) -> bytes:
    return BASES[rng.integers(0, 4, length)].tobytes()


def generate_genome(*, n_chromosomes: int = 3, n_genes: int = 200, seed: int = 0, n_twins: int = 0) -> Genome:
    """Random chromosomes holding ``n_genes`` multi-exon genes, spread evenly over them.

    The last ``n_twins`` genes get a twin (``<gene_id>T``, same exons and strand) in the GTF.
    """
    rng = np.random.default_rng(seed)
    sequences, genes = {}, []
    per_chromosome = np.array_split(np.arange(n_genes), n_chromosomes)
    for c, numbers in enumerate(per_chromosome):
        chromosome, position = f"chr{c + 1}", int(rng.integers(500, 1500))
        for number in numbers:
            n_exons = int(rng.integers(2, 5))
            exons = []
            for e in range(n_exons):
                if e:
                    position += int(rng.integers(200, 801))
                length = int(rng.integers(100, 301))
                exons.append((position, position + length))
                position += length
            genes.append(
                Gene(f"G{number + 1:05d}", f"Gene{number + 1}", chromosome, "+-"[int(rng.integers(0, 2))], tuple(exons))
            )
            position += int(rng.integers(300, 1000))
        sequences[chromosome] = _random_sequence(rng, position + int(rng.integers(500, 1500)))
    twins = tuple(
        Gene(f"{gene.gene_id}T", f"{gene.name}-twin", gene.chromosome, gene.strand, gene.exons)
        for gene in genes[len(genes) - n_twins :]
    )
    return Genome(sequences, tuple(genes), twins if n_twins else ())


def write_reference(genome: Genome, *, fasta: Path, gtf: Path) -> None:
    """Write the genome as FASTA (60 bases a line) and its genes as a GTF (gene, transcript, exon)."""
    with Path(fasta).open("w") as handle:
        for chromosome, sequence in genome.sequences.items():
            handle.write(f">{chromosome} synthetic\n")
            handle.writelines(sequence[i : i + 60].decode() + "\n" for i in range(0, len(sequence), 60))
    lines = []
    for gene in (*genome.genes, *genome.twins):
        attributes = f'gene_id "{gene.gene_id}"; gene_name "{gene.name}"; gene_biotype "protein_coding";'
        transcript = f'{attributes} transcript_id "{gene.gene_id}.1";'
        start, end = gene.exons[0][0] + 1, gene.exons[-1][1]
        fields = (gene.chromosome, "synthetic")
        lines.append("\t".join([*fields, "gene", str(start), str(end), ".", gene.strand, ".", attributes]))
        lines.append("\t".join([*fields, "transcript", str(start), str(end), ".", gene.strand, ".", transcript]))
        order = gene.exons if gene.strand == "+" else gene.exons[::-1]
        for number, (exon_start, exon_end) in enumerate(order, start=1):
            exon = f'{transcript} exon_number "{number}";'
            lines.append("\t".join([*fields, "exon", str(exon_start + 1), str(exon_end), ".", gene.strand, ".", exon]))
    Path(gtf).write_text("\n".join(lines) + "\n")


def _distinct_barcodes(rng: np.random.Generator, n: int, length: int) -> list[str]:
    """``n`` random barcodes at least 3 substitutions apart (a 1-mismatch read matches one)."""
    chosen: list[np.ndarray] = []
    while len(chosen) < n:
        candidate = rng.integers(0, 4, length)
        if all(np.count_nonzero(candidate != other) >= 3 for other in chosen):
            chosen.append(candidate)
    return [BASES[code].tobytes().decode() for code in chosen]


def _mutate(rng: np.random.Generator, sequence: bytes, rate: float) -> bytes:
    """Substitute each base with probability ``rate`` by one of the three others."""
    if rate <= 0:
        return sequence
    hits = np.flatnonzero(rng.random(len(sequence)) < rate)
    if hits.size == 0:
        return sequence
    codes = np.frombuffer(sequence.translate(bytes.maketrans(b"ACGT", b"\x00\x01\x02\x03")), dtype=np.uint8).copy()
    codes[hits] = (codes[hits] + rng.integers(1, 4, hits.size)) % 4
    return BASES[codes].tobytes()


def _umi(rng: np.random.Generator, length: int) -> str:
    """A random UMI that is not a homopolymer (STARsolo drops those)."""
    while True:
        umi = BASES[rng.integers(0, 4, length)].tobytes().decode()
        if len(set(umi)) > 1:
            return umi


def generate_fastqs(
    genome: Genome,
    *,
    out_dir: Path,
    n_cells: int = 50,
    chemistry: str = "10xv3",
    reads_per_cell: int = 1500,
    seed: int = 0,
    barcode_error: float = 0.005,
    umi_error: float = 0.002,
    cdna_error: float = 0.002,
    intronic_fraction: float = 0.2,
    extra_bases: int = 0,
    n_decoys: int = 200,
    n_lanes: int = 1,
    n_unusable_umi_reads: int = 0,
    n_empty_droplets: int = 0,
    empty_molecules: float = 5.0,
) -> Planted:
    """Write ``L<n>_R1.fastq.gz``/``L<n>_R2.fastq.gz`` per lane, ``whitelist.txt`` and ``truth.csv``.

    Each cell expresses the genes with gamma-distributed weights; its molecules are drawn
    in proportion (about ``reads_per_cell / 3``), each with 1 + Poisson(2) reads. Read
    pairs are written in random order, named ``SYN:<n>`` with ``1:N:0``/``2:N:0`` comments.
    ``n_unusable_umi_reads`` more reads of planted cells carry a homopolymer UMI (half) or a
    UMI with an N (half). ``n_empty_droplets`` whitelisted barcodes (at most ``n_decoys``) get
    1 + Poisson(``empty_molecules``) molecules each, drawn from the cells' pooled expression
    (ambient RNA).
    """
    cb_length, umi_length = LAYOUTS[chemistry]
    antisense = chemistry in ANTISENSE
    rng = np.random.default_rng(seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    barcodes = _distinct_barcodes(rng, n_cells + n_decoys, cb_length)
    cells, decoys = barcodes[:n_cells], barcodes[n_cells:]
    transcripts = [gene.transcript(genome) for gene in genome.genes]
    usable_introns = [[i for i in gene.introns() if i[1] - i[0] >= READ_LENGTH] for gene in genome.genes]
    molecules, pairs = [], []
    ambient = np.zeros(len(genome.genes))

    def add_molecules(barcode: str, genes: np.ndarray) -> None:
        for g in genes:
            gene = genome.genes[g]
            intronic = bool(usable_introns[g]) and rng.random() < intronic_fraction
            umi, n_reads = _umi(rng, umi_length), 1 + int(rng.poisson(2))
            molecules.append((barcode, gene.gene_id, umi, n_reads, intronic))
            for _ in range(n_reads):
                cdna = _cdna_read(
                    rng, genome, gene, transcripts[g], usable_introns[g] if intronic else None, antisense=antisense
                )
                read_1 = _mutate(rng, barcode.encode(), barcode_error) + _mutate(rng, umi.encode(), umi_error)
                pairs.append((read_1 + b"T" * extra_bases, _mutate(rng, cdna, cdna_error)))

    for cell in cells:
        weights = rng.gamma(0.6, size=len(genome.genes))
        ambient += weights / weights.sum()
        add_molecules(cell, rng.choice(len(genome.genes), size=max(1, reads_per_cell // 3), p=weights / weights.sum()))
    # Empty droplets: whitelisted barcodes with a few molecules of the cells' pooled RNA.
    empty_droplets = decoys[:n_empty_droplets]
    for barcode in empty_droplets:
        n_molecules = 1 + int(rng.poisson(empty_molecules))
        add_molecules(barcode, rng.choice(len(genome.genes), size=n_molecules, p=ambient / ambient.sum()))
    unusable = {"homopolymer": n_unusable_umi_reads // 2, "N": n_unusable_umi_reads - n_unusable_umi_reads // 2}
    for kind, n_reads in unusable.items():
        for _ in range(n_reads):
            g = int(rng.integers(0, len(genome.genes)))
            if kind == "homopolymer":
                umi = "ACGT"[int(rng.integers(0, 4))] * umi_length
            else:
                umi = _umi(rng, umi_length)
                umi = umi[: umi_length // 2] + "N" + umi[umi_length // 2 + 1 :]
            cdna = _cdna_read(rng, genome, genome.genes[g], transcripts[g], None, antisense=antisense)
            pairs.append(((cells[int(rng.integers(0, n_cells))] + umi).encode() + b"T" * extra_bases, cdna))
    fastq_1, fastq_2, written = [], [], 0
    for lane, order in enumerate(np.array_split(rng.permutation(len(pairs)), n_lanes), start=1):
        fastq_1.append(out_dir / f"L{lane:03d}_R1.fastq.gz")
        fastq_2.append(out_dir / f"L{lane:03d}_R2.fastq.gz")
        write_fastq(fastq_1[-1], [pairs[i][0] for i in order], mate=1, first=written)
        write_fastq(fastq_2[-1], [pairs[i][1] for i in order], mate=2, first=written)
        written += len(order)
    whitelist = out_dir / "whitelist.txt"
    whitelist.write_text("\n".join(sorted(cells + decoys)) + "\n")
    truth = pd.DataFrame(molecules, columns=["cell", "gene", "umi", "reads", "intronic"])
    truth.to_csv(out_dir / "truth.csv", index=False)
    return Planted(tuple(fastq_1), tuple(fastq_2), whitelist, tuple(cells), truth, unusable, tuple(empty_droplets))


def _cdna_read(
    rng: np.random.Generator,
    genome: Genome,
    gene: Gene,
    transcript: bytes,
    introns: list[tuple[int, int]] | None,
    *,
    antisense: bool = False,
) -> bytes:
    """A read from the mRNA (3'-biased sense, or 5'-biased antisense), or wholly inside one intron."""
    if introns:
        start, end = introns[int(rng.integers(0, len(introns)))]
        offset = int(rng.integers(start, end - READ_LENGTH + 1))
        read = genome.sequences[gene.chromosome][offset : offset + READ_LENGTH]
        sense = read if gene.strand == "+" else reverse_complement(read)
        return reverse_complement(sense) if antisense else sense
    last = len(transcript) - READ_LENGTH
    from_end = min(last, int(rng.exponential(last / 2)))
    if antisense:
        return reverse_complement(transcript[from_end : from_end + READ_LENGTH])
    return transcript[last - from_end : last - from_end + READ_LENGTH]


def write_fastq(path: Path, sequences: list[bytes], *, mate: int, first: int = 0) -> None:
    """Gzipped FASTQ records ``@SYN:<n> <mate>:N:0`` with quality ``I`` throughout."""
    with gzip.open(path, "wb", compresslevel=1) as handle:
        for number, sequence in enumerate(sequences, start=first):
            handle.write(b"@SYN:%d %d:N:0\n%s\n+\n%s\n" % (number, mate, sequence, b"I" * len(sequence)))


def main() -> None:
    """Write a genome, its annotation and FASTQ reads (``python -m omicsprep.testing.generate_fastq``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--genes", type=int, default=200)
    parser.add_argument("--reads-per-cell", type=int, default=1500)
    parser.add_argument("--chemistry", default="10xv3", choices=sorted(LAYOUTS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    genome = generate_genome(n_genes=args.genes, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    write_reference(genome, fasta=args.out / "genome.fa", gtf=args.out / "genes.gtf")
    generate_fastqs(
        genome,
        out_dir=args.out,
        n_cells=args.cells,
        chemistry=args.chemistry,
        reads_per_cell=args.reads_per_cell,
        seed=args.seed + 1,
    )


if __name__ == "__main__":
    main()
