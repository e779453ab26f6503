"""The fault catalogue (benchmarks/faults.py): its cases refused before any job are clean.

The whole catalogue runs the workflow some twenty times (minutes); its table is docs/faults.md.
"""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import faults


def test_the_cases_refused_before_any_job_are_clean(tmp_path):
    cheap = [case for case in faults.CASES if case.cheap]
    outcomes = faults.run_cases(cheap, workdir=tmp_path, parallel=2)
    assert [(o.case, o.outcome) for o in outcomes] == [(case.name, "clean") for case in cheap], faults.table(outcomes)
    assert not (tmp_path / "yaml_python_tag" / faults.CANARY).exists()


def test_a_case_is_classified_by_what_the_user_meets(tmp_path):
    """A run that must fail but exits 0 is silent; one that stops with another message is unclear;
    a temporary file in the results is left behind.
    """
    case = faults.Case("example", "an example", faults.settings_only(), expect=r"the expected line")
    work = tmp_path / "example"
    (work / "results" / "pbmc").mkdir(parents=True)
    done = subprocess.CompletedProcess([], 0, stdout="", stderr="")
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ValueError: something else\n")
    assert faults.classify(case, done, work).outcome == "silent"
    assert faults.classify(case, failed, work).outcome == "unclear"
    said = subprocess.CompletedProcess([], 1, stdout="", stderr="omicsprep error: the expected line\n")
    assert faults.classify(case, said, work).outcome == "clean"
    (work / "results" / "pbmc" / "qc.h5ad.tmp.h5ad").write_text("")
    assert faults.classify(case, said, work).outcome == "left-behind"
    (work / faults.CANARY).write_text("")
    assert faults.classify(case, said, work).outcome == "unsafe"


@pytest.mark.parametrize("case", faults.CASES, ids=lambda case: case.name)
def test_every_case_says_what_it_is_and_how_it_is_judged(case):
    assert case.what and (case.expect or case.check is not None)
