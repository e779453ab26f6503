"""Rule plot_umap: the UMAP coloured by clusters and by QC metrics."""

import omicsprep.handoff  # noqa: F401 - first: a warm worker runs this script, if started (omicsprep workers)

# isort: split
from omicsprep import io
from omicsprep.workflow import run_script, write_embedding_figures

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    elements = io.read_h5ad_elements(snakemake.input.h5ad, ["obs", "obsm/X_umap"])
    write_embedding_figures(
        elements["obsm/X_umap"],
        elements["obs"],
        sample=snakemake.wildcards.sample,
        cluster_keys=snakemake.params.cluster_keys,
        metric_keys=snakemake.params.metric_keys,
        clusters=snakemake.output.umap_clusters,
        metrics=snakemake.output.umap_metrics,
    )


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample)
