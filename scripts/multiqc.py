"""Rule multiqc: MultiQC's report of the study (results/multiqc/), opening on the summary's headline columns."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.io.multiqc import write_multiqc_report
    from omicsprep.summary import multiqc_sections

    samples = snakemake.params.fastq_samples
    starsolo = {
        sample: io.read_solo_summary(path) for sample, path in zip(samples, snakemake.input.starsolo, strict=True)
    }
    sections = multiqc_sections(io.read_table(snakemake.input.summary).set_index("sample"), starsolo=starsolo)
    write_multiqc_report(
        sections,
        star_logs=dict(zip(samples, snakemake.input.star_logs, strict=True)),
        report=snakemake.output.report,
        data=snakemake.output.data,
    )


run_rule(main, snakemake, sample="multiqc")
