"""Rule annotate: cell types of a sample's cells by CellTypist, majority-voted over its clusters."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.errors import naming_file
    from omicsprep.io.figures import write_cell_types
    from omicsprep.rna.annotation import celltypist

    backend = resolve_backend(snakemake.params.backend)
    prepare_gpu(backend, modules=())
    adata = io.read_h5ad(snakemake.input.h5ad, skip=("X", "obsp", "varm", "uns"))
    clusters = snakemake.params.clusters if snakemake.params.majority_voting else None
    model = io.read_celltypist_model(snakemake.input.model)
    with naming_file(snakemake.input.model):  # the model's genes
        celltypist(adata, model=model, clusters=clusters, backend=backend)
    output, sample = snakemake.output, snakemake.wildcards.sample
    write_cell_types(
        adata.obs,
        adata.obsm["X_umap"],
        key="cell_type",
        clusters=clusters,
        sample=sample,
        table=output.table,
        figure=output.umap,
    )


run_rule(main, snakemake)
