"""Rule protein: antibody tags' QC, CLR or dsb, PCA, neighbours, UMAP and clusters."""

from omicsprep import io
from omicsprep.backend import resolve_backend
from omicsprep.options import EmbeddingOptions, ProteinOptions, from_config
from omicsprep.pipeline import run_protein
from omicsprep.workflow import run_script

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    backend = resolve_backend(snakemake.params.backend)
    duplicates = snakemake.params.duplicate_barcodes
    adata = io.read_counts(snakemake.input.adt, feature_type="Antibody Capture", duplicate_barcodes=duplicates)
    has_empty = "empty" in snakemake.input.keys()  # noqa: SIM118 - a Namedlist: `in` alone tests its files
    empty = (
        io.read_counts(snakemake.input.empty, feature_type="Antibody Capture", duplicate_barcodes=duplicates)
        if has_empty
        else None
    )
    run_protein(
        adata,
        empty=empty,
        options=from_config(ProteinOptions, snakemake.params.protein),
        embedding_options=from_config(EmbeddingOptions, snakemake.params.clustering),
        seed=snakemake.params.seed,
        backend=backend,
    )
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
