"""Warm workers (omicsprep workers): a script handed to a process that imported the libraries first.

The workflow's rules through them are in test_workflow.py; here, plain scripts that show
what travels (arguments, directory, environment, streams, exit status) and what stops them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import OMICSPREP_CLI, warm_workers_running

SCRIPT = """
import omicsprep.handoff  # noqa: F401
import os, sys, time
print("pid", os.getpid(), "parent", os.getppid(), "cwd", os.getcwd(), "setting", os.environ.get("PER_RULE"), flush=True)
print("anndata imported before the script:", "anndata" in sys.modules, flush=True)
print("to the rule's stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def omicsprep(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*OMICSPREP_CLI, *args], env=env, capture_output=True, text=True, timeout=300, check=check)


@pytest.fixture
def workers():
    """This environment's server with one worker, in a runtime folder of the test's own; stopped after."""
    with warm_workers_running(n_workers=1) as env:
        yield env


def run_script(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = tmp_path / "rule.py"
    script.write_text(SCRIPT)
    workdir = tmp_path / "workdir"
    workdir.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=120
    )


def fields(stdout: str) -> dict[str, str]:
    words = stdout.splitlines()[0].split()
    return dict(zip(words[::2], words[1::2], strict=True))


def test_a_script_runs_in_a_worker_with_its_arguments_directory_environment_streams_and_status(tmp_path, workers):
    result = run_script(tmp_path, "3", env={**workers, "PER_RULE": "per-rule"})
    assert result.returncode == 3, result.stderr
    seen = fields(result.stdout)
    # Another process than the one started here (its parent is the server), with the libraries imported.
    assert int(seen["parent"]) != os.getpid()
    assert seen["cwd"] == str(tmp_path / "workdir") and seen["setting"] == "per-rule"
    assert "anndata imported before the script: True" in result.stdout
    assert "to the rule's stderr" in result.stderr
    # The next rule gets a fresh worker: each worker runs one rule.
    again = run_script(tmp_path, "0", env=workers)
    assert again.returncode == 0, again.stderr
    assert fields(again.stdout)["pid"] != seen["pid"]


def test_rules_arriving_together_each_get_a_worker(tmp_path, workers):
    script = tmp_path / "rule.py"
    script.write_text(SCRIPT)
    rules = [
        subprocess.Popen(
            [sys.executable, str(script), "0"], env=workers, cwd=tmp_path, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [rule.communicate(timeout=120)[0] for rule in rules]
    assert all(rule.returncode == 0 for rule in rules)
    assert all("anndata imported before the script: True" in output for output in outputs), outputs
    assert len({fields(output)["pid"] for output in outputs}) == 3


def test_rules_cancelled_while_they_wait_leave_the_server_serving(tmp_path, workers):
    script = tmp_path / "rule.py"
    script.write_text(SCRIPT)
    for _ in range(3):  # killed before or after a worker took them
        waiting = subprocess.Popen([sys.executable, str(script), "0"], env=workers, cwd=tmp_path)
        time.sleep(0.3)
        waiting.send_signal(signal.SIGKILL)
        waiting.wait()
    result = run_script(tmp_path, "5", env=workers)
    assert result.returncode == 5, result.stderr
    assert "anndata imported before the script: True" in result.stdout


def test_a_server_started_with_other_import_time_settings_is_not_used(tmp_path, workers):
    result = run_script(tmp_path, "0", env={**workers, "OMICSPREP_SOME_SETTING": "1"})
    assert result.returncode == 0, result.stderr
    assert "not used (environment variables differ: OMICSPREP_SOME_SETTING)" in result.stderr
    assert "this rule runs in its own process" in result.stderr
    assert "anndata imported before the script: False" in result.stdout


def test_without_a_server_or_when_switched_off_the_script_runs_in_its_own_process(tmp_path, workers):
    for env in ({**workers, "OMICSPREP_WORKERS": "off"}, {**workers, "OMICSPREP_RUNTIME_DIR": str(tmp_path / "none")}):
        result = run_script(tmp_path, "0", env=env)
        assert result.returncode == 0 and result.stderr.strip() == "to the rule's stderr", result.stderr
        assert "anndata imported before the script: False" in result.stdout


def test_a_rule_process_that_ends_stops_its_worker(tmp_path, workers):
    marker = tmp_path / "worker.pid"
    script = tmp_path / "rule.py"
    script.write_text(SCRIPT)
    rule = subprocess.Popen([sys.executable, str(script), "sleep", str(marker)], env=workers, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the worker never started the script"
        time.sleep(0.1)
    worker = int(marker.read_text())
    assert worker != rule.pid
    rule.send_signal(signal.SIGKILL)  # as a cancelled job's process is killed
    rule.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{worker}").exists() and "zombie" not in _state(worker):
        assert time.monotonic() < deadline, "the worker kept running after its rule's process ended"
        time.sleep(0.1)
    status = omicsprep("workers", "status", env=workers).stdout
    assert "server" in status and str(worker) not in status


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (FileNotFoundError, IndexError):
        return "zombie"


def test_a_runtime_folder_too_long_for_a_socket_is_named(tmp_path):
    env = {**os.environ, "OMICSPREP_RUNTIME_DIR": str(tmp_path / ("x" * 100))}
    result = omicsprep("workers", "start", env=env, check=False)
    assert result.returncode == 1
    assert "too long for a socket's path (at most 107 bytes); set OMICSPREP_RUNTIME_DIR" in result.stderr


def test_stopping_the_server_removes_its_socket(workers, monkeypatch):
    from omicsprep.workers import socket_path

    monkeypatch.setenv("OMICSPREP_RUNTIME_DIR", workers["OMICSPREP_RUNTIME_DIR"])
    path = socket_path()
    assert path.exists()
    omicsprep("workers", "stop", env=workers)
    deadline = time.monotonic() + 10
    while path.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "no warm workers run" in omicsprep("workers", "status", env=workers).stdout


@pytest.mark.gpu
def test_starting_workers_on_a_gpu_machine_compiles_the_shipped_kernels_then_warms_up(tmp_path, monkeypatch):
    # A fresh machine (an empty kernel cache): the command returns once the shipped kernels
    # are compiled and the cache marked, so the first rule compiles nothing of them, and (as
    # asked) a worker has run the steps once on the GPU, holding a CUDA context on our devices.
    cache = tmp_path / "kernels"
    monkeypatch.setenv("CUPY_CACHE_DIR", str(cache))
    with warm_workers_running(n_workers=1, until_warm=True) as env:
        assert "ready (warm)" in omicsprep("workers", "status", env=env).stdout
        ours = env.get("CUDA_VISIBLE_DEVICES")
        result = run_script(tmp_path, "0", env={**env, "CUDA_VISIBLE_DEVICES": "0" if ours != "0" else "0,0"})
        assert f"the workers hold CUDA contexts on CUDA_VISIBLE_DEVICES={ours}" in result.stderr
        assert "anndata imported before the script: False" in result.stdout
        result = run_script(tmp_path, "0", env=env)
        assert "anndata imported before the script: True" in result.stdout, result.stderr
    assert len(list(cache.glob("omicsprep-kernels-*"))) == 1
    assert len(list(cache.glob("*.cubin"))) >= 100


def test_a_module_compiled_at_its_first_import_is_no_install_but_an_install_is_seen(tmp_path, monkeypatch):
    # Python writes a __pycache__ folder beside a module at its first import, which changes
    # the package folder's time: the worker that imports it first must not make the server's
    # workers unusable for every later rule. A package installed there must.
    site = tmp_path / "site"
    site.mkdir()
    (site / "probe_module.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    script = tmp_path / "rule.py"
    script.write_text(
        "import omicsprep.handoff  # noqa: F401\n"
        "import sys, probe_module\n"
        "print('anndata imported before the script:', 'anndata' in sys.modules)\n"
    )
    with warm_workers_running(n_workers=1) as env:
        for _ in range(2):
            result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
            assert "anndata imported before the script: True" in result.stdout, result.stderr
        assert (site / "__pycache__").is_dir()
        (site / "probe_package-1.0.dist-info").mkdir()
        result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert "not used (packages were installed or removed since the workers started)" in result.stderr
        assert "anndata imported before the script: False" in result.stdout


def test_idle_workers_warm_up_one_at_a_time_and_a_rule_goes_to_a_warm_one(tmp_path, monkeypatch):
    # `omicsprep workers start` asks for warm-ups on a GPU that processes share; here on the
    # CPU backend, through the same protocol: each idle worker runs rule qc_cluster's steps
    # once, one worker at a time, so that a rule coming meanwhile finds one free.
    from omicsprep import workers as pool

    with warm_workers_running(n_workers=2) as env:
        monkeypatch.setenv("OMICSPREP_RUNTIME_DIR", env["OMICSPREP_RUNTIME_DIR"])
        assert pool.warm_up("cpu", n_cells=300)["warming_up"]
        most_warming, deadline = 0, time.monotonic() + 240
        while not all((state := pool.status())["workers"][i]["warm"] for i in range(2)):
            most_warming = max(most_warming, sum(w["state"] == "warming up" for w in state["workers"]))
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
        assert most_warming == 1
        warm = {str(worker["pid"]) for worker in state["workers"]}
        result = run_script(tmp_path, "0", env=env)
        assert result.returncode == 0, result.stderr
        assert fields(result.stdout)["pid"] in warm
        assert pool.socket_path().with_suffix(".log").read_text().count("warmed up (cpu, 300 cells)") == 2


def test_workers_holding_cuda_contexts_refuse_a_rule_that_sees_other_devices(monkeypatch):
    from omicsprep.workers import _Server, fingerprint

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    server = _Server(n_workers=1, idle_seconds=60, listener=None, fingerprint=fingerprint(), holds_gpu=True)
    request = {"fingerprint": fingerprint(), "affinity": sorted(os.sched_getaffinity(0)), "env": {}}
    assert server.refusal({**request, "env": {"CUDA_VISIBLE_DEVICES": "0"}}) is None
    assert server.refusal({**request, "env": {"CUDA_VISIBLE_DEVICES": "1"}}) == (
        "the workers hold CUDA contexts on CUDA_VISIBLE_DEVICES=0; the rule sees 1"
    )
    server.holds_gpu = False  # workers without a context take the rule's devices as the rule would
    assert server.refusal({**request, "env": {"CUDA_VISIBLE_DEVICES": "1"}}) is None
