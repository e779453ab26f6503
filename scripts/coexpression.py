"""Rule coexpression: gene co-expression network, modules, hub genes and eigengenes."""

from omicsprep import io, plotting
from omicsprep.backend import resolve_backend
from omicsprep.pipeline import run_coexpression
from omicsprep.workflow import run_script

snakemake = snakemake  # noqa: F821, PLW0127 - injected by Snakemake


def main() -> None:
    backend = resolve_backend(snakemake.params.backend)
    adata = io.read_h5ad(snakemake.input.h5ad)
    result = run_coexpression(adata, params=snakemake.params.coexpression, seed=snakemake.params.seed,
                              backend=backend)
    figures = plotting.coexpression_figures(adata.obsm["X_umap"], result["eigengenes"],
                                            title=snakemake.wildcards.sample)
    io.write_coexpression(result, figures, paths=dict(snakemake.output.items()))


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
