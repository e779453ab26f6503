"""Rule qc: read a sample's counts, compute QC metrics, filter cells and genes, score doublets.

The QC figures of every input cell are drawn in a second process while the outputs are written.
"""

from typing import TYPE_CHECKING

from omicsprep.workflow import run_rule

if TYPE_CHECKING:
    from anndata import AnnData

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.background import background_process
    from omicsprep.workflow import quality_control, write_qc, write_qc_figures

    output = snakemake.output
    with background_process(preload="omicsprep.plotting") as draw_later:  # forked first: no GPU context yet
        backend = resolve_backend(snakemake.params.backend)
        prepare_gpu(backend, modules=("rapids_singlecell", "cuml"))  # overlaps importing the pipeline, reading
        adata, metrics = quality_control(read_counts(), snakemake=snakemake, backend=backend)
        sample = snakemake.wildcards.sample
        draw_later(write_qc_figures, metrics, sample=sample, histograms=output.histograms, scatter=output.scatter)
        write_qc(adata, metrics, snakemake=snakemake)


def read_counts() -> "AnnData":
    """The sample's counts, with its name and metadata in ``obs``."""
    from omicsprep import io

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


run_rule(main, snakemake)
