"""make mutate's report: counts per module, equivalent mutants set aside (reasons in the toml), stale ones named."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture
def mutate(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("mutate", HERE / "mutation" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(module, "EQUIVALENT", tmp_path / "equivalent.toml")
    monkeypatch.setattr(module, "REPORT", tmp_path / "mutation.md")
    (tmp_path / "results").mkdir()
    return module


def test_the_report_counts_each_outcome_and_sets_equivalent_mutants_apart(mutate):
    name = "omicsprep.protein.normalization.x_clr__mutmut_{}".format
    rows = [
        (name(1), "killed", ""),
        (name(2), "killed", ""),
        (name(3), "timeout", ""),
        (name(4), "survived", "-    a = 1 ⏎ +    a = 2"),
        (name(5), "survived", "-    b ⏎ +    c"),
        (name(6), "no tests", "-    d ⏎ +    e"),
        (name(7), "suspicious", "-    f ⏎ +    g"),
        (name(8), "survived", "-    xp = array_module(backend) ⏎ +    xp = array_module(None)"),
        (name(9), "segfault", "-    h ⏎ +    i"),
    ]
    lines = ["mutant\tstatus\tdiff", *("\t".join(row) for row in rows)]
    (mutate.RESULTS / "protein.tsv.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    (mutate.RESULTS / "protein.run").write_text("2026-12-04, tree abc1234, 30 min\n")
    mutate.EQUIVALENT.write_text(
        f'[protein]\n"{name(5)}" = "the same either way"\n"{name(1)}" = "no longer survives"\n'
        f'"{name(8)}" = "GPU only: NumPy either way on the CPU"\n'
    )
    mutate.write_report()
    report = mutate.REPORT.read_text()
    # 9 mutants: 4 killed (a timeout and a segfault count), 1 survived, 1 not reached, 1 unclear, 1 equivalent,
    # 1 GPU only; 4 of 7.
    assert "| protein | 9 | 4 | 1 | 1 | 1 | 1 | 1 | 57.1% | 2026-12-04, tree abc1234, 30 min |" in report
    assert "| rna | not run |" in report
    assert "- `omicsprep.protein.normalization.x_clr`: 4, 6 (no tests), 7 (suspicious)\n" in report
    equal, gpu_only = report.split("Equivalent, by function:\n")[1].split("GPU only, by function:\n")
    assert equal.lstrip().startswith("- `omicsprep.protein.normalization.x_clr`: 5\n")
    assert gpu_only.lstrip().startswith("- `omicsprep.protein.normalization.x_clr`: 8\n")
    assert "table `[protein]`" in report
    assert f"- `{name(1)}`" in report.split("killed or gone (remove them)")[1]


def test_a_continued_run_tests_its_survivors_again_and_maps_tests_to_functions_afresh(mutate, tmp_path):
    mutants = tmp_path / "run" / "mutants"
    (mutants / "omicsprep" / "atac").mkdir(parents=True)
    (mutants / "mutmut-stats.json").write_text("{}")
    verdicts = {
        "x_a__mutmut_1": 1,
        "x_a__mutmut_2": 0,
        "x_a__mutmut_3": 33,
        "x_a__mutmut_4": -24,
        "x_a__mutmut_5": None,
    }
    verdicts["x_a__mutmut_6"] = 0  # a survivor explained as equivalent: no test can kill it
    meta = mutants / "omicsprep" / "atac" / "fragments.py.meta"
    meta.write_text(json.dumps({"exit_code_by_key": verdicts, "hash_by_function_name": {"x_a": "h"}}))
    explained = {"x_a__mutmut_6": "the same either way"}
    # The unexplained survivor and the one no test reached.
    assert mutate.retest_undecided(tmp_path / "run", explained=explained) == 2
    kept = json.loads(meta.read_text())
    assert kept["exit_code_by_key"] == {**verdicts, "x_a__mutmut_2": None, "x_a__mutmut_3": None}
    assert kept["hash_by_function_name"] == {"x_a": "h"}  # mutmut's own check of changed functions
    assert not (mutants / "mutmut-stats.json").exists()  # moved functions would keep no test


def test_each_function_is_tested_by_every_test_of_the_files_that_reach_it(mutate):
    """A module-scoped fixture's functions ran in its first test only: the file's other tests
    (one that ran nothing mutated among them) check them too; other files' tests are not added."""
    tests_by_function = {
        "omicsprep.atac.fragments.x__to_anndata": {"tests/test_atac.py::test_peak_counts_equal_a_plain_count"},
        "omicsprep.atac.lsi.x_lsi": {"tests/test_multiome.py::test_join", "tests/test_atac.py::test_lsi"},
        "omicsprep.atac.columns.x_runs": {"tests/test_multiome.py::test_join"},
    }
    every_test = [
        "tests/test_atac.py::test_peak_counts_equal_a_plain_count",
        "tests/test_atac.py::test_qc_metrics",
        "tests/test_atac.py::test_lsi",
        "tests/test_multiome.py::test_join",
        "tests/test_multiome.py::test_wnn",
    ]
    mutate.widen_to_test_files(tests_by_function, every_test)
    atac, multiome = set(every_test[:3]), set(every_test[3:])
    assert tests_by_function["omicsprep.atac.fragments.x__to_anndata"] == atac
    assert tests_by_function["omicsprep.atac.lsi.x_lsi"] == atac | multiome
    assert tests_by_function["omicsprep.atac.columns.x_runs"] == multiome
    compile(mutate.LAUNCHER, "launcher", "exec")


def test_each_functions_tests_run_fastest_file_first_and_those_that_ran_it_first(mutate):
    """mutmut stops at a mutant's first failing test: the quick ones go first, a file's together, and
    in a file those that ran the function before those that can fail only through a fixture."""
    durations = {
        "tests/test_cells.py::test_slow": 16.0,
        "tests/test_cells.py::test_quick": 0.5,
        "tests/test_cells.py::test_quicker_elsewhere": 0.2,
        "tests/test_emptydrops.py::test_a": 2.0,
        "tests/test_emptydrops.py::test_b": 1.0,
    }
    function = "omicsprep.cells.calling.x_call_cells"
    tests_by_function = {function: set(durations), "omicsprep.cells.x_none": set()}
    reached = {function: set(durations) - {"tests/test_cells.py::test_quicker_elsewhere"}}
    mutate.fastest_first(tests_by_function, durations, reached)
    assert tests_by_function[function] == [
        "tests/test_emptydrops.py::test_b",
        "tests/test_emptydrops.py::test_a",
        "tests/test_cells.py::test_quick",
        "tests/test_cells.py::test_slow",
        "tests/test_cells.py::test_quicker_elsewhere",
    ]
    assert tests_by_function["omicsprep.cells.x_none"] == []
    compile(mutate.LAUNCHER, "launcher", "exec")


def test_the_atlas_and_scib_files_are_targets_of_their_own_within_rna(mutate, tmp_path):
    """rna's run leaves the atlas files (whose covering file takes minutes) and scIB's metrics to their
    own targets, each mutating its files alone and running its own test file (test_scib.py, with no
    scVI to train, for scIB's); every file of them exists; none mutates another's files or the
    modules that launch the neighbour and silhouette kernels (no CPU test can call them)."""
    import tomllib

    settings = {}
    for target in ("rna", "atlas", "scib"):
        folder = mutate.scratch_copy(target, tmp_path / "work", resume=False)
        settings[target] = tomllib.loads((folder / "pyproject.toml").read_text())["tool"]["mutmut"]
    atlas_files, scib_files = mutate.FILES_OF["atlas"], mutate.FILES_OF["scib"]
    assert all((mutate.ROOT / file).is_file() for file in atlas_files + scib_files)
    assert "omicsprep/rna/latent.py" in atlas_files and scib_files == ["omicsprep/rna/integration_scores.py"]
    assert {settings[target]["source_paths"][0] for target in settings} == {"omicsprep/rna/"}
    assert settings["atlas"]["only_mutate"] == atlas_files and settings["scib"]["only_mutate"] == scib_files
    launchers = ["omicsprep/rna/neighbors_cuda.py", "omicsprep/rna/pairs_cuda.py"]
    assert settings["rna"]["do_not_mutate"] == [*atlas_files, *scib_files, *launchers]
    assert settings["atlas"]["do_not_mutate"] == [*scib_files, *launchers]
    assert settings["scib"]["do_not_mutate"] == [*atlas_files, *launchers]
    assert "only_mutate" not in settings["rna"]
    assert mutate.gpu_launchers("cells") == ["omicsprep/cells/montecarlo_cuda.py"]
    assert settings["atlas"]["pytest_add_cli_args_test_selection"] == ["tests/test_atlas.py"]
    assert settings["scib"]["pytest_add_cli_args_test_selection"] == ["tests/test_scib.py"]


def test_a_reference_run_is_kept_by_its_command_and_inputs_only_when_asked(tmp_path, monkeypatch):
    """A mutation run gets R's outputs back for the same command and input files, in another
    folder too; other inputs run the command again; without the variable every call runs."""
    import sys

    from omicsprep.testing.reference_runs import CACHE_VARIABLE, run_reference

    runs = tmp_path / "runs"
    script = f"import pathlib, sys; f = pathlib.Path(sys.argv[1]); open({str(runs)!r}, 'a').write('x');"
    script += " f.with_suffix('.out').write_text(f.read_text().upper()); print('done')"

    def run(folder: Path, text: str) -> str:
        folder.mkdir(exist_ok=True)
        (folder / "in.txt").write_text(text)
        completed = run_reference(
            [sys.executable, "-c", script, str(folder / "in.txt")], folder, capture_output=True, text=True, check=True
        )
        assert completed.stdout == "done\n"
        return (folder / "in.out").read_text()

    assert run(tmp_path / "a", "abc") == "ABC" and run(tmp_path / "a", "abc") == "ABC"
    assert runs.read_text() == "xx"
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    assert run(tmp_path / "b", "abc") == "ABC"
    assert run(tmp_path / "c", "abc") == "ABC"  # kept: another folder, the same inputs
    assert runs.read_text() == "xxx"
    assert run(tmp_path / "d", "abd") == "ABD"
    assert runs.read_text() == "xxxx"


def test_a_run_in_progress_is_continued_from_its_checkpoint_on_another_machine(mutate, tmp_path):
    """The verdicts so far go into the tree (a machine and its scratch folder may be gone by the
    next session); restored, they seed mutmut's .meta files, and the report shows the progress."""
    meta = tmp_path / "run" / "mutants" / "omicsprep" / "cells" / "calling.py.meta"
    meta.parent.mkdir(parents=True)
    verdicts = {"x_a__mutmut_1": 1, "x_a__mutmut_2": 0, "x_a__mutmut_3": None, "x_a__mutmut_4": 33, "x_a__mutmut_5": 35}
    written = {
        "exit_code_by_key": verdicts,
        "hash_by_function_name": {"x_a": "h"},
        "type_check_error_by_key": {},
        "durations_by_key": {"x_a__mutmut_1": 1.5},
        "estimated_durations_by_key": {},
    }
    meta.write_text(json.dumps(written))
    (meta.parent / "half-written.py.meta").write_text('{"exit_code_by_key": {')  # mutmut writing it: skipped
    mutate.save_checkpoint(tmp_path / "run", "cells", tree="abc1234")
    mutate.restore_checkpoint(tmp_path / "elsewhere", "cells")
    restored = json.loads((tmp_path / "elsewhere" / "mutants" / "omicsprep" / "cells" / "calling.py.meta").read_text())
    assert restored == {**written, "durations_by_key": {}}  # mutmut's SourceFileMutationData.load needs every key
    assert not (tmp_path / "elsewhere" / "mutants" / "omicsprep" / "cells" / "half-written.py.meta").exists()
    mutate.write_report()
    row = next(line for line in mutate.REPORT.read_text().splitlines() if line.startswith("| cells |"))
    assert row.startswith("| cells | 5 | 1 | 1 | 1 | 1 | | | - | in progress: 1 not yet tested (checkpoint ")
    assert row.endswith(", tree abc1234) |")
