"""The ``omicsprep`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from omicsprep.errors import InputError

log = logging.getLogger("omicsprep")


def count_umis(args: argparse.Namespace) -> None:
    """Deduplicate UMIs of a BAM/SAM file and write the cell x gene counts."""
    import pandas as pd
    from anndata import AnnData
    from scipy import sparse

    from omicsprep import io
    from omicsprep.molecules import read_bam
    from omicsprep.umi import collapse_reads, count_molecules

    table = read_bam(
        args.input, cell_tag=args.cell_tag, umi_tag=args.umi_tag, gene_tag=args.gene_tag,
        umi_source=args.extract_umi_method, min_mapq=args.min_mapq, skip_gene_regex=args.skip_tags_regex,
    )
    counts = count_molecules(collapse_reads(table.reads), method=args.method, threshold=args.edit_distance_threshold)
    matrix = sparse.csr_matrix(
        (counts["count"].to_numpy(), (counts["cell"].to_numpy(), counts["gene"].to_numpy())),
        shape=(len(table.cells), len(table.genes)),
    )
    adata = AnnData(matrix.astype("float32"), obs=pd.DataFrame(index=table.cells.astype(str)),
                    var=pd.DataFrame(index=table.genes.astype(str)))
    adata.uns["umi_dedup"] = {"method": args.method, "reads": len(table.reads), "skipped": dict(table.skipped)}
    log.info("%d reads, %d molecules; skipped %s", len(table.reads), int(counts["count"].sum()), dict(table.skipped))
    if args.tsv:
        long = pd.DataFrame({"gene": table.genes[counts["gene"]], "cell": table.cells[counts["cell"]],
                             "count": counts["count"].to_numpy()}).sort_values(["gene", "cell"])
        io.write_table(long, args.tsv)
    io.write_h5ad(adata, args.output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="omicsprep")
    commands = parser.add_subparsers(dest="command", required=True)
    umis = commands.add_parser("count-umis", help="BAM/SAM with cell, UMI and gene tags -> cell x gene counts")
    umis.add_argument("input", type=Path)
    umis.add_argument("-o", "--output", type=Path, required=True, help="counts as .h5ad")
    umis.add_argument("--tsv", type=Path, help="also the long table gene<TAB>cell<TAB>count (as umi_tools count)")
    umis.add_argument("--cell-tag", default="CB")
    umis.add_argument("--umi-tag", default="UB")
    umis.add_argument("--gene-tag", default="GX")
    umis.add_argument("--extract-umi-method", choices=["tag", "read_id", "umis"], default="tag",
                      help="cell and UMI from tags, or from the read name (umi_tools extract / umis style)")
    umis.add_argument("--skip-tags-regex", default="^(__|Unassigned)", help="skip reads whose gene matches")
    umis.add_argument("--method", choices=["unique", "percentile", "cluster", "adjacency", "directional"],
                      default="directional")
    umis.add_argument("--edit-distance-threshold", type=int, default=1)
    umis.add_argument("--min-mapq", type=int, default=0)
    # Only the Numba CPU kernels exist so far; the CUDA ones will add "gpu" here.
    umis.add_argument("--backend", choices=["auto", "cpu"], default="auto")
    umis.set_defaults(run=count_umis)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        args.run(args)
    except InputError as exc:
        print(f"omicsprep error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
