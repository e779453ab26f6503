"""A catalogue of hostile cases run through the workflow, each classified as a user meets it.

    python -m benchmarks faults                  # every case, 2 at a time (~6 minutes on 2 cores)
    python -m benchmarks faults --only seed_negative csv_sheet --table docs/faults.md

Each case writes its inputs (the bundled chr21 PBMCs and Multiome subset, altered) into a
work folder of its own and runs the workflow there on the CPU backend. Outcomes:

clean
    A case that must fail stops with one line naming the problem (the case's pattern); a case
    that must work runs, and its check of the results holds.
unclear
    It stops, but not with the line (a library's traceback, a misleading diagnosis); or a case
    that must work stops.
silent
    It exits 0 where it must fail, or its results are wrong without a word.
left-behind
    Temporary or partial files stay in the results after the run.
unsafe
    Something in the input was executed (its canary file exists).

The table (Markdown) goes to ``--table``; the exit status is 1 unless every case is clean.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

from omicsprep import io
from omicsprep.io.writers import TEMPORARY_INFIX
from omicsprep.testing import CHECKOUT as REPO
from omicsprep.testing import snakemake_command

DEMO = REPO / "resources" / "demo"
PBMC = DEMO / "pbmc_chr21" / "filtered_feature_bc_matrix.h5"
MULTIOME = DEMO / "multiome_pbmc"
CANARY = "canary"  # what an injected command would create in the work folder
# The chr21 matrices hold few genes per cell (as the demo's own config says).
BASE_SETTINGS = ("backend=cpu", "qc={filter: {min_genes: 10}}", "coexpression={enabled: false}")


@dataclass(frozen=True)
class Run:
    """What a case hands the workflow: the sheet, settings, a config file's text and targets."""

    sheet: str
    settings: tuple[str, ...] = ()
    config_text: str = ""
    targets: tuple[str, ...] = ("results/pbmc/processed.h5ad",)
    sheet_name: str = "samples.tsv"


@dataclass(frozen=True)
class Case:
    """A hostile case: how to build its run, and what a clean outcome is."""

    name: str
    what: str
    build: Callable[[Path], Run]
    expect: str = ""  # the one-line error (a regular expression); empty: the run must work
    check: Callable[[Path], str] | None = None  # for a run that must work: what is wrong, or ""
    cheap: bool = False  # refused before any job runs (the test suite runs these)


@dataclass
class Outcome:
    case: str
    outcome: str
    detail: str
    seconds: float = 0.0


def sheet(*rows: str, header: str = "sample\tinput") -> str:
    return "\n".join([header, *rows]) + "\n"


PBMC_SHEET = sheet(f"pbmc\t{PBMC}")


def settings_only(*settings: str, config_text: str = "") -> Callable[[Path], Run]:
    def build(work: Path) -> Run:
        return Run(PBMC_SHEET, settings=settings, config_text=config_text)

    return build


def written_h5ad(work: Path, name: str, adata: ad.AnnData) -> Path:
    path = work / f"{name}.h5ad"
    adata.write_h5ad(path)
    return path


def pbmc() -> ad.AnnData:
    return io.read_counts(PBMC)


def tiny_sample(work: Path) -> Run:
    path = written_h5ad(work, "tiny", pbmc()[:12].copy())
    return Run(
        sheet(f"pbmc\t{path}"),
        settings=("qc={min_cells_left: 10, filter: {min_genes: 10}}", "doublets={enabled: false}"),
    )


def dense_float64(work: Path) -> Run:
    counts = pbmc()
    dense = ad.AnnData(counts.X.toarray().astype(np.float64), obs=counts.obs, var=counts.var)
    path = written_h5ad(work, "dense", dense)
    return Run(
        sheet(f"pbmc\t{PBMC}", f"dense\t{path}"),
        targets=("results/pbmc/processed.h5ad", "results/dense/processed.h5ad"),
    )


def same_results_as_the_10x_file(work: Path) -> str:
    h5, dense = (ad.read_h5ad(work / "results" / name / "processed.h5ad") for name in ("pbmc", "dense"))
    changed = int((h5.obs["leiden_1.0"].astype(str) != dense.obs["leiden_1.0"].astype(str)).sum())
    moved = float(np.abs(h5.obsm["X_umap"] - dense.obsm["X_umap"]).max())
    return f"{changed} cells changed cluster, UMAP moved {moved:.3g}" if changed or moved > 0 else ""


def duplicated_barcodes(work: Path) -> Run:
    counts = pbmc()
    counts.obs_names = [*counts.obs_names[:-1], counts.obs_names[0]]
    return Run(sheet(f"pbmc\t{written_h5ad(work, 'dup', counts)}"))


def no_cells(work: Path) -> Run:
    return Run(sheet(f"pbmc\t{written_h5ad(work, 'empty', pbmc()[:0].copy())}"))


def truncated_h5(work: Path) -> Run:
    path = work / "truncated.h5"
    path.write_bytes(PBMC.read_bytes()[:20_000])
    return Run(sheet(f"pbmc\t{path}"))


def csv_sheet(work: Path) -> Run:
    return Run(f'sample,input,donor\npbmc,{PBMC},"D1, left arm"\n', sheet_name="samples.csv")


def multiome(work: Path, *, peaks: pd.DataFrame | None = None, rna_suffix: str = "-1") -> Run:
    rna = ad.read_h5ad(MULTIOME / "rna.h5ad")
    rna.obs_names = rna.obs_names.str.replace("-1", rna_suffix)
    table = peaks if peaks is not None else pd.read_csv(MULTIOME / "peaks.bed", sep="\t", header=None)
    table.to_csv(work / "peaks.bed", sep="\t", header=False, index=False)
    return Run(
        sheet(
            f"multiome\t{written_h5ad(work, 'rna', rna)}\t{MULTIOME / 'fragments.tsv.gz'}\t{work / 'peaks.bed'}",
            header="sample\tinput\tfragments\tpeaks",
        ),
        targets=("results/multiome/atac.h5ad",),
    )


def peaks_without_chr(work: Path) -> Run:
    peaks = pd.read_csv(MULTIOME / "peaks.bed", sep="\t", header=None)
    peaks[0] = peaks[0].str.removeprefix("chr")
    return multiome(work, peaks=peaks)


def two_samples(work: Path, *, shared_genes: bool) -> Run:
    counts = pbmc()
    first, second = counts[::2].copy(), counts[1::2].copy()
    if not shared_genes:
        second.var_names = "other_" + second.var_names
    paths = [written_h5ad(work, name, part) for name, part in (("first", first), ("second", second))]
    return Run(
        sheet(f"first\t{paths[0]}", f"second\t{paths[1]}"),
        settings=("merge={enabled: true}",),
        targets=("results/merged/merged.h5ad",),
    )


def log_holds(pattern: str, log: str) -> Callable[[Path], str]:
    def check(work: Path) -> str:
        text = (work / log).read_text()
        return "" if re.search(pattern, text) else f"{log} lacks {pattern!r}"

    return check


def adapted(key: str) -> Callable[[Path], str]:
    def check(work: Path) -> str:
        record = ad.read_h5ad(work / "results" / "pbmc" / "processed.h5ad").uns["omicsprep"]["cluster"]
        return "" if key in json.loads(record["adapted"]) else f"the cluster record does not say {key} was adapted"

    return check


def nothing_to_check(work: Path) -> str:
    return ""


CASES = [
    Case(
        "seed_negative",
        "seed: -5",
        settings_only("seed=-5"),
        r"config: seed: -5 is less than the minimum of 0",
        cheap=True,
    ),
    Case(
        "seed_beyond_numpy",
        "seed: 2^32",
        settings_only("seed=4294967296"),
        r"config: seed: 4294967296 is greater than the maximum",
        cheap=True,
    ),
    Case(
        "seed_text", "seed: abc", settings_only("seed=abc"), r"config: seed: 'abc' is not of type 'integer'", cheap=True
    ),
    Case(
        "n_pcs_above_n_comps",
        "neighbors.n_pcs 30 with pca.n_comps 20",
        settings_only("pca={n_comps: 20}"),
        r"config: neighbors.n_pcs 30 is more than pca.n_comps 20",
        cheap=True,
    ),
    Case(
        "markers_resolution_not_clustered",
        "markers at a resolution Leiden does not compute",
        settings_only("markers={resolution: 3.0}"),
        r"config: markers.resolution 3.0 is not among leiden.resolutions",
        cheap=True,
    ),
    Case(
        "min_cells_left_below_the_floor",
        "qc.min_cells_left: 3",
        settings_only("qc={min_cells_left: 3}"),
        r"config: qc.min_cells_left: 3 is less than the minimum of 10",
        cheap=True,
    ),
    Case(
        "yaml_python_tag",
        "a config file with a !!python tag",
        settings_only(config_text=f"seed: !!python/object/apply:os.system ['touch {CANARY}']\n"),
        r"Config file is not valid JSON or YAML",  # Snakemake's own check, before the workflow's
        cheap=True,
    ),
    Case(
        "sample_name_with_shell",
        "a sample named 'a;touch canary'",
        lambda work: Run(sheet(f"a;touch {CANARY}\t{PBMC}")),
        r"sample",
        cheap=True,
    ),
    Case(
        "missing_input",
        "the sheet names a file that is not there",
        lambda work: Run(sheet(f"pbmc\t{work / 'absent.h5'}")),
        r"absent\.h5",
        cheap=True,
    ),
    Case(
        "near_miss_column",
        "a column 'fragment'",
        lambda work: Run(sheet(f"pbmc\t{PBMC}\tx", header="sample\tinput\tfragment")),
        r"unknown column 'fragment': did you mean 'fragments'\?",
        cheap=True,
    ),
    Case(
        "repeated_sample",
        "two rows for one sample",
        lambda work: Run(sheet(f"pbmc\t{PBMC}", f"pbmc\t{PBMC}")),
        r"samples listed more than once: \['pbmc'\]",
        cheap=True,
    ),
    Case(
        "merge_of_one_sample",
        "merge on, one sample",
        settings_only("merge={enabled: true}"),
        r"merge.enabled needs two",
        cheap=True,
    ),
    Case("csv_sheet", "a comma-separated sheet with a quoted comma", csv_sheet, check=nothing_to_check),
    Case("truncated_h5", "a 10x .h5 cut short", truncated_h5, r"omicsprep error: .*truncated\.h5"),
    Case("repeated_barcodes", "an .h5ad whose barcodes repeat", duplicated_barcodes, r"omicsprep error: .*repeat"),
    Case("no_cells", "an .h5ad of 0 cells", no_cells, r"omicsprep error: .*(0 cells|no cells)"),
    Case(
        "qc_removes_every_cell",
        "qc.filter.min_genes 10000",
        settings_only("qc={filter: {min_genes: 10000}}"),
        r"omicsprep error: .*min_genes 10000 removed 1,\d+ of 1,\d+ cells",
    ),
    Case(
        "tiny_sample",
        "12 cells, min_cells_left 10, no doublet removal",
        tiny_sample,
        check=adapted("hvg.flavor"),
    ),
    Case(
        "components_beyond_the_data",
        "pca.n_comps and neighbors.n_pcs 5000",
        settings_only("pca={n_comps: 5000}", "neighbors={n_pcs: 5000}"),
        check=adapted("pca.n_comps"),
    ),
    Case(
        "singleton_clusters",
        "Leiden at resolution 1000 (clusters of one cell)",
        settings_only("leiden={resolutions: [1000.0]}", "markers={resolution: 1000.0}"),
        check=log_holds(
            r"(clusters of one cell|cluster\(s\) of two cells or more) in leiden_1000.0", "logs/cluster/pbmc.log"
        ),
    ),
    Case(
        "cell_ranger_hvg_on_sparse_genes",
        "hvg.flavor cell_ranger on genes of one chromosome",
        settings_only("hvg={flavor: cell_ranger}"),
        check=nothing_to_check,
    ),
    Case(
        "dense_float64_counts",
        "the PBMCs as dense float64 in an .h5ad",
        dense_float64,
        check=same_results_as_the_10x_file,
    ),
    Case(
        "peaks_without_chr",
        "peaks named 1, 2, ... for fragments on chr1, chr2, ...",
        peaks_without_chr,
        r"they match without the 'chr' prefix",
    ),
    Case(
        "cells_of_another_well",
        "RNA barcodes ending -2, fragments' -1",
        lambda work: multiome(work, rna_suffix="-2"),
        r"none of the [\d,]+ fragments is of one of the [\d,]+ cells.*'-<number>' suffix",
    ),
    Case(
        "merge_without_shared_genes",
        "two samples that share no gene",
        lambda work: two_samples(work, shared_genes=False),
        r"omicsprep error: .*share no gene|no gene .*shared",
    ),
]


def run_case(case: Case, work: Path) -> Outcome:
    """Build ``case`` in ``work``, run the workflow there and classify what a user meets."""
    work.mkdir(parents=True)
    run = case.build(work)
    (work / run.sheet_name).write_text(run.sheet)
    command = snakemake_command(
        "--directory", str(work), "--cores", "2", "--configfile", str(REPO / "config" / "config.yaml")
    )
    if run.config_text:
        (work / "extra.yaml").write_text(run.config_text)
        command += [str(work / "extra.yaml")]
    command += ["--config", f"samples={work / run.sheet_name}", *BASE_SETTINGS, *run.settings, "--", *run.targets]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=1800)
    outcome = classify(case, result, work)
    outcome.detail = outcome.detail.replace(str(work), "<work>").replace(str(REPO), "<repo>")
    outcome.seconds = round(time.perf_counter() - start, 1)
    return outcome


def classify(case: Case, result: subprocess.CompletedProcess, work: Path) -> Outcome:
    said = result.stdout + result.stderr
    if (work / CANARY).exists():
        return Outcome(case.name, "unsafe", f"{CANARY} was created")
    if left := leftovers(work):
        return Outcome(case.name, "left-behind", ", ".join(left[:3]))
    if case.expect:
        if result.returncode == 0:
            return Outcome(case.name, "silent", "exited 0")
        lines = [line.strip() for line in said.splitlines() if re.search(case.expect, line)]
        return Outcome(case.name, "clean", lines[0]) if lines else Outcome(case.name, "unclear", last_error(said))
    if result.returncode != 0:
        return Outcome(case.name, "unclear", last_error(said))
    problem = case.check(work) if case.check else ""
    return Outcome(case.name, "silent", problem) if problem else Outcome(case.name, "clean", "ran")


def leftovers(work: Path) -> list[str]:
    """Temporary or partial files in the results."""
    results = work / "results"
    found = [path for path in results.rglob("*") if TEMPORARY_INFIX in path.name] if results.exists() else []
    return [str(path.relative_to(work)) for path in found]


def last_error(said: str) -> str:
    errors = [line.strip() for line in said.splitlines() if re.search(r"error|Error", line)]
    return (errors or said.strip().splitlines()[-1:] or ["(nothing)"])[-1][:300]


def table(outcomes: list[Outcome]) -> str:
    """The outcomes as a Markdown table, with a count per outcome."""
    what = {case.name: case.what for case in CASES}
    rows = ["| case | what | outcome | what the user is told | s |", "|:--|:--|:--|:--|--:|"]
    for outcome in outcomes:
        detail = outcome.detail.replace("|", "\\|")
        rows.append(f"| {outcome.case} | {what[outcome.case]} | {outcome.outcome} | {detail} | {outcome.seconds} |")
    counts = pd.Series([outcome.outcome for outcome in outcomes]).value_counts()
    summary = ", ".join(f"{n} {name}" for name, n in counts.items())
    return f"{len(outcomes)} cases: {summary}\n\n" + "\n".join(rows) + "\n"


def run_cases(cases: list[Case], *, workdir: Path, parallel: int) -> list[Outcome]:
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda case: run_case(case, workdir / case.name), cases))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="+", default=None, help="cases to run, by name (all when not given)")
    parser.add_argument("--cheap", action="store_true", help="only the cases refused before any job")
    parser.add_argument("--parallel", type=int, default=2, help="cases run at once")
    parser.add_argument("--table", type=Path, default=None, help="write the Markdown table here")


def run(args: argparse.Namespace) -> int:
    cases = [c for c in CASES if (args.only is None or c.name in args.only) and (c.cheap or not args.cheap)]
    with tempfile.TemporaryDirectory(prefix="omicsprep-faults-") as workdir:
        outcomes = run_cases(cases, workdir=Path(workdir), parallel=args.parallel)
    text = table(outcomes)
    print(text)
    if args.table:
        args.table.write_text(text)
    return 0 if all(outcome.outcome == "clean" for outcome in outcomes) else 1
