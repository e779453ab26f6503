"""Rule qc: read a sample's counts, compute QC metrics, filter cells and genes, score doublets.

Rule qc_cluster (config fuse_qc_cluster) runs this script and goes on with the work of rules
cluster, plot_qc and plot_umap.
"""

from omicsprep import io
from omicsprep.backend import prepare_gpu, resolve_backend
from omicsprep.options import DoubletOptions, QcOptions, from_config
from omicsprep.pipeline import run_qc
from omicsprep.workflow import cluster_and_write, run_script, write_embedding_figures, write_qc_figures

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    backend = resolve_backend(snakemake.params.backend)
    prepare_gpu(backend)  # overlaps reading the input
    adata = io.read_counts(
        snakemake.input.counts,
        fmt=snakemake.params.format,
        duplicate_barcodes=snakemake.params.duplicate_barcodes,
        fractional=snakemake.params.ambient_corrected,
    )
    adata.obs["sample"] = snakemake.wildcards.sample
    for column, value in snakemake.params.metadata.items():
        adata.obs[column] = value
    adata, metrics = run_qc(
        adata,
        options=from_config(QcOptions, snakemake.params.qc),
        doublet_options=from_config(DoubletOptions, snakemake.params.doublets),
        seed=snakemake.params.seed,
        backend=backend,
    )
    io.write_table(metrics, snakemake.output.metrics, index=True)
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])
    if "processed" not in set(snakemake.output.keys()):
        return
    # Rule qc_cluster: the work of rules cluster, plot_qc and plot_umap, in this process.
    cluster_and_write(adata, snakemake=snakemake, h5ad=snakemake.output.processed, backend=backend)
    sample, output = snakemake.wildcards.sample, snakemake.output
    write_qc_figures(metrics, sample=sample, histograms=output.histograms, scatter=output.scatter)
    write_embedding_figures(
        adata.obsm["X_umap"],
        adata.obs,
        sample=sample,
        cluster_keys=snakemake.params.cluster_keys,
        metric_keys=snakemake.params.metric_keys,
        clusters=output.umap_clusters,
        metrics=output.umap_metrics,
    )


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
