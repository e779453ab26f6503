"""Rule qc: read a sample's counts, compute QC metrics, filter cells and genes, score doublets.

Rule qc_cluster (config fuse_qc_cluster) runs this script and goes on with the work of rules
cluster, plot_qc and plot_umap.
"""

from functools import partial
from typing import TYPE_CHECKING

from omicsprep import io
from omicsprep.backend import prepare_gpu, resolve_backend
from omicsprep.background import background_process, background_writes
from omicsprep.workflow import (
    cluster,
    quality_control,
    run_script,
    write_clustering,
    write_embedding_figures,
    write_normalized,
    write_qc,
    write_qc_figures,
)

if TYPE_CHECKING:
    from anndata import AnnData  # imported by the reader, after the GPU's start-up began

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    if "processed" in set(snakemake.output.keys()):
        qc_and_cluster()
        return
    backend = resolve_backend(snakemake.params.backend)
    prepare_gpu(backend, modules=("rapids_singlecell", "cuml"))  # overlaps importing the pipeline, reading
    adata, metrics = quality_control(read_counts(), snakemake=snakemake, backend=backend, keep_on_device=False)
    write_qc(adata, metrics, snakemake=snakemake)


def qc_and_cluster() -> None:
    """Rule qc_cluster: the work of rules qc, cluster, plot_qc and plot_umap, in this process.

    The cells that passed stay on the GPU for clustering. The figures are drawn in a second
    process, forked first. The outputs are written in the background (HDF5 lets Python run
    meanwhile), in order: qc's, from a copy (clustering changes the counts in place), while
    clustering computes; then the processed AnnData's normalized matrix and counts, once
    final; its rest once clustered, while the UMAP figures are drawn (from a copy of the
    cells' table, which writing an .h5ad changes).
    """
    sample, output = snakemake.wildcards.sample, snakemake.output
    with background_process(preload="omicsprep.plotting") as draw_later:
        backend = resolve_backend(snakemake.params.backend)
        # Overlapping importing the pipeline and reading the input; cuGraph the first steps too.
        prepare_gpu(backend, modules=("rapids_singlecell", "cuml", "cugraph"))
        adata, metrics = quality_control(read_counts(), snakemake=snakemake, backend=backend, keep_on_device=True)
        draw_later(write_qc_figures, metrics, sample=sample, histograms=output.histograms, scatter=output.scatter)
        qc_cells = adata.copy()
        compression = snakemake.config["h5ad_compression"]
        with (
            io.h5ad_in_parts(adata, output.processed, compression=compression) as processed,
            background_writes() as write_later,
        ):
            write_later(write_qc, qc_cells, metrics, snakemake=snakemake)
            normalized = partial(write_later, write_normalized, processed, qc_cells=qc_cells)
            markers = cluster(adata, snakemake=snakemake, backend=backend, on_normalized=normalized)
            draw_later(
                write_embedding_figures,
                adata.obsm["X_umap"],
                adata.obs.copy(),
                sample=sample,
                cluster_keys=snakemake.params.cluster_keys,
                metric_keys=snakemake.params.metric_keys,
                clusters=output.umap_clusters,
                metrics=output.umap_metrics,
            )
            write_later(write_clustering, adata, markers, snakemake=snakemake, h5ad=processed)


def read_counts() -> "AnnData":
    """The sample's counts, with its name and metadata in ``obs``."""
    adata = io.read_counts(
        snakemake.input.counts,
        fmt=snakemake.params.format,
        duplicate_barcodes=snakemake.params.duplicate_barcodes,
        fractional=snakemake.params.ambient_corrected,
    )
    adata.obs["sample"] = snakemake.wildcards.sample
    for column, value in snakemake.params.metadata.items():
        adata.obs[column] = value
    return adata


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
