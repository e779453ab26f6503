"""A pool worker's imports: before its first job, and while it waits for jobs (the pool's runs: test_workflow.py)."""

from __future__ import annotations

import subprocess
import sys

IMPORTS_UNTIL_A_JOB_WAITS = """
import socket, sys, threading, time
from omicsprep.backend import libraries
from omicsprep.pool.worker import import_while_idle

preparing = threading.Thread(target=time.sleep, args=(0.3,))  # a job's GPU preparation, still importing
libraries._preparation.append(preparing)
preparing.start()
ours, theirs = socket.socketpair()
theirs.send(b"job")
modules = ["colorsys", "wave"]
import_while_idle(ours, modules)
assert not preparing.is_alive(), "imported beside the preparation's thread"
assert modules == ["colorsys", "wave"] and "colorsys" not in sys.modules, modules
ours.recv(3)
modules.insert(1, "no_such_module_of_omicsprep")
import_while_idle(ours, modules)
assert modules == [] and {"colorsys", "wave"} <= set(sys.modules), modules
"""

BOOT_IMPORTS_NUMBA = """
import importlib, sys
from omicsprep.pool.worker import PRELOADED
for name in PRELOADED:
    importlib.import_module(name)
assert "numba" in sys.modules
"""


def test_a_worker_imports_while_no_job_waits_and_skips_what_fails():
    """After a job's GPU preparation ends, not beside it; a job waiting on the channel stops the
    imports before the first; with none waiting every module is imported in turn, one that cannot
    be left to the job that needs it (a fresh process)."""
    run = subprocess.run([sys.executable, "-c", IMPORTS_UNTIL_A_JOB_WAITS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_every_job_finds_numba_imported_and_the_gpu_libraries_come_while_idle(monkeypatch):
    """A worker imports Numba before its first job: a job sets Numba's threads through it, where
    through its environment it would clash with the threads an earlier job started (on the H100,
    53ed1b6: 'Cannot set NUMBA_NUM_THREADS to a different value once the threads have been
    launched'). The GPU libraries are imported while idle, only where the GPU is usable."""
    from omicsprep import backend
    from omicsprep.pool import worker

    run = subprocess.run([sys.executable, "-c", BOOT_IMPORTS_NUMBA], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: "no GPU here")
    assert worker.gpu_libraries_to_import() == []
    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: None)
    on_gpu = worker.gpu_libraries_to_import()
    assert on_gpu == [name for name in worker.IMPORTED_WHILE_IDLE if name in on_gpu]
