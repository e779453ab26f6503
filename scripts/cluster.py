"""Rule cluster: normalize, HVG, PCA, neighbours, UMAP, Leiden/Louvain and markers; the UMAP figures.

The outputs are written in the background as they become final (HDF5 lets Python run
meanwhile): the processed AnnData's normalized matrix and counts once normalized, its rest
once clustered. The figures are drawn in a second process: the UMAP by QC metrics while the
cells are clustered, by clusters at the end.
"""

from functools import partial
from typing import TYPE_CHECKING

from omicsprep.jobs import run_rule

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd
    from anndata import AnnData

    from omicsprep.backend import Backend
    from omicsprep.io import H5adParts

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.background import background_process, background_writes
    from omicsprep.io.figures import write_embedding_figure

    output = snakemake.output
    with background_process(preload="omicsprep.plotting") as draw_later:  # forked first: no GPU context yet
        backend = resolve_backend(snakemake.params.backend)
        # Overlapping reading the input; cuGraph (clustering) the first steps too.
        prepare_gpu(backend, modules=("rapids_singlecell", "cuml", "pylibcugraph"))
        adata = io.read_h5ad(snakemake.input.h5ad)
        counts = adata.X  # in host memory; the GPU gets a copy
        compression = snakemake.config["h5ad_compression"]
        # Its normalized matrix, then the counts' values (their indices are the matrix's).
        expected_bytes = io.stored_bytes(adata) + io.values_bytes(adata.X)
        with (
            io.h5ad_in_parts(adata, output.h5ad, compression=compression, expected_bytes=expected_bytes) as processed,
            background_writes() as write_later,
        ):
            after_step = partial(
                write_what_is_final, processed=processed, counts=counts, write_later=write_later, draw_later=draw_later
            )
            markers = cluster(adata, backend=backend, after_step=after_step)
            keys = snakemake.params.cluster_keys
            coords, obs = adata.obsm["X_umap"], adata.obs[keys].copy()
            sample = snakemake.wildcards.sample
            draw_later(write_embedding_figure, coords, obs, sample=sample, keys=keys, path=output.umap_clusters)
            write_later(write_clustering, adata, markers, h5ad=processed)


def write_what_is_final(
    step: str,
    adata: "AnnData",
    *,
    processed: "H5adParts",
    counts: object,
    write_later: "Callable[..., None]",
    draw_later: "Callable[..., None]",
) -> None:
    """As clustering's ``step`` ends, start writing or drawing what it made final.

    After ``normalize`` the processed AnnData's matrices (``counts``: as read, in host
    memory); after ``umap`` the UMAP coloured by QC metrics, from a copy of its coordinates
    (in host memory) and of the metrics.
    """
    from omicsprep.backend import asnumpy
    from omicsprep.io.figures import write_embedding_figure

    if step == "normalize":
        write_later(write_normalized, processed, adata, counts=counts)
    elif step == "umap":
        keys = [key for key in snakemake.params.metric_keys if key in adata.obs]
        coords, obs = asnumpy(adata.obsm["X_umap"]), adata.obs[keys].copy()
        path = snakemake.output.umap_metrics
        draw_later(write_embedding_figure, coords, obs, sample=snakemake.wildcards.sample, keys=keys, path=path)


def cluster(adata: "AnnData", *, backend: "Backend", after_step: "Callable[[str, AnnData], None]") -> "pd.DataFrame":
    """:func:`omicsprep.rna.pipeline.run_clustering` with the rule's settings (the pipeline imported here, timed)."""
    from omicsprep.jobs import import_timed
    from omicsprep.options import ClusteringOptions, from_config

    options = from_config(ClusteringOptions, snakemake.params.steps)
    return import_timed("omicsprep.rna.pipeline").run_clustering(
        adata, options=options, seed=snakemake.params.seed, backend=backend, after_step=after_step
    )


def write_normalized(processed: "H5adParts", adata: "AnnData", *, counts: object) -> None:
    """The processed AnnData's normalized matrix and counts, final before clustering ends.

    ``counts`` are as read from rule qc's output, in host memory (``layers["counts"]`` holds the
    same values, on the GPU there): stored as that file stores them, they are copied from it.
    """
    from omicsprep.backend import asnumpy

    processed.write_with_counts(asnumpy(adata.X), counts=counts, counts_file=snakemake.input.h5ad)


def write_clustering(adata: "AnnData", markers: "pd.DataFrame", *, h5ad: "H5adParts") -> None:
    """The markers, the cells' table, and the rest of the processed AnnData (its matrices written already)."""
    from omicsprep import io

    io.write_table(markers, snakemake.output.markers)
    io.write_table(adata.obs, snakemake.output.obs, index=True)
    h5ad.finish(adata)


run_rule(main, snakemake)
