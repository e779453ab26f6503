"""The CPU workflow submitted through profiles/slurm to a real one-node SLURM cluster
(tests/slurm/start.sh; `make test` installs Debian's slurm-wlm where it can): its jobs
went through SLURM, and its outputs equal a local run's."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import PBMC_H5, REPO
from test_workflow import snakemake, write_sheet

pytestmark = pytest.mark.workflow

TARGETS = ["results/pbmc/obs.parquet", "results/pbmc/markers.tsv"]
# The profile's memory requests are a real cluster's; this machine's node is smaller.
FITS_THIS_NODE = ["--default-resources", "mem_mb=2000", "runtime=30", "slurm_partition=cpu",
                  "--set-resources", "qc:mem_mb=3000", "qc:slurm_partition=gpu", "cluster:mem_mb=4000",
                  "cluster:slurm_partition=gpu"]
# No accounting database here: job states come from squeue, and SLURM guesses no account.
NO_ACCOUNTING = ["--slurm-no-account", "--slurm-status-command", "squeue",
                 "--slurm-init-seconds-before-status-checks", "5"]


@pytest.fixture(scope="module")
def slurm_cluster() -> Path:
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        pytest.skip("needs root and Debian's slurm-wlm (tests/slurm/install.sh)")
    started = subprocess.run(["bash", str(REPO / "tests" / "slurm" / "start.sh")], capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 0, started.stderr
    return Path(started.stdout.strip().splitlines()[-1])


def test_workflow_through_slurm_equals_a_local_run(slurm_cluster, tmp_path):
    runs = {}
    for mode in ("slurm", "local"):
        workdir = tmp_path / mode
        workdir.mkdir()
        sheet = write_sheet(workdir / "samples.tsv", [f"pbmc\t{PBMC_H5}"])
        how = (["--profile", str(REPO / "profiles" / "slurm"), *FITS_THIS_NODE, *NO_ACCOUNTING] if mode == "slurm"
               else ["--cores", "2"])
        runs[mode] = snakemake(*TARGETS, *how, "--config", f"samples={sheet}", "backend=cpu", workdir=workdir)
        assert runs[mode].returncode == 0, runs[mode].stderr[-4000:]
    job_ids = re.findall(r"submitted with SLURM jobid (\d+)", runs["slurm"].stderr)
    assert len(job_ids) == 2  # qc and cluster
    completions = subprocess.run(["sacct", "--completion", "-P", "-o", "JobID,Partition,State"], capture_output=True,
                                 text=True, check=True).stdout
    table = pd.read_csv(io.StringIO(completions), sep="|", dtype=str).set_index("JobID")
    assert (table.loc[job_ids, "State"] == "COMPLETED").all()
    assert (table.loc[job_ids, "Partition"] == "gpu").all()  # the rules that may use a GPU go to its partition
    slurm, local = (pd.read_parquet(tmp_path / mode / TARGETS[0]) for mode in ("slurm", "local"))
    pd.testing.assert_frame_equal(slurm, local)
    slurm, local = (pd.read_csv(tmp_path / mode / TARGETS[1], sep="\t") for mode in ("slurm", "local"))
    pd.testing.assert_frame_equal(slurm, local)
