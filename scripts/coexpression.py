"""Rule coexpression: gene co-expression network, modules, hub genes and eigengenes.

When configured, also the modules of each cluster's own network. A sample whose network cannot
be built (too few cells or usable genes) gets empty tables and the reason in provenance.json.
"""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    import pandas as pd

    from omicsprep import io, plotting
    from omicsprep.backend import resolve_backend
    from omicsprep.errors import InputError
    from omicsprep.network.pipeline import run_coexpression, run_coexpression_per_cluster, skipped_coexpression
    from omicsprep.options import CoexpressionOptions, from_config

    backend = resolve_backend(snakemake.params.backend)
    options, seed = from_config(CoexpressionOptions, snakemake.params.coexpression), snakemake.params.seed
    adata = io.read_h5ad(snakemake.input.h5ad)
    try:
        result = run_coexpression(adata, options=options, seed=seed, backend=backend)
    except InputError as exc:  # a documented skip: empty tables, the reason in provenance.json
        result = skipped_coexpression(adata, reason=exc.problem, options=options, seed=seed, backend=backend)
    if options.per_cluster.enabled and "skipped" not in adata.uns["coexpression"]:
        per_cluster = run_coexpression_per_cluster(
            adata, options=options, clusters=snakemake.params.clusters, seed=seed, backend=backend
        )
    else:
        per_cluster = pd.DataFrame(columns=["cluster", "gene", "module", "hub_score"])
    figures = plotting.coexpression_figures(
        adata.obsm["X_umap"], result["eigengenes"], title=snakemake.wildcards.sample
    )
    paths = dict(snakemake.output.items())
    io.write_table(per_cluster, paths.pop("per_cluster"))
    io.write_json(
        {**adata.uns["omicsprep"]["coexpression"], "summary": adata.uns["coexpression"]}, paths.pop("provenance")
    )
    io.write_coexpression(result, figures, paths=paths)


run_rule(main, snakemake)
