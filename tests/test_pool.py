"""The pool's workers: what a worker imports while it waits for jobs (the pool's runs: test_workflow.py)."""

from __future__ import annotations

import subprocess
import sys

IMPORTS_UNTIL_A_JOB_WAITS = """
import socket, sys
from omicsprep.pool.worker import import_while_idle

ours, theirs = socket.socketpair()
theirs.send(b"job")
modules = ["colorsys", "wave"]
import_while_idle(ours, modules)
assert modules == ["colorsys", "wave"] and "colorsys" not in sys.modules, modules
ours.recv(3)
modules.insert(1, "no_such_module_of_omicsprep")
import_while_idle(ours, modules)
assert modules == [] and {"colorsys", "wave"} <= set(sys.modules), modules
"""


def test_a_worker_imports_while_no_job_waits_and_skips_what_fails():
    """A job waiting on the channel stops the imports before the first; with none waiting every
    module is imported in turn, one that cannot be left to the job that needs it (a fresh process)."""
    run = subprocess.run([sys.executable, "-c", IMPORTS_UNTIL_A_JOB_WAITS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_a_worker_imports_the_stages_and_on_a_gpu_its_libraries_after(monkeypatch):
    """The stages' code first (every job needs some), the GPU libraries only where the GPU is usable."""
    from omicsprep import backend
    from omicsprep.pool import worker

    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: "no GPU here")
    assert worker.modules_to_import() == list(worker.PRELOADED)
    assert "omicsprep.rna.pipeline" in worker.PRELOADED
    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: None)
    on_gpu = worker.modules_to_import()
    assert on_gpu[: len(worker.PRELOADED)] == list(worker.PRELOADED)
    assert set(on_gpu[len(worker.PRELOADED) :]) <= set(worker.PRELOADED_GPU)
