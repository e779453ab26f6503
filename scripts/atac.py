"""Rule atac: fragments counted into peaks or tiles for the QC'd cells.

Then TF-IDF, LSI, neighbours, UMAP and clusters.
"""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.atac.fragments import count_fragments
    from omicsprep.atac.pipeline import run_atac
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.options import AtacOptions, EmbeddingOptions, from_config

    backend = resolve_backend(snakemake.params.backend)
    prepare_gpu(backend)  # overlaps reading the input
    options = from_config(AtacOptions, snakemake.params.atac)
    cells = io.read_h5ad_elements(snakemake.input.cells, ["obs"])["obs"].index
    given = snakemake.input.keys()
    peaks = io.read_peaks(snakemake.input.peaks) if "peaks" in given else None
    tss = io.read_tss(snakemake.input.genes) if "genes" in given else None
    chrom_sizes = io.read_chrom_sizes(snakemake.input.chrom_sizes) if "chrom_sizes" in given else None
    chunks = io.fragment_chunks(snakemake.input.fragments, chunk_rows=options.chunk_rows, backend=backend)
    adata = count_fragments(
        chunks,
        barcodes=cells,
        peaks=peaks,
        tile_width=options.tile_width,
        chrom_sizes=chrom_sizes,
        tss=tss,
        source=snakemake.input.fragments,
        backend=backend,
    )
    run_atac(
        adata,
        options=options,
        embedding_options=from_config(EmbeddingOptions, snakemake.params.clustering),
        seed=snakemake.params.seed,
        backend=backend,
    )
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])


run_rule(main, snakemake)
