"""Rule plot_qc: histograms and a scatter plot of every input cell's QC metrics."""

from omicsprep import io, plotting
from omicsprep.workflow import run_script

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    metrics = io.read_table(snakemake.input.metrics)
    sample = snakemake.wildcards.sample
    io.write_figure(plotting.qc_histograms(metrics, title=sample), snakemake.output.histograms)
    io.write_figure(plotting.qc_scatter(metrics, title=sample), snakemake.output.scatter)


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample)
