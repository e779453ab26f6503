"""The workflow submitted through the shipped profiles/slurm to a real one-node SLURM cluster
(tests/slurm/start.sh; `make test` installs Debian's slurm-wlm where it can): what each job
asked SLURM for (partition, GPUs, memory, CPUs), read back with scontrol and sacct, is what
the profile and the config say; a failed job is retried with more memory; and the outputs
equal a local run's.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import PBMC_H5, REPO
from test_workflow import workflow_command, write_sheet

from omicsprep import resources

pytestmark = pytest.mark.workflow

PROFILE = REPO / "profiles" / "slurm"
TARGETS = ["results/pbmc/obs.parquet", "results/pbmc/markers.tsv", "results/run_times.tsv"]
# Backend auto: qc may use the GPU (here it finds none and runs on the CPU); cluster is
# pinned to the CPU; run_times never uses the GPU.
CONFIG = ["backend_per_rule={cluster: cpu}"]
# No accounting database here: job states come from squeue, and SLURM guesses no account.
NO_ACCOUNTING = [
    "--slurm-no-account",
    "--slurm-status-command",
    "squeue",
    "--slurm-init-seconds-before-status-checks",
    "5",
]


@pytest.fixture(scope="module")
def slurm_cluster() -> Path:
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        reason = "needs root and Debian's slurm-wlm (tests/slurm/install.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SLURM test: {reason}")
        pytest.skip(reason)
    started = subprocess.run(
        ["bash", str(REPO / "tests" / "slurm" / "start.sh")], capture_output=True, text=True, timeout=180
    )
    assert started.returncode == 0, started.stderr
    return Path(started.stdout.strip().splitlines()[-1])


def snakemake_command(workdir: Path, *args: str) -> list[str]:
    sheet = write_sheet(workdir / "samples.tsv", [f"pbmc\t{PBMC_H5}"])
    return workflow_command(*TARGETS, *args, "--config", f"samples={sheet}", *CONFIG, workdir=workdir)


def run_cancelling_first_qc_job(command: list[str], workdir: Path) -> tuple[subprocess.CompletedProcess, str]:
    """Run the workflow and cancel (scancel) the first job of rule qc that it submits from
    ``workdir``, so that it fails once and the profile's retry takes over. Returns the run
    and the cancelled job's id.
    """
    stdout, stderr = ((workdir / f"snakemake.{name}").open("w+") for name in ("out", "err"))
    process = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=stderr, text=True)
    cancelled = ""
    deadline = time.monotonic() + 600
    while not cancelled and process.poll() is None and time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h", "-o", "%i|%k|%Z"], capture_output=True, text=True).stdout
        first_qc = [
            job
            for job, comment, where in (line.split("|") for line in queue.splitlines())
            if comment.startswith("rule_qc_") and Path(where) == workdir
        ]
        if first_qc:
            cancelled = first_qc[0]
            subprocess.run(["scancel", cancelled], check=True)
        time.sleep(0.5)
    process.wait(timeout=1200)
    with stdout, stderr:
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, stdout.read(), stderr.read()), cancelled


def scontrol_jobs(job_ids: list[str]) -> pd.DataFrame:
    """``scontrol show job``'s fields of each job (finished jobs stay listed: MinJobAge)."""
    rows = []
    for job_id in job_ids:
        line = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True
        ).stdout
        rows.append(dict(field.split("=", 1) for field in line.split() if "=" in field))
    return pd.DataFrame(rows).set_index("JobId")


def megabytes(memory: str) -> float:
    """SLURM's memory notation (``32000M``, ``62.50G``) in MB."""
    number, unit = float(memory[:-1]), memory[-1]
    return number * {"M": 1, "G": 1024, "T": 1024**2}[unit]


def minutes(limit: str) -> int:
    """SLURM's time limit (``[days-]hours:minutes:seconds``) in minutes."""
    days, _, clock = limit.rpartition("-")
    hours, mins, _ = ([0] * 3 + [int(part) for part in clock.split(":")])[-3:]
    return (int(days or 0) * 24 + hours) * 60 + mins


def profile_resource(profile: dict, rule: str, name: str, attempt: int):
    """A rule's resource as the profile sets it (its own entry, else the default),
    evaluated for ``attempt``.
    """
    value = profile["set-resources"].get(rule, {}).get(name, profile["default-resources"][name])
    return eval(value, {"attempt": attempt}) if isinstance(value, str) and "attempt" in value else value


def asked_memory(profile: dict, rule: str, attempt: int, *, inputs: list[str]) -> int | str:
    """The mem_mb a job asks for: the profile's for its rule where it sets one, else its rule's
    model of its inputs (``<TBD>`` in a dry run while they are missing), else the profile's default.
    """
    if rule not in resources.MODELS or "mem_mb" in profile["set-resources"].get(rule, {}):
        return profile_resource(profile, rule, "mem_mb", attempt)
    try:
        return resources.memory_mb(rule, inputs_mb=resources.paths_mb(inputs), attempt=attempt)
    except FileNotFoundError:
        return "<TBD>"


def documented_slurm_arguments() -> list[str]:
    """The README's command line for SLURM, less ``snakemake``."""
    line = next(
        line
        for line in (REPO / "README.md").read_text().splitlines()
        if line.strip().startswith("snakemake --profile profiles/slurm")
    )
    return shlex.split(line.split("#")[0])[1:]


def dry_run_jobs(output: str) -> list[dict]:
    """Each job of a dry run's listing: its rule, threads (1 when not shown) and resources."""
    jobs = []
    for block in re.split(r"\n(?=rule \w+:\n)", output)[1:]:
        threads = re.search(r"^\s+threads: (\d+)$", block, flags=re.MULTILINE)
        listed = re.search(r"^\s+resources: (.*)$", block, flags=re.MULTILINE)
        inputs = re.search(r"^\s+input: (.*)$", block, flags=re.MULTILINE)
        jobs.append(
            {
                "rule": re.match(r"rule (\w+):", block).group(1),
                "threads": int(threads.group(1)) if threads else 1,
                "inputs": inputs.group(1).split(", ") if inputs else [],
                **dict(item.split("=", 1) for item in (listed.group(1).split(", ") if listed else [])),
            }
        )
    return jobs


def test_documented_slurm_command_applies_the_slurm_profile(tmp_path):
    """The README's SLURM command line gives every job the threads, partition, memory and
    run time that profiles/slurm sets (first attempt), and a GPU to each rule that may use
    one: no other profile (such as the local one, profiles/default) overrides them.
    """
    arguments = documented_slurm_arguments()
    assert arguments[:2] == ["--profile", "profiles/slurm"]
    command = snakemake_command(tmp_path, *arguments, "-n", "--forceall", "--cores", "64")
    result = subprocess.run(
        [part for part in command if part not in TARGETS], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = dry_run_jobs(result.stdout + result.stderr)
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    assert {"qc", "cluster", "coexpression", "run_times"} <= {job["rule"] for job in jobs}
    for job in jobs:
        rule = job["rule"]
        if rule == "all":  # the default target: nothing to run
            continue
        # No cpus_per_task other than the threads: the plugin asks SLURM for cpus_per_task
        # CPUs when it is set, and for the threads otherwise.
        assert job.get("cpus_per_task") in (None, str(job["threads"])), rule
        asked = {name: job.get(name) for name in ("threads", "slurm_partition", "mem_mb", "runtime", "gpu")}
        inputs = [path if Path(path).is_absolute() else str(tmp_path / path) for path in job["inputs"]]
        expected = {
            "threads": profile["set-threads"].get(rule, 1),
            "slurm_partition": None,  # the executor picks one from partitions.yaml: none is fixed
            "runtime": str(profile_resource(profile, rule, "runtime", 1)),
            "mem_mb": str(asked_memory(profile, rule, 1, inputs=inputs)),
            "gpu": None if rule in ("run_times", "summary") else "0" if rule == "cluster" else "1",
        }
        assert asked == expected, rule


def test_workflow_through_shipped_slurm_profile(slurm_cluster, tmp_path):
    runs = {}
    (tmp_path / "slurm").mkdir()
    (tmp_path / "local").mkdir()
    runs["slurm"], cancelled = run_cancelling_first_qc_job(
        snakemake_command(tmp_path / "slurm", *documented_slurm_arguments(), *NO_ACCOUNTING), tmp_path / "slurm"
    )
    runs["local"] = subprocess.run(
        snakemake_command(tmp_path / "local", "--cores", "2"), cwd=REPO, capture_output=True, text=True, timeout=1200
    )
    for mode, run in runs.items():
        assert run.returncode == 0, f"{mode}: {run.stderr[-4000:]}"
    assert cancelled, "no job of rule qc was seen in the queue"

    job_ids = re.findall(r"submitted with SLURM jobid (\d+)", runs["slurm"].stderr)
    jobs = scontrol_jobs(job_ids)
    jobs["rule"] = jobs["Comment"].str.extract(r"^rule_(\w+?)(?:_wildcards|$)", expand=False)
    jobs["attempt"] = jobs.groupby("rule").cumcount() + 1
    assert sorted(jobs["rule"]) == ["cluster", "coexpression", "qc", "qc", "run_times"]  # qc cancelled, retried
    assert jobs.loc[cancelled, "rule"] == "qc"
    assert jobs.loc[cancelled, "attempt"] == 1

    # What each job asked for is what the shipped profile, the config and the rules' memory
    # models (of the job's inputs) say.
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    results = tmp_path / "slurm" / "results" / "pbmc"
    inputs = {
        "qc": [str(PBMC_H5)],
        "cluster": [str(results / "qc.h5ad")],
        "coexpression": [str(results / "processed.h5ad")],
    }
    for job_id, job in jobs.iterrows():
        rule, attempt = job["rule"], job["attempt"]
        assert job["Partition"] == ("gpu" if job["TresPerJob"] == "gres:gpu:1" else "cpu"), job_id
        memory = asked_memory(profile, rule, attempt, inputs=inputs.get(rule, []))
        assert megabytes(job["MinMemoryNode"]) == memory, job_id
        assert minutes(job["TimeLimit"]) == profile_resource(profile, rule, "runtime", attempt), job_id
        assert int(job["NumCPUs"]) == profile["set-threads"].get(rule, 1), job_id
    qc, cluster, run_times = (jobs[jobs["rule"] == rule] for rule in ("qc", "cluster", "run_times"))
    # A rule that may use the GPU goes to the gpu partition and asks for one GPU; the rule
    # pinned to the CPU and the CPU-only rule ask for none.
    assert (qc["Partition"] == "gpu").all()
    assert (qc["TresPerJob"] == "gres:gpu:1").all()
    assert cluster["TresPerJob"].isna().all()
    assert run_times["TresPerJob"].isna().all()
    assert (run_times["Partition"] == "cpu").all()
    # The retry asked for more memory than the cancelled attempt.
    memory = qc.sort_values("attempt")["MinMemoryNode"].map(megabytes).tolist()
    assert memory[1] > memory[0]

    # The jobs' final states, from the job completion records.
    completions = subprocess.run(
        ["sacct", "--completion", "-P", "-o", "JobID,Partition,State"], capture_output=True, text=True, check=True
    ).stdout
    states = pd.read_csv(io.StringIO(completions), sep="|", dtype=str).set_index("JobID")["State"]
    assert states[cancelled] == "CANCELLED"
    assert (states[[job_id for job_id in job_ids if job_id != cancelled]] == "COMPLETED").all()

    assert (cluster["Partition"] == "cpu").all()  # pinned to the CPU: the partition without GPUs
    slurm, local = (pd.read_parquet(tmp_path / mode / TARGETS[0]) for mode in ("slurm", "local"))
    pd.testing.assert_frame_equal(slurm, local)
    slurm, local = (pd.read_csv(tmp_path / mode / TARGETS[1], sep="\t") for mode in ("slurm", "local"))
    pd.testing.assert_frame_equal(slurm, local)


def test_a_cpu_backend_run_asks_slurm_for_no_gpu_and_no_gpu_partition(slurm_cluster, tmp_path):
    """--config backend=cpu through the SLURM profile (a cluster without GPUs, or a choice):
    every job goes to the partition without GPUs and asks for none."""
    sheet = write_sheet(tmp_path / "samples.tsv", [f"pbmc\t{PBMC_H5}"])
    arguments = [*documented_slurm_arguments(), *NO_ACCOUNTING, "--config", f"samples={sheet}", "backend=cpu"]
    command = workflow_command("results/pbmc/obs.parquet", *arguments, workdir=tmp_path)
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    jobs = scontrol_jobs(re.findall(r"submitted with SLURM jobid (\d+)", run.stderr))
    assert sorted(jobs["Comment"].str.extract(r"^rule_(\w+?)_wildcards", expand=False)) == ["cluster", "qc"]
    assert (jobs["Partition"] == "cpu").all()
    assert "TresPerJob" not in jobs or jobs["TresPerJob"].isna().all()  # scontrol lists it for a GPU job only
