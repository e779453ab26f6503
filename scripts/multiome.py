"""Rule multiome: modalities joined by barcode, WNN, joint UMAP and clusters."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io, plotting
    from omicsprep.backend import prepare_gpu, resolve_backend
    from omicsprep.multiome.pipeline import run_multiome
    from omicsprep.options import EmbeddingOptions, MultiomeOptions, from_config

    backend = resolve_backend(snakemake.params.backend)
    prepare_gpu(backend)  # overlaps reading the input
    modalities = {name: io.read_h5ad(path) for name, path in snakemake.input.items()}
    mdata = run_multiome(
        modalities,
        options=from_config(MultiomeOptions, snakemake.params.multiome),
        embedding_options=from_config(EmbeddingOptions, snakemake.params.clustering),
        seed=snakemake.params.seed,
        backend=backend,
    )
    keys = [key for key in mdata.obs if key.startswith("wnn_") or key.endswith(":mod_weight")]
    figure = plotting.embedding_panels(mdata.obsm["X_umap"], mdata.obs, keys=keys, title=snakemake.wildcards.sample)
    io.write_figure(figure, snakemake.output.umap)
    io.write_h5mu(mdata, snakemake.output.h5mu)


run_rule(main, snakemake)
