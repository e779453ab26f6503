"""Rule qc: read a sample's counts, compute QC metrics, filter cells and genes, score doublets.

Rule qc_cluster (config fuse_qc_cluster) runs this script and goes on with the work of rules
cluster, plot_qc and plot_umap.
"""

import numpy as np
import pandas as pd

from omicsprep import io
from omicsprep.backend import prepare_gpu, resolve_backend
from omicsprep.options import DoubletOptions, QcOptions, from_config
from omicsprep.pipeline import run_qc
from omicsprep.workflow import (
    cluster,
    run_script,
    write_clustering,
    write_embedding_figures,
    write_qc,
    write_qc_figures,
)

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    backend = resolve_backend(snakemake.params.backend)
    fused = "processed" in set(snakemake.output.keys())
    # Overlapping reading the input; cuGraph (clustering) the first steps too.
    prepare_gpu(backend, modules=("rapids_singlecell", "cuml", "cugraph") if fused else ("rapids_singlecell", "cuml"))
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
        keep_on_device=fused,
    )
    if not fused:
        write_qc(adata, metrics, snakemake=snakemake)
        return
    # Rule qc_cluster: the work of rules cluster, plot_qc and plot_umap, in this process, on
    # the cells left on the GPU. The .h5ad files are written in the background (HDF5 lets
    # Python run meanwhile): qc's, from a copy (clustering changes the counts in place),
    # while clustering computes; cluster's while the figures are drawn (from a copy of the
    # cells' table, which writing an .h5ad changes).
    with io.background_writes() as write_later:
        write_later(write_qc, adata.copy(), metrics, snakemake=snakemake)
        markers = cluster(adata, snakemake=snakemake, backend=backend)
        obs = adata.obs.copy()
        write_later(write_clustering, adata, markers, snakemake=snakemake, h5ad=snakemake.output.processed)
        write_figures(metrics, adata.obsm["X_umap"], obs)


def write_figures(metrics: pd.DataFrame, coords: np.ndarray, obs: pd.DataFrame) -> None:
    """Rules plot_qc's and plot_umap's figures."""
    sample, output = snakemake.wildcards.sample, snakemake.output
    write_qc_figures(metrics, sample=sample, histograms=output.histograms, scatter=output.scatter)
    write_embedding_figures(
        coords,
        obs,
        sample=sample,
        cluster_keys=snakemake.params.cluster_keys,
        metric_keys=snakemake.params.metric_keys,
        clusters=output.umap_clusters,
        metrics=output.umap_metrics,
    )


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
