"""Rule qc: read a sample's counts, compute QC metrics, filter cells and genes, score doublets.

The QC figures of every input cell are drawn in a second process while the outputs are written.
"""

from typing import TYPE_CHECKING

from omicsprep.jobs import run_rule

if TYPE_CHECKING:
    import pandas as pd
    from anndata import AnnData

    from omicsprep.backend import Backend

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.background import background_process
    from omicsprep.io.figures import write_qc_figures

    output = snakemake.output
    with background_process(preload="omicsprep.plotting") as draw_later:  # forked first: no GPU context yet
        backend = resolve_backend(snakemake.params.backend)
        prepare_gpu(backend, modules=("rapids_singlecell", "cuml"))  # overlaps importing the pipeline, reading
        adata, metrics = quality_control(read_counts(), backend=backend)
        sample = snakemake.wildcards.sample
        draw_later(write_qc_figures, metrics, sample=sample, histograms=output.histograms, scatter=output.scatter)
        write_qc(adata, metrics)


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


def quality_control(adata: "AnnData", *, backend: "Backend") -> "tuple[AnnData, pd.DataFrame]":
    """:func:`omicsprep.rna.pipeline.run_qc` with the rule's settings (the pipeline imported here, timed).

    Too few cells left: every input cell's metrics are written beside the rule's log first
    (Snakemake removes a failed job's outputs), and the error names that file.
    """
    from pathlib import Path

    from omicsprep import io
    from omicsprep.errors import TooFewCellsError
    from omicsprep.jobs import import_timed
    from omicsprep.options import DoubletOptions, QcOptions, from_config

    try:
        return import_timed("omicsprep.rna.pipeline").run_qc(
            adata,
            options=from_config(QcOptions, snakemake.params.qc),
            doublet_options=from_config(DoubletOptions, snakemake.params.doublets),
            seed=snakemake.params.seed,
            backend=backend,
        )
    except TooFewCellsError as exc:
        beside_log = Path(snakemake.log[0]).with_suffix(".cell_metrics.parquet")
        io.write_table(exc.metrics, beside_log, index=True)
        raise TooFewCellsError(f"{exc.problem} (each cell's metrics and fail reason: {beside_log})") from None


def write_qc(adata: "AnnData", metrics: "pd.DataFrame") -> None:
    """The cells that passed (brought to host memory first) and every input cell's metrics."""
    from omicsprep import io
    from omicsprep.backend import to_host

    to_host(adata)
    io.write_table(metrics, snakemake.output.metrics, index=True)
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"], keep_matrix=True)


run_rule(main, snakemake)
