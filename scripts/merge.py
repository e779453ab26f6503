"""Rule merge: all samples concatenated, batch-corrected, clustered, with integration metrics, models and markers."""

from omicsprep.jobs import run_rule


def main() -> None:
    from omicsprep import io, plotting
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.errors import naming_file
    from omicsprep.io.figures import write_cell_types
    from omicsprep.options import ClusteringOptions, MergeOptions, from_config, parse_cluster_key
    from omicsprep.rna import clustering
    from omicsprep.rna.annotation import add_sample_cell_types, celltypist
    from omicsprep.rna.pipeline import run_merge

    backend, output = resolve_backend(snakemake.params.backend), snakemake.output
    prepare_gpu(backend)  # overlaps reading the input
    # The merge takes each sample's counts, cells and genes: its normalized matrix, embeddings
    # and graphs stay on disk (half the matrices' memory and reading). Each sample is read when
    # the merge takes it: on the GPU its counts go to the device before the next is read.
    unused = ("X", "obsm", "obsp", "varm", "uns")
    paths = dict(snakemake.input.items())
    type_tables, model_path = paths.pop("sample_cell_types"), paths.pop("model")
    samples = io.H5adSamples(paths, skip=unused)
    merged, metrics, models, scib = run_merge(
        samples,
        options=from_config(MergeOptions, snakemake.params.merge),
        clustering_options=from_config(ClusteringOptions, snakemake.params.clustering),
        labels=snakemake.params.labels,
        seed=snakemake.params.seed,
        backend=backend,
        n_gpus=max(int(snakemake.resources.gpu), 1),
    )
    if type_tables:  # each sample's own cell types (rule annotate), as obs sample_cell_type...
        tables = {sample: io.read_table(path, index=True) for sample, path in zip(paths, type_tables, strict=True)}
        add_sample_cell_types(merged, tables)
    if model_path:  # ...and the merged cells' own, voted over the merged clusters, as obs merged_cell_type...
        clusters = snakemake.params.labels if snakemake.params.majority_voting else None
        with naming_file(model_path):  # the model's genes
            model = io.read_celltypist_model(model_path)
            celltypist(merged, model=model, clusters=clusters, backend=backend, key_added="merged_cell_type")
        umap = merged.obsm["X_umap"]
        write_cell_types(
            merged.obs,
            umap,
            key="merged_cell_type",
            clusters=clusters,
            sample="merged",
            table=output.cell_types,
            figure=output.cell_types_umap,
        )
    integration = snakemake.params.merge["integration"]
    label = integration["label_key"]
    # What integration changes: the batches mixed, the labels kept apart.
    annotations = [k for k in ("sample", "batch", label, f"{label}_scanvi") if k and k in merged.obs]
    obs = merged.obs.astype(dict.fromkeys(annotations, "category"))
    keys = [*annotations, *(k for k in obs if parse_cluster_key(k))]
    io.write_figure(plotting.embedding_panels(merged.obsm["X_umap"], obs, keys=keys, title="merged"), output.umap)
    umaps = {m: merged.obsm["X_umap" if m == integration["use"] else f"X_umap_{m}"] for m in metrics["method"]}
    io.write_figure(plotting.embeddings_grid(umaps, obs, keys=annotations, title="merged"), output.methods)
    io.write_table(metrics, output.metrics)
    io.write_models(models, output.models)
    if scib is not None:
        io.write_figure(scib.plot_results_table(show=False).ax.figure, output.scib)
    markers = clustering.markers_table(merged, n_genes=snakemake.params.clustering["markers"]["n_genes"])
    io.write_table(markers, output.markers)
    io.write_h5ad(merged, output.h5ad, compression=snakemake.config["h5ad_compression"])


# Dask's GPU workers (merge.dask) are spawned processes that first re-run this file as
# it is, without the `snakemake` object Snakemake injects: only the imports may run then.
if __name__ == "__main__":
    snakemake = snakemake  # noqa: F821 - injected by Snakemake
    # Not in the GPU pool with Dask's workers, which start by running this file as their main module.
    run_rule(main, snakemake, sample="merged", pooled=False if snakemake.params.merge["dask"] else None)
