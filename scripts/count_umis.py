"""Rule count_umis: deduplicate the UMIs of a sample's reads (BAM/SAM or molecule table)."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    import logging

    from omicsprep import io
    from omicsprep.backend import resolve_backend
    from omicsprep.options import UmiOptions, from_config
    from omicsprep.reads import counting

    adata = counting.count_umis(
        snakemake.input.reads,
        fmt=snakemake.params.format,
        options=from_config(UmiOptions, snakemake.params.umi),
        backend=resolve_backend(snakemake.params.backend),
        threads=snakemake.threads,
    )
    logging.getLogger("omicsprep").info("%s", adata.uns["umi_dedup"])
    if "features" in set(snakemake.input.keys()):  # STARsolo's BAM: gene IDs, named from its gene table
        counting.name_genes(adata, names=io.read_solo_features(snakemake.input.features)["name"])
    io.write_table(counting.long_table(adata), snakemake.output.table)
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])


run_rule(main, snakemake)
