"""The ``omicsprep`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import get_type_hints

from omicsprep import __version__
from omicsprep.errors import BackendUnavailableError, InputError
from omicsprep.options import METHODS, CoexpressionOptions, MetacellOptions, NormalizeOptions, Options, UmiOptions

log = logging.getLogger("omicsprep")


def _options_from_arguments(options_class: type[Options], args: argparse.Namespace) -> Options:
    """``options_class`` with each field, nested options' fields too, from the argument of its name."""
    types = get_type_hints(options_class)
    return options_class(
        **{
            option.name: (
                _options_from_arguments(types[option.name], args)
                if is_dataclass(types[option.name])
                else getattr(args, option.name)
            )
            for option in fields(options_class)
        }
    )


def count_umis(args: argparse.Namespace) -> None:
    """Deduplicate UMIs of a BAM/SAM file and write the cell x gene counts."""
    from omicsprep import io
    from omicsprep.backend import resolve_backend
    from omicsprep.reads import counting

    adata = counting.count_umis(
        args.input,
        fmt=io.resolve_format(args.input),
        options=_options_from_arguments(UmiOptions, args),
        backend=resolve_backend(args.backend),
    )
    log.info(
        "%d cells x %d genes, %d molecules; %s", adata.n_obs, adata.n_vars, int(adata.X.sum()), adata.uns["umi_dedup"]
    )
    if args.tsv:
        io.write_table(counting.long_table(adata), args.tsv)
    io.write_h5ad(adata, args.output)


def coexpr(args: argparse.Namespace) -> None:
    """Build a sample's gene co-expression network and write its tables and figures."""
    import numpy as np

    from omicsprep import io, plotting
    from omicsprep.backend import resolve_backend
    from omicsprep.network.pipeline import run_coexpression
    from omicsprep.rna import preprocessing

    backend = resolve_backend(args.backend)
    adata = io.read_h5ad(args.input)
    if preprocessing.holds_counts(adata):
        target_sum = NormalizeOptions().target_sum
        log.info("X holds counts: normalizing to %s per cell and log1p", target_sum)
        preprocessing.normalize(adata, target_sum=target_sum, backend="cpu")
    if args.metacells == "knn" and "connectivities" not in adata.obsp:
        raise InputError("--metacells knn needs a neighbour graph (obsp['connectivities'])", path=args.input)
    options = CoexpressionOptions(
        n_genes=args.n_genes,
        top_k=args.top_k,
        resolution=args.resolution,
        correlation=args.correlation,
        metacells=MetacellOptions(method=args.metacells),
    )
    try:
        result = run_coexpression(adata, options=options, seed=args.seed, backend=backend)
    except InputError as exc:
        raise InputError(exc.problem, path=args.input) from exc
    if "X_umap" not in adata.obsm and "X_pca" not in adata.obsm:  # something to draw the scores on
        adata.var["highly_variable"] = adata.var.get("highly_variable", True)
        preprocessing.pca(adata, n_comps=2, seed=args.seed, backend="cpu")
    coords = adata.obsm["X_umap"] if "X_umap" in adata.obsm else np.asarray(adata.obsm["X_pca"])[:, :2]
    figures = plotting.coexpression_figures(coords, result["eigengenes"], title=args.input.stem)
    names = {key: io.COEXPRESSION_FILES[key] for key in ("edges", "modules", "eigengenes", *figures)}
    args.output.mkdir(parents=True, exist_ok=True)
    io.write_coexpression(result, figures, paths={key: args.output / name for key, name in names.items()})


# The workflow's configuration and its schema, beside the package in a checkout of the workflow.
WORKFLOW_CONFIG = Path(__file__).resolve().parents[1] / "config" / "config.yaml"
CONFIG_SCHEMA = WORKFLOW_CONFIG.parent / "schemas" / "config.schema.yaml"


def workflow_config(paths: list[Path]) -> dict:
    """The workflow's configuration with ``paths`` on top (later files win, section by section), validated.

    Raises
    ------
    InputError
        A file cannot be read, or the configuration breaks its schema (the first problem).
    """
    from jsonschema import ValidationError
    from snakemake.utils import update_config

    from omicsprep.configuration import fill_defaults, read_yaml

    config: dict = {}
    for path in [WORKFLOW_CONFIG, *paths]:
        try:
            update_config(config, read_yaml(path.read_text()) or {})
        except OSError as exc:
            raise InputError(f"cannot be read ({exc.strerror})", path=path) from exc
    try:
        fill_defaults(config, read_yaml(CONFIG_SCHEMA.read_text()))
    except ValidationError as exc:
        key = ".".join(map(str, exc.absolute_path)) or "config"
        raise InputError(f"{key}: {exc.message}", path=paths[-1] if paths else WORKFLOW_CONFIG) from exc
    return config


def warm_kernels(args: argparse.Namespace) -> None:
    """Compile the kernels of qc and cluster into this machine's caches.

    On the GPU the shipped manifest's kernels first, in a process per core; then the steps
    run on a generated sample, compiling what the manifest lacks. ``--record`` writes the
    kernel requests of the steps as a new manifest.
    """
    import contextlib
    import time

    from omicsprep.backend import cupy, resolve_backend
    from omicsprep.kernels import manifest_of, recorded_requests, shipped_kernels_compiling, write_manifest
    from omicsprep.resources import usable_cores
    from omicsprep.warmup import warm_kernels

    backend = resolve_backend(args.backend)
    if args.record and backend != "gpu":
        raise InputError("--record needs the GPU backend (it records CuPy's kernels)", path=args.record)
    start = time.perf_counter()
    with shipped_kernels_compiling(backend, processes=usable_cores()):
        pass  # compiled before the steps, which would otherwise compile the same kernels meanwhile
    with contextlib.ExitStack() as recording:
        requests = recording.enter_context(recorded_requests()) if args.record else []
        warm_kernels(workflow_config(args.configfile), backend=backend)
    if args.record:
        write_manifest(manifest_of(requests, cupy_version=cupy().__version__), args.record)
        log.info("%d kernel requests recorded in %s", len(requests), args.record)
    log.info("%s kernels of qc and cluster compiled and cached in %.1f s", backend, time.perf_counter() - start)


def command_parser() -> argparse.ArgumentParser:
    """The ``omicsprep`` command's parser: its subcommands, each option with its help and default."""
    parser = argparse.ArgumentParser(prog="omicsprep", description="omicsprep's steps outside the workflow")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    umi_defaults, network_defaults = UmiOptions(), CoexpressionOptions()
    commands = parser.add_subparsers(dest="command", required=True)
    with_defaults = argparse.ArgumentDefaultsHelpFormatter  # --help shows each default
    umis = commands.add_parser(
        "count-umis",
        help="BAM/SAM or molecule table with cell, UMI and gene -> cell x gene counts",
        formatter_class=with_defaults,
    )
    umis.add_argument("input", type=Path, help="BAM/SAM with cell, UMI and gene tags, or a molecule table")
    umis.add_argument("-o", "--output", type=Path, required=True, help="counts as .h5ad")
    umis.add_argument("--tsv", type=Path, help="also the long table gene<TAB>cell<TAB>count (as umi_tools count)")
    # Each option's dest is its field of UmiOptions (or of its bam and table options).
    bam, table = umi_defaults.bam, umi_defaults.table
    umis.add_argument("--cell-tag", default=bam.cell_tag, help="BAM tag of the corrected cell barcode")
    umis.add_argument("--umi-tag", default=bam.umi_tag, help="BAM tag of the corrected UMI")
    umis.add_argument("--gene-tag", default=bam.gene_tag, help="BAM tag of the gene the read is assigned to")
    umis.add_argument(
        "--extract-umi-method",
        dest="umi_source",
        choices=["tag", "read_id", "umis"],
        default=bam.umi_source,
        help="cell and UMI from tags, or from the read name (umi_tools extract / umis style)",
    )
    umis.add_argument(
        "--skip-tags-regex",
        dest="skip_gene_regex",
        default=umi_defaults.skip_gene_regex,
        help="skip reads whose gene matches",
    )
    umis.add_argument(
        "--method", choices=METHODS, default=umi_defaults.method, help="UMI deduplication, as umi_tools count's"
    )
    umis.add_argument(
        "--edit-distance-threshold",
        type=int,
        default=umi_defaults.edit_distance_threshold,
        help="UMIs this many mismatches apart may be merged",
    )
    umis.add_argument("--min-mapq", type=int, default=bam.min_mapq, help="reads of lower mapping quality are skipped")
    umis.add_argument(
        "--cell-column", default=table.cell_column, help="molecule tables' cell column (.parquet/.csv/.tsv[.gz])"
    )
    umis.add_argument("--umi-column", default=table.umi_column, help="molecule tables' UMI column")
    umis.add_argument("--gene-column", default=table.gene_column, help="molecule tables' gene column")
    umis.add_argument("--count-column", default=table.count_column, help="reads per row, for aggregated tables")
    umis.add_argument(
        "--chunk-rows",
        type=int,
        default=umi_defaults.chunk_rows,
        help="reads in memory at a time (bounds memory)",
    )
    umis.add_argument(
        "--backend",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="where UMIs are deduplicated; gpu without a usable GPU is an error",
    )
    umis.set_defaults(run=count_umis)
    network = commands.add_parser(
        "coexpr", help="gene co-expression network, modules and eigengenes of an .h5ad", formatter_class=with_defaults
    )
    network.add_argument("input", type=Path, help="cells x genes; log-normalized X (counts are normalized first)")
    network.add_argument("-o", "--output", type=Path, required=True, help="folder for the tables and figures")
    network.add_argument(
        "--backend", choices=["auto", "cpu", "gpu"], default="auto", help="gpu without a usable GPU is an error"
    )
    network.add_argument(
        "--n-genes", type=int, default=network_defaults.n_genes, help="most variable genes in the network"
    )
    network.add_argument("--top-k", type=int, default=network_defaults.top_k, help="partners kept per gene")
    network.add_argument(
        "--resolution", type=float, default=network_defaults.resolution, help="Leiden resolution of the modules"
    )
    network.add_argument(
        "--correlation", choices=["pearson", "spearman"], default=network_defaults.correlation, help="gene-gene measure"
    )
    network.add_argument(
        "--metacells",
        choices=["none", "knn", "kmeans"],
        default="none",  # not the workflow's knn: an .h5ad given here may have no neighbour graph
        help="pool cells first (knn needs obsp['connectivities'], kmeans obsm['X_pca'])",
    )
    network.add_argument("--seed", type=int, default=0, help="seed of Leiden and k-means")
    network.set_defaults(run=coexpr)
    warm = commands.add_parser(
        "warm-kernels",
        help="compile the kernels of qc and cluster once per machine (or shared cache folder), before the first run",
        formatter_class=with_defaults,
    )
    warm.add_argument(
        "--configfile",
        type=Path,
        nargs="*",
        default=[],
        help="the run's configuration files, over config/config.yaml: the settings whose kernels are compiled",
    )
    warm.add_argument(
        "--backend", choices=["auto", "cpu", "gpu"], default="auto", help="gpu without a usable GPU is an error"
    )
    warm.add_argument(
        "--record",
        type=Path,
        help="write the GPU steps' CuPy kernel requests here, as a manifest (omicsprep/cupy_kernels.json.gz)",
    )
    warm.set_defaults(run=warm_kernels)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the ``omicsprep`` command named in ``argv`` (the process's arguments by default)."""
    args = command_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        args.run(args)
    except (InputError, BackendUnavailableError) as exc:
        print(f"omicsprep error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
