"""Rule qc: read a sample's counts, compute QC metrics, filter cells and genes, score doublets.

Rule qc_cluster (config fuse_qc_cluster) runs this script and goes on with the work of rules
cluster, plot_qc and plot_umap.
"""

import omicsprep.handoff  # noqa: F401 - first: a warm worker runs this script, if started (omicsprep workers)

# isort: split
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from omicsprep import io
from omicsprep.backend import asnumpy, prepare_gpu, resolve_backend
from omicsprep.background import background_process, background_writes
from omicsprep.workflow import (
    cluster,
    quality_control,
    run_script,
    write_clustering,
    write_embedding_figure,
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
    final; its rest once clustered. Each figure is drawn once what it shows is final (the
    UMAP by QC metrics while the cells are clustered), from copies: writing an .h5ad
    changes the cells' table.
    """
    sample, output = snakemake.wildcards.sample, snakemake.output
    with background_process(preload="omicsprep.plotting") as draw_later:
        backend = resolve_backend(snakemake.params.backend)
        # Overlapping importing the pipeline and reading the input; pylibcugraph the first steps too.
        prepare_gpu(backend, modules=("rapids_singlecell", "cuml", "pylibcugraph"))
        adata, metrics = quality_control(read_counts(), snakemake=snakemake, backend=backend, keep_on_device=True)
        draw_later(write_qc_figures, metrics, sample=sample, histograms=output.histograms, scatter=output.scatter)
        qc_cells = adata.copy()
        compression = snakemake.config["h5ad_compression"]
        with (
            # Its normalized matrix, then the counts' values (their indices are the matrix's).
            io.h5ad_in_parts(
                adata,
                output.processed,
                compression=compression,
                expected_bytes=io.stored_bytes(adata) + io.values_bytes(adata.X),
            ) as processed,
            background_writes() as write_later,
        ):
            write_later(write_qc, qc_cells, metrics, snakemake=snakemake)
            after_step = partial(
                write_what_is_final,
                processed=processed,
                qc_cells=qc_cells,
                write_later=write_later,
                draw_later=draw_later,
            )
            markers = cluster(adata, snakemake=snakemake, backend=backend, after_step=after_step)
            keys, path = snakemake.params.cluster_keys, output.umap_clusters
            coords, obs = adata.obsm["X_umap"], adata.obs[keys].copy()
            draw_later(write_embedding_figure, coords, obs, sample=sample, keys=keys, path=path)
            write_later(write_clustering, adata, markers, snakemake=snakemake, h5ad=processed)


def write_what_is_final(
    step: str,
    adata: "AnnData",
    *,
    processed: "io.H5adParts",
    qc_cells: "AnnData",
    write_later: Callable[..., None],
    draw_later: Callable[..., None],
) -> None:
    """As clustering's ``step`` ends, start writing or drawing what it made final.

    After ``normalize`` the processed AnnData's matrices; after ``umap`` the UMAP coloured
    by QC metrics, from a copy of its coordinates (in host memory) and of the metrics.
    """
    if step == "normalize":
        write_later(write_normalized, processed, adata, qc_cells=qc_cells)
    elif step == "umap":
        keys = [key for key in snakemake.params.metric_keys if key in adata.obs]
        coords, obs = asnumpy(adata.obsm["X_umap"]), adata.obs[keys].copy()
        path = snakemake.output.umap_metrics
        draw_later(write_embedding_figure, coords, obs, sample=snakemake.wildcards.sample, keys=keys, path=path)


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
