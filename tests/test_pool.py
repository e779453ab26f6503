"""A pool worker's start: forked from the server, which imported what jobs import; the GPU libraries while it
waits for jobs (the pool's runs: test_workflow.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MULTIOME, pool_running

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

PRELOAD_IMPORTS_NUMBA = """
import sys
from omicsprep.pool.worker import preload
preload()
assert "numba" in sys.modules
"""

# CUDA_ERROR_NOT_INITIALIZED (3): the driver not started, so that workers forked after this can use it.
PRELOAD_LEAVES_CUDA_UNSTARTED = """
import ctypes
from omicsprep.pool.worker import preload
preload()
context = ctypes.c_void_p()
code = ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent(ctypes.byref(context))
assert code == 3, f"CUDA started by the server's imports (cuCtxGetCurrent: {code})"
"""


def test_a_worker_imports_while_no_job_waits_and_skips_what_fails():
    """After a job's GPU preparation ends, not beside it; a job waiting on the channel stops the
    imports before the first; with none waiting every module is imported in turn, one that cannot
    be left to the job that needs it (a fresh process)."""
    run = subprocess.run([sys.executable, "-c", IMPORTS_UNTIL_A_JOB_WAITS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_every_job_finds_numba_imported_and_the_gpu_libraries_come_while_idle(monkeypatch):
    """A worker starts with Numba imported (by the server it is forked from): a job sets Numba's threads
    through it, where through its environment it would clash with the threads an earlier job started (on the H100,
    53ed1b6: 'Cannot set NUMBA_NUM_THREADS to a different value once the threads have been
    launched'). The GPU libraries are imported while idle, only where the GPU is usable; MultiQC (rule
    summary's) after them, everywhere."""
    from omicsprep import backend
    from omicsprep.pool import worker

    run = subprocess.run([sys.executable, "-c", PRELOAD_IMPORTS_NUMBA], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: "no GPU here")
    assert worker.libraries_to_import() == ["multiqc"]
    monkeypatch.setattr(backend, "gpu_unavailable_reason", lambda: None)
    on_gpu = worker.libraries_to_import()
    assert on_gpu == [name for name in (*worker.IMPORTED_WHILE_IDLE, "multiqc") if name in on_gpu]
    assert on_gpu[-1] == "multiqc"


@pytest.mark.gpu
def test_the_servers_imports_leave_cuda_unstarted_for_the_workers_it_forks():
    """A process forked after CUDA started cannot use it: the server imports what jobs import, not CUDA."""
    run = subprocess.run([sys.executable, "-c", PRELOAD_LEAVES_CUDA_UNSTARTED], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:  # ended meanwhile
                continue
            if f"\nPPid:\t{pid}\n" in status:
                found.append(int(entry.name))
    return found


def listening_inode(path: Path) -> str:
    """The inode of the Unix socket listening at ``path`` (``/proc/net/unix``)."""
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[7] == str(path):
            return fields[6]
    raise AssertionError(f"nothing listens at {path}")


@pytest.mark.skipif(sys.platform != "linux", reason="the pool runs on Linux")
def test_workers_are_forked_from_the_server_and_keep_none_of_its_descriptors():
    """The server forks its workers after importing what jobs import (the log says how long); each says
    when it is done importing while idle (MultiQC, here). A worker holds none of the server's
    descriptors: one holding its socket would keep accepting jobs that no one serves once the server
    ended, one holding its lock would keep the next pool from starting."""
    from omicsprep import pool

    with pool_running(n_workers=2) as env:
        path = Path(env[pool.POOL])
        deadline = time.monotonic() + 60
        while (state := pool.status(path))["workers"] != ["ready"] * 2 or state["importing"]:
            assert time.monotonic() < deadline, f"the workers did not settle: {state}"
            time.sleep(0.1)
        command = Path(f"/proc/{state['server']}/cmdline").read_bytes()
        workers = [pid for pid in children(state["server"]) if Path(f"/proc/{pid}/cmdline").read_bytes() == command]
        assert len(workers) == 2, (workers, children(state["server"]))
        held = {str(fd.readlink()) for pid in workers for fd in Path(f"/proc/{pid}/fd").iterdir()}
        assert f"socket:[{listening_inode(path)}]" not in held
        assert str(path.with_suffix(".lock")) not in held
        assert "imported what jobs import in" in path.with_suffix(".log").read_text()


def test_jobs_go_first_to_workers_done_importing_while_idle():
    """A job given to a worker in the middle of an import while idle waits for it (MultiQC's delayed a
    100,000-cell cluster job by 0.9 s on an H100 while seven workers had nothing left to import)."""
    import os
    import socket

    from omicsprep.pool.protocol import receive
    from omicsprep.pool.server import _Forked, _Server, _Worker

    listener, _ = socket.socketpair()
    server = _Server(n_workers=0, idle_seconds=60, listener=listener, fingerprint={}, kernels=None)
    channels = [socket.socketpair() for _ in range(2)]
    importing, settled = (_Worker(_Forked(os.getpid()), ours, ready=True, booted=True) for ours, _ in channels)
    settled.settled = True
    server.workers = [importing, settled]
    job, _its_process = socket.socketpair()
    server.waiting.append(
        (job, {"run": ["qc.py"], "cwd": "/", "env": {}, "umask": 0o022, "started_at": 0.0, "inputs": []}, [])
    )
    assert server.status()["importing"] == 1
    server.dispatch()
    assert settled.client is job and importing.client is None
    assert receive(channels[1][1])[0]["run"] == ["qc.py"]


def test_a_job_that_would_rather_not_wait_runs_in_its_own_process_when_no_worker_is_free():
    """The run's last jobs (rules summary and run_times) take a free worker, but do not queue behind GPU
    jobs (nor hold them up): the pool says it is busy, and the job runs in its own process."""
    import os
    import socket

    from omicsprep.pool.protocol import receive
    from omicsprep.pool.server import _Forked, _Server, _Worker

    listener, _ = socket.socketpair()
    server = _Server(n_workers=0, idle_seconds=60, listener=listener, fingerprint={}, kernels=None)
    ours, _theirs = socket.socketpair()
    worker = _Worker(_Forked(os.getpid()), ours, ready=True, booted=True, settled=True)
    server.workers = [worker]
    request = {
        "run": ["summary.py"],
        "cwd": "/",
        "env": {},
        "umask": 0o022,
        "started_at": 0.0,
        "fingerprint": {},
        "inputs": [],
    }
    gpu_job, _ = socket.socketpair()
    server.waiting.append((gpu_job, {**request, "run": ["qc.py"]}, []))
    summary, its_process = socket.socketpair()
    its_process.settimeout(10)  # no answer: the job would wait in the pool
    server.answer(summary, {**request, "wait": False}, [])
    assert receive(its_process)[0] == {"busy": True} and len(server.waiting) == 1
    server.waiting.clear()
    worker.ready = False  # tidying after its last job: free in a moment
    summary, its_process = socket.socketpair()
    server.answer(summary, {**request, "wait": False}, [])
    assert [job for job, _, _ in server.waiting] == [summary]


def test_a_job_goes_to_the_worker_that_keeps_its_inputs_matrix_and_waits_while_it_tidies():
    """Rule cluster reads the file whose matrix rule qc's job left in its worker: the job goes there,
    even while that worker tidies after qc and another is ready; a job reading other files does not. A
    worker that wrote the file again makes the other's copy stale."""
    import os
    import socket

    from omicsprep.pool.protocol import receive, send
    from omicsprep.pool.server import _Forked, _Server, _Worker

    listener, _ = socket.socketpair()
    server = _Server(n_workers=0, idle_seconds=60, listener=listener, fingerprint={}, kernels=None)
    channels = [socket.socketpair() for _ in range(2)]
    keeping, other = (_Worker(_Forked(os.getpid()), ours, booted=True, settled=True) for ours, _ in channels)
    keeping.kept, other.ready = frozenset({"/results/a/qc.h5ad"}), True
    server.workers = [keeping, other]
    request = {"cwd": "/", "env": {}, "umask": 0o022, "started_at": 0.0, "inputs": []}
    cluster, _cluster_process = socket.socketpair()
    server.waiting.append((cluster, {**request, "run": ["cluster.py"], "inputs": ["/results/a/qc.h5ad"]}, []))
    server.dispatch()  # the keeping worker tidies: the job waits for it
    assert [job for job, _, _ in server.waiting] == [cluster] and other.client is None
    other_sample, _other_process = socket.socketpair()
    server.waiting.append((other_sample, {**request, "run": ["cluster.py"], "inputs": ["/results/b/qc.h5ad"]}, []))
    server.dispatch()
    assert other.client is other_sample and [job for job, _, _ in server.waiting] == [cluster]
    keeping.ready = True
    assert server.worker_for({"/results/c/counts.h5"}) is keeping  # the only one free
    other.client = None
    assert server.worker_for({"/results/c/counts.h5"}) is other  # keeping nothing: the kept matrix stays
    other.client = other_sample
    server.dispatch()
    assert keeping.client is cluster and not server.waiting
    assert receive(channels[0][1])[0]["take"] == ["/results/a/qc.h5ad"]
    assert keeping.kept == frozenset()  # the worker takes it in the job, or drops it

    keeping.kept = frozenset({"/results/a/qc.h5ad"})  # a stale copy: rule qc ran again in the other worker
    other.channel.close()
    other.channel, theirs = socket.socketpair()
    send(theirs, {"exit": 0, "kept": ["/results/a/qc.h5ad"]})
    server.hear_from(other)
    assert other.kept == frozenset({"/results/a/qc.h5ad"}) and keeping.kept == frozenset()


# A job whose leftovers, collected by the worker after it, hold the worker until `release` exists.
JOB_WITH_LEFTOVERS = """
import gc, sys, time
from pathlib import Path
from omicsprep import pool

pool.hand_over(started_at=time.time())  # the rest runs in the worker
gc.disable()  # so that the cycle below outlives the job, until the worker collects


class Leftover:
    def __del__(self, release=Path(sys.argv[1])):  # the worker's own arguments are back by then
        while not release.exists():
            time.sleep(0.05)
        release.with_name("collected").touch()
        gc.enable()


leftover = Leftover()
leftover.cycle = leftover
del leftover
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the pool runs on Linux")
def test_a_jobs_own_process_ends_before_its_worker_tidies_after_it(tmp_path):
    """The worker tells the job's own process its exit status first, then collects what the job left
    (full collections, slow in a process with RAPIDS imported, which Snakemake need not wait for), and only then
    takes another job."""
    from omicsprep import pool

    script, release = tmp_path / "job.py", tmp_path / "release"
    script.write_text(JOB_WITH_LEFTOVERS)
    with pool_running(n_workers=1) as env:
        path = Path(env[pool.POOL])
        try:
            job = subprocess.run(
                [sys.executable, str(script), str(release)], env=env, capture_output=True, text=True, timeout=120
            )
            assert job.returncode == 0, job.stderr
            assert not (tmp_path / "collected").exists()
            assert pool.status(path)["workers"] == ["tidying"]
        finally:
            release.touch()  # the worker goes on, and the pool can stop
        deadline = time.monotonic() + 60
        while pool.status(path)["workers"] != ["ready"]:
            assert time.monotonic() < deadline, pool.status(path)
            time.sleep(0.05)
        assert (tmp_path / "collected").exists()


# A job that reports the temporary folder Python gives it.
JOB_REPORTING_ITS_TEMPORARY_FOLDER = """
import sys, tempfile, time
from pathlib import Path
from omicsprep import pool

pool.hand_over(started_at=time.time())  # the rest runs in the worker
Path(sys.argv[1]).write_text(f"{tempfile.gettempdir()} {pool.in_worker()}")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the pool runs on Linux")
def test_each_job_in_a_worker_gets_its_own_temporary_folder(tmp_path):
    """Python finds its temporary folder once per process, from TMPDIR (which Snakemake sets per job from
    its tmpdir resource): a worker's later jobs were given its first job's, gone after it (MultiQC, run
    by rule summary in the pool, asks for one in every run)."""
    script = tmp_path / "job.py"
    script.write_text(JOB_REPORTING_ITS_TEMPORARY_FOLDER)
    with pool_running(n_workers=1) as env:
        for name in ("first", "second"):
            (tmp_path / name).mkdir()
            job = subprocess.run(
                [sys.executable, str(script), str(tmp_path / f"{name}.txt")],
                env={**env, "TMPDIR": str(tmp_path / name)},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert job.returncode == 0, job.stderr
            assert (tmp_path / f"{name}.txt").read_text() == f"{tmp_path / name} True"  # run by the worker


# Rule qc's end and rule cluster's start, as jobs of one worker: "write" writes a sample's counts as qc
# writes its cells (deflated, the matrix kept, marked here), "read" reads the file as cluster does and
# pickles what it got, "obs" reads the file but not its matrix; "other" reads nothing.
JOB_WRITING_OR_READING_A_MATRIX = """
import pickle, sys, time
from omicsprep import io, pool

what, h5ad, counts = sys.argv[1:]
pool.hand_over(started_at=time.time(), inputs=[h5ad] if what in ("read", "obs") else [counts])
if what == "obs":  # reads the file, but not its matrix (rule atac reads qc's cells)
    io.read_h5ad(h5ad, skip=("X",))
elif what == "write":
    adata = io.read_counts(counts)
    adata.X.marked_by_the_writer = True
    io.write_h5ad(adata, h5ad, compression="gzip", keep_matrix=True)
elif what == "read":
    matrix = io.read_h5ad(h5ad).X
    taken = getattr(matrix, "marked_by_the_writer", False)
    with open(h5ad + ".read.pickle", "wb") as report:
        pickle.dump((taken, pool.in_worker(), matrix), report)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the pool runs on Linux")
def test_a_matrix_left_by_a_job_is_taken_from_memory_by_the_next_that_reads_its_file(tmp_path):
    """Rule cluster read again the 1.1 GB that rule qc had just written at a million cells (3.4-3.6 s on
    an H100). In a worker it takes the matrix qc's job left, as reading gives it (type, dtypes, values),
    and reads the file when another job ran in between or the file is no longer the one written (replaced,
    or written again in place: the same inode, maybe the same size)."""
    import os
    import pickle
    import shutil

    import anndata as ad

    script, h5ad = tmp_path / "job.py", tmp_path / "qc.h5ad"
    script.write_text(JOB_WRITING_OR_READING_A_MATRIX)
    counts = MULTIOME / "rna.h5ad"
    with pool_running(n_workers=1) as env:

        def run(*steps: str) -> tuple[bool, bool, object]:
            for what in steps:
                job = subprocess.run(
                    [sys.executable, str(script), what, str(h5ad), str(counts)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert job.returncode == 0, job.stderr
            with Path(f"{h5ad}.read.pickle").open("rb") as report:
                return pickle.load(report)

        taken, in_worker, matrix = run("write", "read")
        assert taken and in_worker
        from_disk = ad.read_h5ad(h5ad).X
        assert type(matrix) is type(from_disk) and matrix.shape == from_disk.shape
        assert [a.dtype for a in (matrix.data, matrix.indices, matrix.indptr)] == [
            a.dtype for a in (from_disk.data, from_disk.indices, from_disk.indptr)
        ]
        assert (matrix != from_disk).nnz == 0
        assert run("read")[0] is False  # taken once
        assert run("write", "other", "read")[0] is False  # dropped by a job that did not read it
        assert run("write", "obs", "read")[0] is True  # left by a job that read the file but not the matrix
        run("write")
        os.utime(h5ad)  # as Snakemake touches each output after its job
        assert run("read")[0] is True
        copy = tmp_path / "copy.h5ad"
        ad.read_h5ad(h5ad).write_h5ad(copy)
        for replace in (copy.replace, lambda target: shutil.copyfile(copy, target)):  # another file; in place
            run("write")
            ad.read_h5ad(h5ad).write_h5ad(copy)
            replace(h5ad)  # written again by another process
            taken, _, matrix = run("read")
            assert not taken and (matrix != from_disk).nnz == 0


@pytest.mark.skipif(sys.platform != "linux", reason="the pool runs on Linux")
def test_a_pool_outlives_the_folder_it_was_started_from(tmp_path):
    """The pool outlives the run that started it; a worker went back to that run's folder after each
    job, and once the folder was deleted it failed every job."""
    import shutil

    script, run = tmp_path / "job.py", tmp_path / "run"
    script.write_text(JOB_REPORTING_ITS_TEMPORARY_FOLDER)
    run.mkdir()
    with pool_running(n_workers=1, cwd=run) as env:
        shutil.rmtree(run)
        for name in ("first", "second"):
            job = subprocess.run(
                [sys.executable, str(script), str(tmp_path / f"{name}.txt")],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                cwd=tmp_path,
            )
            assert job.returncode == 0, job.stderr
            assert (tmp_path / f"{name}.txt").read_text().endswith(" True")  # run by the worker


def test_jobs_and_their_pool_see_the_same_packages_through_a_relative_python_path(tmp_path):
    """The server runs in /, jobs in their runs' folders: with PYTHONPATH=extra each found other packages
    (and the server would import from /extra), so the pool refused every job and was started again in every
    run. The server is given the folders as found from the run's (client.start); both see the same."""
    import json
    import os

    run = tmp_path / "run"
    (run / "extra").mkdir(parents=True)
    code = "import json; from omicsprep.pool import protocol; print(json.dumps(protocol.fingerprint()))"

    def fingerprint(python_path: str, cwd: Path) -> dict:
        env = {**os.environ, "PYTHONPATH": python_path}
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    job, server = fingerprint("extra", run), fingerprint(str(run / "extra"), Path("/"))
    assert (job["settings"], job["packages"]) == (server["settings"], server["packages"])
    assert len(job["packages"]) == len(fingerprint("", run)["packages"]) + 1  # the folder is counted
