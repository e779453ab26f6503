"""The ``omicsprep`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from omicsprep.errors import BackendUnavailableError, InputError
from omicsprep.umi import METHODS

log = logging.getLogger("omicsprep")


def count_umis(args: argparse.Namespace) -> None:
    """Deduplicate UMIs of a BAM/SAM file and write the cell x gene counts."""
    from omicsprep import counting, io
    from omicsprep.backend import resolve_backend
    from omicsprep.molecules import BamOptions, TableOptions

    adata = counting.count_umis(
        args.input,
        fmt=io.resolve_format(args.input),
        method=args.method,
        edit_distance_threshold=args.edit_distance_threshold,
        skip_gene_regex=args.skip_tags_regex,
        bam=BamOptions(cell_tag=args.cell_tag, umi_tag=args.umi_tag, gene_tag=args.gene_tag,
                       umi_source=args.extract_umi_method, min_mapq=args.min_mapq),
        table=TableOptions(cell_column=args.cell_column, umi_column=args.umi_column, gene_column=args.gene_column,
                           count_column=args.count_column),
        chunk_rows=args.chunk_rows,
        backend=resolve_backend(args.backend),
    )
    log.info("%d cells x %d genes, %d molecules; %s", adata.n_obs, adata.n_vars, int(adata.X.sum()),
             adata.uns["umi_dedup"])
    if args.tsv:
        io.write_table(counting.long_table(adata), args.tsv)
    io.write_h5ad(adata, args.output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="omicsprep")
    commands = parser.add_subparsers(dest="command", required=True)
    umis = commands.add_parser(
        "count-umis", help="BAM/SAM or molecule table with cell, UMI and gene -> cell x gene counts"
    )
    umis.add_argument("input", type=Path)
    umis.add_argument("-o", "--output", type=Path, required=True, help="counts as .h5ad")
    umis.add_argument("--tsv", type=Path, help="also the long table gene<TAB>cell<TAB>count (as umi_tools count)")
    umis.add_argument("--cell-tag", default="CB")
    umis.add_argument("--umi-tag", default="UB")
    umis.add_argument("--gene-tag", default="GX")
    umis.add_argument("--extract-umi-method", choices=["tag", "read_id", "umis"], default="tag",
                      help="cell and UMI from tags, or from the read name (umi_tools extract / umis style)")
    umis.add_argument("--skip-tags-regex", default="^(__|Unassigned)", help="skip reads whose gene matches")
    umis.add_argument("--method", choices=METHODS, default="directional")
    umis.add_argument("--edit-distance-threshold", type=int, default=1)
    umis.add_argument("--min-mapq", type=int, default=0)
    umis.add_argument("--cell-column", default="cell", help="molecule tables (.parquet/.csv/.tsv[.gz])")
    umis.add_argument("--umi-column", default="umi")
    umis.add_argument("--gene-column", default="gene")
    umis.add_argument("--count-column", default=None, help="reads per row, for aggregated tables")
    umis.add_argument("--chunk-rows", type=int, default=5_000_000, help="reads in memory at a time (bounds memory)")
    umis.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto",
                      help="where UMIs are deduplicated; gpu without a usable GPU is an error")
    umis.set_defaults(run=count_umis)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        args.run(args)
    except (InputError, BackendUnavailableError) as exc:
        print(f"omicsprep error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
