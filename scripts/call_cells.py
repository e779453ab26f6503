"""Rule call_cells: call the cells among a sample's raw droplets and remove ambient RNA from them."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io, plotting
    from omicsprep.backend import resolve_backend
    from omicsprep.cells.pipeline import run_call_cells
    from omicsprep.errors import InputError
    from omicsprep.options import CellOptions, from_config

    sample = snakemake.wildcards.sample
    inputs = snakemake.input
    duplicates = snakemake.params.duplicate_barcodes
    raw = io.read_counts(inputs.raw, fmt=snakemake.params.raw_format, duplicate_barcodes=duplicates)
    has = set(inputs.keys())
    filtered = (
        io.read_counts(inputs.filtered, fmt=snakemake.params.filtered_format, duplicate_barcodes=duplicates)
        if "filtered" in has
        else None
    )
    cellbender = io.read_cellbender(inputs.cellbender) if "cellbender" in has else None
    try:
        cells, calls = run_call_cells(
            raw,
            filtered=filtered,
            cellbender=cellbender,
            options=from_config(CellOptions, snakemake.params.cells),
            backend=resolve_backend(snakemake.params.backend),
        )
    except InputError as exc:
        raise InputError(exc.problem, path=exc.path or inputs.raw, sample=sample) from exc
    io.write_table(calls.table, snakemake.output.barcodes, index=True)
    io.write_figure(
        plotting.barcode_rank_figure(
            calls.ranks, calls.table["total"].to_numpy(), is_cell=calls.table["is_cell"].to_numpy(), title=sample
        ),
        snakemake.output.knee,
    )
    io.write_figure(
        plotting.ambient_figure(calls.ambient, cells.var_names, cells.obs.get("ambient_fraction"), title=sample),
        snakemake.output.ambient,
    )
    io.write_h5ad(cells, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])


run_rule(main, snakemake)
