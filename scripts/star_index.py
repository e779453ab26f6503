"""Rule star_index: STAR's genome index of the reference FASTA and GTF."""

from pathlib import Path

from omicsprep.align.run import build_index
from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    build_index(
        fasta=Path(snakemake.input.fasta),
        gtf=Path(snakemake.input.gtf),
        index_dir=Path(snakemake.output.index),
        threads=snakemake.threads,
    )


run_rule(main, snakemake)
