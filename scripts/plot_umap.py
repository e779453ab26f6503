"""Rule plot_umap: the UMAP coloured by clusters and by QC metrics."""

from omicsprep import io, plotting
from omicsprep.workflow import run_script

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    elements = io.read_h5ad_elements(snakemake.input.h5ad, ["obs", "obsm/X_umap"])
    obs, coords = elements["obs"], elements["obsm/X_umap"]
    sample = snakemake.wildcards.sample
    clusters = plotting.embedding_panels(coords, obs, keys=snakemake.params.clusters, title=sample)
    io.write_figure(clusters, snakemake.output.clusters)
    metrics = [key for key in snakemake.params.metrics if key in obs]
    io.write_figure(plotting.embedding_panels(coords, obs, keys=metrics, title=sample), snakemake.output.metrics)


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample)
