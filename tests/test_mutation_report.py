"""make mutate's report: counts per module, equivalent mutants set aside with their reason, stale entries named."""

from __future__ import annotations

import gzip
import importlib.util
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
    # 8 mutants: 3 killed (a timeout counts), 1 survived, 1 not reached, 1 unclear, 1 equivalent, 1 GPU only;
    # 3 of 6.
    assert "| protein | 8 | 3 | 1 | 1 | 1 | 1 | 1 | 50.0% | 2026-12-04, tree abc1234, 30 min |" in report
    assert "| rna | not run |" in report
    assert f"- `{name(4)}` (survived): `-    a = 1 ⏎ +    a = 2`" in report
    assert f"- `{name(5)}`: the same either way" in report.split("GPU only:\n")[0]
    assert f"- `{name(8)}`: GPU only: NumPy either way on the CPU" in report.split("GPU only:\n")[1]
    assert f"- `{name(1)}`" in report.split("killed or gone (remove them)")[1]
