"""Mutation testing of the science modules with mutmut (``make mutate``, one module at a time).

mutmut mutates every function of a module (not Numba's kernels: it leaves decorated functions
alone) in a scratch copy of the work tree, and runs against each mutant the tests of that
module (``COVERING_TESTS``) that reach the mutated function. A mutant that no test kills is a
test to write, or an equivalent mutant (one that behaves as the original) explained in
``tests/mutation/equivalent.toml``. Each module's outcome is kept in
``tests/mutation/results/<module>.tsv.gz`` (gzipped: a row per mutant, the work tree travels to the
GPU machine); ``docs/mutation.md`` is written from all of them. A run in progress keeps its
verdicts so far in ``tests/mutation/results/<module>.partial.json.gz`` every few minutes, so that
``--resume`` continues it on another machine once that file is committed (a module takes longer
than a working session: cells, 1-1.5 mutants a minute on two cores).

A target is a package, but for ``atlas`` and ``scib``: the scVI and CellTypist files of ``rna``,
and its scIB metrics (``FILES_OF``), which ``rna``'s target leaves out. Not in CI: a target takes minutes to hours on
two cores.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from omicsprep.io import atomic_path
from omicsprep.testing import CHECKOUT as ROOT
from omicsprep.testing.reference_runs import CACHE_VARIABLE

HERE = ROOT / "tests" / "mutation"
RESULTS = HERE / "results"
EQUIVALENT = HERE / "equivalent.toml"
REPORT = ROOT / "docs" / "mutation.md"

# The unit tests that call each module in this process. Tests that run Snakemake (test_workflow,
# test_faults, test_slurm) run the package in other processes, where mutants are not switched on.
COVERING_TESTS = {
    "rna": ["test_qc.py", "test_clustering.py", "test_integration.py", "test_schema_boundaries.py"],
    "cells": [
        "test_cells.py",
        "test_emptydrops.py",
        "test_barcode_ranks.py",
        "test_soupx.py",
        "test_decontx.py",
        "test_cellbender.py",
    ],
    "reads": ["test_umi.py", "test_bam_reader.py", "test_text_reader.py", "test_star.py", "test_jit_cache.py"],
    "protein": ["test_protein.py", "test_cells.py"],
    "atac": ["test_atac.py", "test_multiome.py"],
    "multiome": ["test_multiome.py"],
    "network": ["test_coexpression.py", "test_clustering.py"],
    "atlas": ["test_atlas.py"],
    "scib": ["test_scib.py"],
}

# Targets that mutate some files of another's package: the atlas steps (scVI, CellTypist) and scIB's
# metrics are rna's files whose covering files take minutes a run (test_atlas.py trains scVI and
# scANVI) or one and a half (test_scib.py). Kept in rna's target, every mutant of a function they
# reach (most of rna) would run them whole; scIB's apart from the atlas, its mutants run
# test_scib.py alone, on a merge without scVI.
PACKAGE_OF = {"atlas": "rna", "scib": "rna"}
FILES_OF = {
    "atlas": [f"omicsprep/rna/{name}.py" for name in ("latent", "resident_batches", "epoch_logging", "annotation")],
    "scib": ["omicsprep/rna/integration_scores.py"],
}


def gpu_launchers(package: str) -> list[str]:
    """The package's modules that launch its CUDA kernels (``*_cuda.py``), left out of every target.

    No CPU test can call them (each needs a GPU); the GPU suite's CPU-GPU parity tests cover
    them. Mutated, each of their mutants would count as 'not reached'.
    """
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "omicsprep" / package).glob("*_cuda.py"))


# mutmut's status -> the report's column. A timeout (a mutant that loops) counts as killed, and so
# does a segfault: the tests' process crashed on the mutant, a failure CI would show.
COLUMNS = {
    "killed": "killed",
    "timeout": "killed",
    "segfault": "killed",
    "survived": "survived",
    "no tests": "not reached",
    "suspicious": "unclear",
    "not checked": "unclear",
}


# mutmut's workers are forked from its main process; a test run that passes there ended with
# SIGTERM (-15, "suspicious") rather than 0, hiding survivors. Where it comes from was not
# found; a worker that blocks SIGTERM reports 0 as a plain pytest run of the mutant does.
def widen_to_test_files(tests_by_function: dict[str, set[str]], all_tests: Iterable[str]) -> None:
    """Add to each function's tests every test of the files whose tests reach it, in place.

    mutmut maps a function to the tests during which it ran. A module-scoped fixture is built
    during the first test that asks for it, so the functions it calls were mapped to that test
    alone, while the file's other tests check what it built (``test_atac.py``'s ``peak_counts``:
    a wrong QC metric in it "survived" though ``test_qc_metrics`` fails on it).
    """
    by_file: dict[str, set[str]] = {}
    for test in all_tests:
        by_file.setdefault(test.partition("::")[0], set()).add(test)
    for reached in tests_by_function.values():
        for path in {test.partition("::")[0] for test in reached}:
            reached |= by_file.get(path, set())


def fastest_first(
    tests_by_function: dict[str, Any], duration_by_test: dict[str, float], reached: dict[str, set[str]]
) -> None:
    """Each function's tests as a list, in place: fastest file first; in a file, the tests that ran the function first.

    mutmut stops a mutant's run at its first failing test (``-x``), and pytest runs the tests in
    the order mutmut lists them, a set's (any): a mutant that a quick test kills could first sit
    through the file's slowest tests (16 s in ``test_cells.py``). A file's tests stay together,
    so its module-scoped fixtures are built once. Within a file, the tests that ran the function
    (``reached``, mutmut's map before :func:`widen_to_test_files`), fastest first, go before the
    others, which can only fail through what a fixture built: in cells, 2.9 s less before the
    killing test of an average mutant than fastest first alone.
    """
    file_seconds: dict[str, float] = {}
    for test, seconds in duration_by_test.items():
        path = test.partition("::")[0]
        file_seconds[path] = file_seconds.get(path, 0.0) + seconds

    for function, tests in tests_by_function.items():
        ran = reached.get(function, set())

        def order(test: str, ran: set[str] = ran) -> tuple[float, str, bool, float, str]:
            path = test.partition("::")[0]
            return file_seconds.get(path, 0.0), path, test not in ran, duration_by_test.get(test, 0.0), test

        tests_by_function[function] = sorted(tests, key=order)


# mutmut's command line, with three changes: a worker blocks SIGTERM while it switches its mutant
# on, each function's tests are all the tests of their files (widen_to_test_files), and they run
# fastest first, those that ran the function first (fastest_first).
LAUNCHER = f"""
import signal
from collections.abc import Iterable
from typing import Any

import mutmut.__main__ as mutmut_main
from mutmut.state import state
from mutmut.workers import isolation

switch_on = isolation.set_mutant_under_test
collect_or_load_stats = mutmut_main.collect_or_load_stats


def shielded(mutant_name):
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
    switch_on(mutant_name)


{inspect.getsource(widen_to_test_files)}

{inspect.getsource(fastest_first)}

def collect_and_widen(*args, **kwargs):
    collect_or_load_stats(*args, **kwargs)
    reached = {{function: set(tests) for function, tests in state().tests_by_mangled_function_name.items()}}
    widen_to_test_files(state().tests_by_mangled_function_name, state().duration_by_test)
    fastest_first(state().tests_by_mangled_function_name, state().duration_by_test, reached)


isolation.set_mutant_under_test = shielded
mutmut_main.collect_or_load_stats = collect_and_widen
mutmut_main.cli()
"""


def scratch_copy(module: str, workdir: Path, *, resume: bool) -> Path:
    """The work tree's files (tracked and not ignored) in a folder of their own, set up for mutmut.

    With ``resume``, mutmut's ``mutants/`` of an earlier run stays: mutmut keeps the verdicts of
    the functions whose code is unchanged (see ``retest_undecided``).
    """
    target = workdir / module
    if not resume:
        shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True, exist_ok=True)
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name.decode())
    tests = ", ".join(f'"tests/{name}"' for name in COVERING_TESTS[module])
    package = PACKAGE_OF.get(module, module)
    others = [
        file for other, files in FILES_OF.items() if other != module and PACKAGE_OF[other] == package for file in files
    ]
    others += gpu_launchers(package)
    settings = [
        f'source_paths = ["omicsprep/{package}/"]',
        *([f"only_mutate = {json.dumps(FILES_OF[module])}"] if module in FILES_OF else []),
        *([f"do_not_mutate = {json.dumps(others)}"] if others else []),
        'also_copy = ["omicsprep/", "tests/", "resources/", "benchmarks/", "config/", "rules/", "scripts/"]',
        f"pytest_add_cli_args_test_selection = [{tests}]",
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        # Workers forked from a server that has only collected the tests: forked from mutmut's
        # main process, which ran them, they inherit its used OpenMP pool ("fork() called from a
        # process already using GNU OpenMP") and compute garbage, so every mutant looks killed.
        'process_isolation = "forkserver"',
        # A mutant's CPU time limit is (its tests' time + 1 s) x this x 2: at mutmut's 15, a mutant that
        # loops ran 12 minutes and more (7 of cells' first 2,254 mutants timed out); at 3 a mutant must
        # still slow its tests sixfold to be stopped (and counted killed).
        "timeout_multiplier = 3.0",
    ]
    with (target / "pyproject.toml").open("a") as config:
        config.write("\n[tool.mutmut]\n" + "".join(f"{line}\n" for line in settings))
    return target


# Exit codes in mutmut's verdicts that are kills (a failing test, pytest's internal error, a timeout, a segfault).
KILLING_EXIT_CODES = {1, 3, 36, -24, 24, 152, 255, -11}
NO_TESTS = 33


def retest_undecided(folder: Path, *, explained: Iterable[str] = ()) -> int:
    """Forget the verdicts that are not kills (but the ``explained`` survivors'), and the map of tests to functions.

    So that the current tests judge those mutants: a kill stays a kill as tests are added; a
    survivor may not, unless it is explained as equivalent (no test can kill it; a minute or
    more each to run every test again). mutmut itself forgets the verdicts of functions whose
    code changed. Its map of tests to functions it only extends with new tests, so functions
    moved or added since are left with none ("no tests"): the map is collected again (one
    traced run of the module's tests). Returns how many verdicts were forgotten.
    """
    explained = set(explained)
    (folder / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    forgotten = 0
    for meta_path in (folder / "mutants").rglob("*.py.meta"):
        meta = json.loads(meta_path.read_text())
        verdicts = meta["exit_code_by_key"]
        for name, exit_code in verdicts.items():
            if exit_code is not None and exit_code not in KILLING_EXIT_CODES and name not in explained:
                verdicts[name] = None
                forgotten += 1
        write_text(meta_path, json.dumps(meta, indent=4))
    return forgotten


def mutmut_command(folder: Path, *arguments: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run mutmut (with :data:`LAUNCHER`'s changes) in ``folder``."""
    # One BLAS/OpenMP/Numba thread per forked worker: pools started before a fork do not survive it.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    # R's outputs for the same inputs kept between mutants (omicsprep.testing.reference_runs).
    env.setdefault(CACHE_VARIABLE, str(folder.parent / "reference-cache"))
    return [sys.executable, "-c", LAUNCHER, *arguments], env


def mutmut(folder: Path, *arguments: str) -> str:
    command, env = mutmut_command(folder, *arguments)
    return subprocess.run(command, cwd=folder, env=env, check=True, capture_output=True, text=True).stdout


CHECKPOINT_SECONDS = 300
# What a checkpoint keeps of each of mutmut's .meta files; the rest (durations) mutmut refills.
CHECKPOINTED_KEYS = ("exit_code_by_key", "hash_by_function_name")


def run_with_checkpoints(folder: Path, module: str, *, children: int, tree: str) -> None:
    """``mutmut run`` in ``folder``, its verdicts so far saved to the module's checkpoint every few minutes."""
    command, env = mutmut_command(folder, "run", "--max-children", str(children))
    with subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.DEVNULL) as process:
        while True:
            try:
                process.wait(timeout=CHECKPOINT_SECONDS)
                break
            except subprocess.TimeoutExpired:
                save_checkpoint(folder, module, tree=tree)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, "mutmut run")


def checkpoint_path(module: str) -> Path:
    return RESULTS / f"{module}.partial.json.gz"


def read_checkpoint(module: str) -> dict[str, Any]:
    path = checkpoint_path(module)
    return json.loads(gzip.decompress(path.read_bytes())) if path.exists() else {"metas": {}}


def save_checkpoint(folder: Path, module: str, *, tree: str) -> None:
    """mutmut's verdicts so far, with the hashes of the functions they judge, into the module's checkpoint.

    A .meta file mutmut is writing at that moment (it rewrites one after each mutant) keeps
    the previous checkpoint's copy.
    """
    checkpoint = read_checkpoint(module)
    for meta_path in sorted((folder / "mutants").rglob("*.py.meta")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        relative = str(meta_path.relative_to(folder / "mutants"))
        checkpoint["metas"][relative] = {key: meta[key] for key in CHECKPOINTED_KEYS}
    checkpoint.update(saved=f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", tree=tree)
    text = json.dumps(checkpoint, sort_keys=True, separators=(",", ":"))
    with atomic_path(checkpoint_path(module), timed=False) as temporary:
        temporary.write_bytes(gzip.compress(text.encode(), mtime=0))


def restore_checkpoint(folder: Path, module: str) -> None:
    """Seed ``folder``'s ``mutants/`` with the checkpoint's verdicts.

    mutmut then writes the mutants again and keeps the verdicts of the functions whose hash is
    unchanged (``create_mutants_for_file``), as after an interrupted run on this machine.
    """
    for relative, kept in read_checkpoint(module)["metas"].items():
        meta = {**kept, "type_check_error_by_key": {}, "durations_by_key": {}, "estimated_durations_by_key": {}}
        meta_path = folder / "mutants" / relative
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        write_text(meta_path, json.dumps(meta, indent=4))


def statuses(folder: Path) -> dict[str, str]:
    """Each mutant's status, from ``mutmut results --all true`` (lines ``name: status``)."""
    found = {}
    for line in mutmut(folder, "results", "--all", "true").splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name.startswith("omicsprep."):
            found[name] = status
    return found


def diff(folder: Path, name: str) -> str:
    shown = mutmut(folder, "show", name).splitlines()
    return "\n".join(line for line in shown if line.startswith(("-", "+")) and not line.startswith(("---", "+++")))


def write_text(path: Path, text: str) -> None:
    with atomic_path(path, timed=False) as temporary:
        temporary.write_text(text)


def run_module(module: str, *, workdir: Path, children: int, tree: str, resume: bool) -> None:
    started = datetime.now(UTC)
    here = (workdir / module / "mutants").is_dir()
    resume = resume and (here or checkpoint_path(module).exists())
    folder = scratch_copy(module, workdir, resume=resume)
    print(f"{module}: mutating in {folder}", flush=True)
    if resume and not here:
        print(f"{module}: continuing from {checkpoint_path(module)}", flush=True)
        restore_checkpoint(folder, module)
    if resume:
        explained = tomllib.loads(EQUIVALENT.read_text()).get(module, {}) if EQUIVALENT.exists() else {}
        forgotten = retest_undecided(folder, explained=explained)
        print(f"{module}: continuing the run there; {forgotten} survivors to test again", flush=True)
    else:
        checkpoint_path(module).unlink(missing_ok=True)
    run_with_checkpoints(folder, module, children=children, tree=tree)
    found = statuses(folder)
    rows = ["mutant\tstatus\tdiff"]
    for name, status in sorted(found.items(), key=lambda item: mutant_order(item[0])):
        change = diff(folder, name).replace("\t", " ").replace("\n", " ⏎ ") if status != "killed" else ""
        rows.append(f"{name}\t{status}\t{change}")
    with atomic_path(RESULTS / f"{module}.tsv.gz", timed=False) as temporary:
        temporary.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode(), mtime=0))
    minutes = (datetime.now(UTC) - started).total_seconds() / 60
    took = f"{minutes:.0f} min" + (" (continued)" if resume else "")
    write_text(
        RESULTS / f"{module}.run",
        f"{started:%Y-%m-%d}, tree {tree}, {took}, {children} workers on {os.cpu_count()} cores "
        f"({platform.machine()}), mutmut {version('mutmut')}\n",
    )
    checkpoint_path(module).unlink(missing_ok=True)
    print(f"{module}: {len(found)} mutants, results in {RESULTS / f'{module}.tsv.gz'}", flush=True)


def mutant_order(name: str) -> tuple[str, int]:
    function, _, number = name.rpartition("__mutmut_")
    return function, int(number)


def read_results(module: str) -> dict[str, tuple[str, str]]:
    lines = gzip.decompress((RESULTS / f"{module}.tsv.gz").read_bytes()).decode().splitlines()[1:]
    return {name: (status, change) for name, status, change in (line.split("\t") for line in lines)}


def progress_row(module: str) -> str:
    """The report's row of a module whose run is in progress: the verdicts of its checkpoint."""
    checkpoint = read_checkpoint(module)
    verdicts = [code for meta in checkpoint["metas"].values() for code in meta["exit_code_by_key"].values()]
    killed = sum(code in KILLING_EXIT_CODES for code in verdicts)
    untested, survived, unreached = (verdicts.count(code) for code in (None, 0, NO_TESTS))
    unclear = len(verdicts) - killed - untested - survived - unreached
    progress = f"in progress: {untested} not yet tested (checkpoint {checkpoint['saved']}, tree {checkpoint['tree']})"
    return f"| {module} | {len(verdicts)} | {killed} | {survived} | {unreached} | {unclear} | | | - | {progress} |"


def write_report() -> None:
    equivalent = tomllib.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    lines = [
        "# Mutation testing",
        "",
        "Written by `python tests/mutation/mutate.py --report-only` from `tests/mutation/results/` and",
        "`tests/mutation/equivalent.toml`; a module is (re)run by `make mutate MODULE=<module>` (an interrupted",
        "run is continued by `mutate.py --resume <module>`, on another machine too once its checkpoint",
        "`results/<module>.partial.json.gz` is committed: kills of unchanged functions are kept, and their",
        "survivors explained in `equivalent.toml`). mutmut",
        "mutates each function of the module (the atlas and scib modules: rna's scVI and CellTypist files",
        "and its scIB metrics, `FILES_OF`, which rna's run leaves out; Numba's kernels, being decorated, are",
        "not mutated, nor are",
        "the modules that launch CUDA kernels, `*_cuda.py`: the parity tests of the CPU and CUDA kernels",
        "cover them) and runs every test of the module's test files",
        "(`COVERING_TESTS` in `tests/mutation/mutate.py`) that reach it, each file whole (a module-scoped",
        "fixture runs in its first test only; before 2026-12-06, d4ebe19, only the reaching tests ran, which",
        "left some of atac's mutants 'survived'), fastest file and fastest test first, up to the first that",
        "fails. *Killed* counts timeouts and segfaults; *not reached*: no",
        "covering test calls the function; *equivalent*: a survivor that behaves as the original, with its",
        "reason in `equivalent.toml`; *GPU only*: a survivor that changes only what the GPU backend does (a backend or",
        "array module not passed on, which the CPU backend does not read), which the CPU tests cannot see",
        "and the GPU suite's CPU-GPU comparisons would see only as the CPU's results (its reason begins",
        "`GPU only` in `equivalent.toml`). The share is killed over all mutants less the equivalent and",
        "GPU-only ones.",
        "",
        "| module | mutants | killed | survived | not reached | unclear | equivalent | GPU only | killed share | run |",
        "|:--|--:|--:|--:|--:|--:|--:|--:|--:|:--|",
    ]
    sections = []
    for module in COVERING_TESTS:
        if not (RESULTS / f"{module}.tsv.gz").exists():
            not_run = f"| {module} | not run | | | | | | | | |"
            lines.append(progress_row(module) if checkpoint_path(module).exists() else not_run)
            continue
        found = read_results(module)
        explained = equivalent.get(module, {})
        counts = dict.fromkeys(("killed", "survived", "not reached", "unclear"), 0)
        open_ones: dict[str, list[str]] = {}  # function -> its mutants' numbers
        equal_ones: dict[str, list[str]] = {}
        gpu_ones: dict[str, list[str]] = {}
        for name, (status, _) in found.items():
            if status in ("survived", "no tests") and name in explained:
                function, number = mutant_order(name)
                gpu_only = explained[name].startswith("GPU only")
                (gpu_ones if gpu_only else equal_ones).setdefault(function, []).append(str(number))
                continue
            counts[COLUMNS[status]] += 1
            if COLUMNS[status] != "killed":
                function, number = mutant_order(name)
                shown = str(number) if status == "survived" else f"{number} ({status})"
                open_ones.setdefault(function, []).append(shown)
        stale = sorted(set(explained) - {name for name, (status, _) in found.items() if status != "killed"})
        n_equal, n_gpu = (sum(map(len, ones.values())) for ones in (equal_ones, gpu_ones))
        judged = len(found) - n_equal - n_gpu
        share = f"{100 * counts['killed'] / judged:.1f}%" if judged else "-"
        run = (RESULTS / f"{module}.run").read_text().strip()
        lines.append(
            f"| {module} | {len(found)} | {counts['killed']} | {counts['survived']} | {counts['not reached']} "
            f"| {counts['unclear']} | {n_equal} | {n_gpu} | {share} | {run} |"
        )
        # Without their changes, which would double this page (the results file has them), and the
        # reasons, which equivalent.toml holds.
        changes = f"`zcat tests/mutation/results/{module}.tsv.gz | grep <function>__mutmut_<number>`"
        reasons = f"`tests/mutation/equivalent.toml`, table `[{module}]`"
        sections += [f"\n## {module}\n", f"Each mutant's change: {changes}; each explained one's reason: {reasons}.\n"]
        for title, ones in (("Not killed", open_ones), ("Equivalent", equal_ones), ("GPU only", gpu_ones)):
            listed = [f"- `{function}`: {', '.join(numbers)}" for function, numbers in ones.items()]
            sections += [f"{title}, by function:\n", *(listed or ["- none"]), ""]
        if stale:
            sections += ["\nExplained in equivalent.toml but killed or gone (remove them):\n"]
            sections += [f"- `{name}`" for name in stale]
    write_text(REPORT, "\n".join(lines + sections) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"any of {', '.join(COVERING_TESTS)} (default: all)")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-mutate"))
    parser.add_argument("--report-only", action="store_true", help="rewrite docs/mutation.md from the results")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --workdir: unchanged functions keep their kills; the rest is tested",
    )
    arguments = parser.parse_args()
    unknown = sorted(set(arguments.modules) - set(COVERING_TESTS))
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}: the modules are {', '.join(COVERING_TESTS)}")
    if not arguments.report_only:
        tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        for module in arguments.modules or list(COVERING_TESTS):
            run_module(
                module,
                workdir=arguments.workdir,
                children=arguments.children,
                tree=tree.stdout.strip(),
                resume=arguments.resume,
            )
    write_report()
    print(f"report: {REPORT}")


if __name__ == "__main__":
    main()
