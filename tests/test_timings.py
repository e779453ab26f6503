"""Where a rule's time goes: phases counted once, and the line that benchmarks/e2e.py reads back."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from omicsprep.jobs import PHASES_PREFIX
from omicsprep.provenance import StepTimer
from omicsprep.timings import phase, phase_seconds


def test_a_phase_inside_another_counts_once_as_the_outer():
    before = phase_seconds()
    with phase("write"):
        with phase("read"):
            time.sleep(0.05)
        time.sleep(0.05)
    after = phase_seconds()
    assert after.get("read", 0.0) == before.get("read", 0.0)
    assert 0.1 <= after["write"] - before.get("write", 0.0) < 0.5


RULE_BODY = """
import sys, time
import anndata as ad
import numpy as np
from omicsprep import io
from omicsprep.jobs import run_script

def main():
    io.write_h5ad(ad.AnnData(np.ones((50, 4), dtype=np.float32)), sys.argv[1])
    io.read_h5ad(sys.argv[1])
    time.sleep(0.2)

run_script(main, log_path=sys.argv[2])
"""


def test_a_rule_logs_its_start_up_reading_and_writing(tmp_path):
    # In a process of its own, as a rule runs: run_script takes over standard error.
    log = tmp_path / "rule.log"
    launched = time.time()
    subprocess.run([sys.executable, "-c", RULE_BODY, str(tmp_path / "out.h5ad"), str(log)], check=True)
    exited = time.time()
    line = next(line for line in log.read_text().splitlines() if f" {PHASES_PREFIX}{{" in line)
    phases = json.loads(line.split(f" {PHASES_PREFIX}", 1)[1])
    assert 0.2 < phases["startup"] < 60  # the interpreter and the imports, before the body
    assert 0.2 <= phases["body"] < 60
    assert 0 < phases["read"] < phases["body"] and 0 < phases["write"] < phases["body"]
    assert "gpu_import" not in phases  # nothing asked for the GPU
    # The process on the run's timeline: started after the launch, ended before the exit.
    assert launched - 0.05 <= phases["started_at"] < phases["ended_at"] <= exited
    assert phases["ended_at"] - phases["started_at"] == pytest.approx(phases["startup"] + phases["body"], abs=0.01)


def test_a_step_leaves_out_the_gpu_libraries_it_imports():
    # A RAPIDS library imported by its first use inside a step (rapids-singlecell in
    # to_device, say) counts as the rule's gpu_import, not as the step.
    timer = StepTimer(backend="cpu")
    with timer.step("to_device"):
        with phase("gpu_import"):
            time.sleep(0.2)
        time.sleep(0.05)
    assert 0.04 < timer.seconds["to_device"] < 0.15


def test_provenance_is_read_back_as_anndata_reads_it(tmp_path):
    # Rule run_times reads provenance records with h5py alone (it starts without AnnData).
    import anndata as ad
    import numpy as np

    from omicsprep import io
    from omicsprep.provenance import record_provenance

    adata = ad.AnnData(np.ones((3, 2), dtype=np.float32))
    params = {"qc": {"min_genes": 200, "gene_groups": {"mt": "^MT-"}}, "seed": 0}
    record_provenance(adata, rule="qc", backend="cpu", params=params, timings={"doublets": 1.25, "filter": 0.5})
    path = tmp_path / "qc.h5ad"
    io.write_h5ad(adata, path)
    record = io.read_provenance(path, rule="qc")
    assert record == io.read_h5ad_elements(path, ["uns/omicsprep/qc"])["uns/omicsprep/qc"]
    assert record["timings"] == {"doublets": 1.25, "filter": 0.5}
    assert record["backend"] == "cpu" and json.loads(record["params"]) == params
    assert record["versions"]["anndata"] == ad.__version__
