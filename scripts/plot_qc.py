"""Rule plot_qc: histograms and a scatter plot of every input cell's QC metrics."""

import omicsprep.handoff  # noqa: F401 - first: a warm worker runs this script, if started (omicsprep workers)

# isort: split
from omicsprep import io
from omicsprep.workflow import run_script, write_qc_figures

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    write_qc_figures(
        io.read_table(snakemake.input.metrics),
        sample=snakemake.wildcards.sample,
        histograms=snakemake.output.histograms,
        scatter=snakemake.output.scatter,
    )


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample)
