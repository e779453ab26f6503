"""Rule annotate: cell types of a sample's (or the merged) cells by CellTypist, majority-voted over its clusters."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from celltypist.models import Model

    from omicsprep import io
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.errors import InputError
    from omicsprep.io.figures import write_embedding_figure
    from omicsprep.rna.annotation import celltypist

    backend = resolve_backend(snakemake.params.backend)
    prepare_gpu(backend, modules=())
    adata = io.read_h5ad(snakemake.input.h5ad, skip=("X", "obsp", "varm", "uns"))
    clusters = snakemake.params.clusters if snakemake.params.majority_voting else None
    try:
        model = Model.load(snakemake.input.model)
    except Exception as error:  # CellTypist raises whatever unpickling a wrong file gives
        raise InputError(f"not a CellTypist model ({error})", path=snakemake.input.model) from error
    try:
        celltypist(adata, model=model, clusters=clusters, backend=backend)
    except InputError as error:  # the model's genes: name the model's file
        raise InputError(error.problem, path=snakemake.input.model) from error
    columns = ["cell_type", "cell_type_confidence", "cell_type_predicted"]
    io.write_table(adata.obs[columns], snakemake.output.table, index=True)
    keys = ["cell_type", *([clusters] if clusters else [])]
    sample = snakemake.wildcards.sample
    write_embedding_figure(adata.obsm["X_umap"], adata.obs, sample=sample, keys=keys, path=snakemake.output.umap)


run_rule(main, snakemake)
