"""Rule qc: read a sample's counts, compute QC metrics, filter cells and genes, score doublets.

Rule qc_cluster (config fuse_qc_cluster) runs this script and goes on with rule cluster's work.
"""

from omicsprep import io
from omicsprep.backend import resolve_backend
from omicsprep.options import DoubletOptions, QcOptions, from_config
from omicsprep.pipeline import run_qc
from omicsprep.workflow import cluster_and_write, run_script

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    backend = resolve_backend(snakemake.params.backend)
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
    if "processed" in set(snakemake.output.keys()):  # rule qc_cluster: rule cluster's work, in this process
        cluster_and_write(adata, snakemake=snakemake, h5ad=snakemake.output.processed, backend=backend)


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
