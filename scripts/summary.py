"""Rule summary: one row per sample (results/summary.tsv), the report's first table, and MultiQC's report of it."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.io.multiqc import write_multiqc_report
    from omicsprep.summary import multiqc_sections, sample_row, study_summary

    barcodes = dict(zip(snakemake.params.called, snakemake.input.barcodes, strict=True))
    rows = {
        sample: sample_row(
            metrics=io.read_table(metrics),
            obs=io.read_table(obs),
            clusters=snakemake.params.clusters,
            barcodes=io.read_table(barcodes[sample]) if sample in barcodes else None,
        )
        for sample, metrics, obs in zip(
            snakemake.params.samples, snakemake.input.metrics, snakemake.input.obs, strict=True
        )
    }
    summary = study_summary(rows)
    io.write_table(summary, snakemake.output.table, index=True)

    fastq_samples = snakemake.params.fastq_samples
    starsolo = [io.read_solo_summary(path) for path in snakemake.input.starsolo]
    write_multiqc_report(
        multiqc_sections(summary, starsolo=dict(zip(fastq_samples, starsolo, strict=True))),
        star_logs=dict(zip(fastq_samples, snakemake.input.star_logs, strict=True)),
        report=snakemake.output.multiqc,
        data=snakemake.output.multiqc_data,
    )


# In a free worker of the GPU pool where there is one: they imported MultiQC (1-4 s in a new process)
# while idle. Not waiting for one behind GPU jobs: it runs beside them in its own process then.
run_rule(main, snakemake, sample="summary", pooled=True, wait_for_worker=False)
