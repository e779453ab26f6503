"""Rule cluster: normalize, HVG, PCA, neighbours, UMAP, Leiden/Louvain and markers."""

from omicsprep import io
from omicsprep.backend import resolve_backend
from omicsprep.options import ClusteringOptions, from_config
from omicsprep.pipeline import run_clustering
from omicsprep.workflow import run_script

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    backend = resolve_backend(snakemake.params.backend)
    adata = io.read_h5ad(snakemake.input.h5ad)
    options = from_config(ClusteringOptions, snakemake.params.steps)
    markers = run_clustering(adata, options=options, seed=snakemake.params.seed, backend=backend)
    io.write_table(markers, snakemake.output.markers)
    io.write_table(adata.obs, snakemake.output.obs, index=True)
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
