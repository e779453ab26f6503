"""Rule summary: one row per sample of the study (results/summary.tsv), the report's first table."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.summary import sample_row, seconds_per_sample, study_summary

    seconds = seconds_per_sample(io.read_table(snakemake.input.run_times))
    barcodes = dict(zip(snakemake.params.called, snakemake.input.barcodes, strict=True))
    rows = {
        sample: sample_row(
            metrics=io.read_table(metrics),
            obs=io.read_table(obs),
            clusters=snakemake.params.clusters,
            barcodes=io.read_table(barcodes[sample]) if sample in barcodes else None,
            seconds=seconds.get(sample),
        )
        for sample, metrics, obs in zip(
            snakemake.params.samples, snakemake.input.metrics, snakemake.input.obs, strict=True
        )
    }
    io.write_table(study_summary(rows), snakemake.output.table, index=True)


run_rule(main, snakemake, sample="summary")
