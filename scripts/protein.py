"""Rule protein: antibody tags' QC, CLR or dsb, PCA, neighbours, UMAP and clusters."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.cells.calling import called_cells
    from omicsprep.options import EmbeddingOptions, ProteinOptions, from_config
    from omicsprep.protein.normalization import background_droplets
    from omicsprep.protein.pipeline import run_protein

    backend = resolve_backend(snakemake.params.backend)
    prepare_gpu(backend)  # overlaps reading the input
    duplicates = snakemake.params.duplicate_barcodes
    adata = io.read_counts(snakemake.input.adt, feature_type="Antibody Capture", duplicate_barcodes=duplicates)
    options = from_config(ProteinOptions, snakemake.params.protein)
    inputs = set(snakemake.input.keys())
    is_cell = io.read_table(snakemake.input.calls)["is_cell"] if "calls" in inputs else None
    if is_cell is not None:
        adata = called_cells(adata, is_cell=is_cell)
    empty = None
    if "empty" in inputs:
        empty = io.read_counts(snakemake.input.empty, feature_type="Antibody Capture", duplicate_barcodes=duplicates)
    elif "raw" in inputs and io.has_feature_type(snakemake.input.raw, "Antibody Capture"):
        raw_tags = io.read_counts(snakemake.input.raw, feature_type="Antibody Capture", duplicate_barcodes=duplicates)
        empty = background_droplets(raw_tags, is_cell=is_cell, log10_library=options.dsb.background_log10_library)
    run_protein(
        adata,
        empty=empty,
        options=options,
        embedding_options=from_config(EmbeddingOptions, snakemake.params.clustering),
        seed=snakemake.params.seed,
        backend=backend,
    )
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])


run_rule(main, snakemake)
