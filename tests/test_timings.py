"""Where a rule's time goes: phases counted once, and the line that benchmarks/run.py reads back."""

from __future__ import annotations

import json
import time

import anndata as ad
import numpy as np

from omicsprep import io
from omicsprep.timings import phase, phase_seconds
from omicsprep.workflow import PHASES_PREFIX, run_script


def test_a_phase_inside_another_counts_once_as_the_outer():
    before = phase_seconds()
    with phase("write"):
        with phase("read"):
            time.sleep(0.05)
        time.sleep(0.05)
    after = phase_seconds()
    assert after.get("read", 0.0) == before.get("read", 0.0)
    assert 0.1 <= after["write"] - before.get("write", 0.0) < 0.5


def test_a_rule_logs_its_start_up_reading_and_writing(tmp_path):
    log = tmp_path / "rule.log"
    path = tmp_path / "out.h5ad"

    def main() -> None:
        io.write_h5ad(ad.AnnData(np.ones((50, 4), dtype=np.float32)), path)
        io.read_h5ad(path)
        time.sleep(0.1)

    before = phase_seconds()
    run_script(main, log_path=log)
    line = next(line for line in log.read_text().splitlines() if f" {PHASES_PREFIX}{{" in line)
    phases = json.loads(line.split(f" {PHASES_PREFIX}", 1)[1])
    assert phases["startup"] > 0  # this test process's age
    assert phases["body"] >= 0.1
    assert phases["read"] > before.get("read", 0.0)
    assert phases["write"] > before.get("write", 0.0)
