"""Rule cluster: normalize, HVG, PCA, neighbours, UMAP, Leiden/Louvain and markers; the UMAP figures.

The outputs are written in the background as they become final (HDF5 lets Python run
meanwhile): the processed AnnData's normalized matrix and counts once normalized, its rest
once clustered. The figures are drawn in a second process: the UMAP by QC metrics while the
cells are clustered, by clusters at the end.
"""

from functools import partial
from typing import TYPE_CHECKING

from omicsprep.workflow import run_rule

if TYPE_CHECKING:
    from collections.abc import Callable

    from anndata import AnnData

    from omicsprep.io import H5adParts

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.background import background_process, background_writes
    from omicsprep.workflow import cluster, write_clustering, write_embedding_figure

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
            markers = cluster(adata, snakemake=snakemake, backend=backend, after_step=after_step)
            keys = snakemake.params.cluster_keys
            coords, obs = adata.obsm["X_umap"], adata.obs[keys].copy()
            sample = snakemake.wildcards.sample
            draw_later(write_embedding_figure, coords, obs, sample=sample, keys=keys, path=output.umap_clusters)
            write_later(write_clustering, adata, markers, snakemake=snakemake, h5ad=processed)


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
    from omicsprep.workflow import write_embedding_figure, write_normalized

    if step == "normalize":
        write_later(write_normalized, processed, adata, counts=counts)
    elif step == "umap":
        keys = [key for key in snakemake.params.metric_keys if key in adata.obs]
        coords, obs = asnumpy(adata.obsm["X_umap"]), adata.obs[keys].copy()
        path = snakemake.output.umap_metrics
        draw_later(write_embedding_figure, coords, obs, sample=snakemake.wildcards.sample, keys=keys, path=path)


run_rule(main, snakemake)
