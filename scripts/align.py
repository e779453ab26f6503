"""Rule align: STARsolo on a sample's FASTQs, into results/{sample}/star/."""

from pathlib import Path

from omicsprep.align.run import align_sample, sample_chemistry
from omicsprep.jobs import run_rule
from omicsprep.options import AlignOptions, from_config

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    options = from_config(AlignOptions, snakemake.params.align)
    inputs = snakemake.input
    given = set(inputs.keys())
    align_sample(
        index_dir=Path(inputs.index),
        fastq_1=[Path(path) for path in inputs.fastq_1],
        fastq_2=[Path(path) for path in inputs.fastq_2],
        chemistry=sample_chemistry(snakemake.params.chemistry, custom=options.custom),
        whitelist=Path(inputs.whitelist) if "whitelist" in given else None,
        out_dir=Path(snakemake.output.bam).parent,
        threads=snakemake.threads,
        options=options,
    )


run_rule(main, snakemake)
