"""A worker's side: forked from the server, which imported what jobs import, it creates a CUDA context.

Then it runs each job sent as its own process would, and imports the GPU libraries while it
waits for a job.

After a job it gives back its streams, folder and environment, reports its exit status, then
collects what it left (log handlers, cycles, device memory) and says it is ready again; after
a job that failed it exits, and the server starts another. Once nothing is left to import it
says so, and the server gives jobs to such workers first.

A job may leave the matrix of an ``.h5ad`` it wrote in the worker (:func:`keep_for_next_job`):
the server gives the job that reads that file to this worker, whose reading takes the matrix
from memory (:func:`take_kept`) as long as the file is the one written (it carries the write's
token: Snakemake touches each output after its job, and a file may be replaced under its name). Rule qc's output at a
million cells is 1.1 GB that rule cluster, next in the sample's chain, read again in 3.4-5.1 s
on an H100 (``benchmarks/RESULTS.md``). A job that reads the file but not its matrix (rule atac
reads qc's cells) leaves it kept; any other job drops it, and so does a worker that gets no job
for :data:`KEPT_IDLE_SECONDS`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import logging
import os
import resource
import runpy
import select
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from omicsprep.logs import restore_root_logging, root_logging
from omicsprep.pool.protocol import close_all, receive, send

log = logging.getLogger(__name__)

# Each stage's chain of steps (what the rules' scripts call), and what else they import: the
# server imports these once and forks its workers from itself, so that each starts with them
# (Numba among them, so that every job finds it imported and sets its threads through it, not
# through its environment). None of them touches CUDA: a process forked after CUDA started
# cannot use it.
STAGE_PIPELINES = tuple(
    f"omicsprep.{stage}.pipeline" for stage in ("rna", "cells", "network", "protein", "atac", "multiome")
)
PRELOADED = (
    "snakemake.iocontainers",
    "snakemake.logging",
    "threadpoolctl",
    *STAGE_PIPELINES,
    "omicsprep.io",
    "omicsprep.plotting",
)
# GPU libraries, in the order a rule first uses them (those installed). A worker takes jobs once
# its CUDA context is up and imports these while it waits for one, a module between two looks
# at its channel: a pool's first jobs do not wait for libraries they may not use
# (rapids-singlecell alone takes 7 s), and a job imports what is not yet imported itself.
IMPORTED_WHILE_IDLE = ("cupyx.scipy.sparse", "rapids_singlecell", "cuml", "pylibcugraph")
# Then MultiQC, for rule summary (pooled): 1-4 s to import in a new process, at the run's end.
IMPORTED_WHILE_IDLE_LAST = ("multiqc",)
# A kept matrix is dropped after this long without a job: the job that reads it comes within a
# second or two, and a pool outlives its run.
KEPT_IDLE_SECONDS = 30.0

_job: dict[str, Any] = {}  # the job a worker runs: when its own process started, the worker's CPU seconds before
# Matrices of files written by this worker's last job ("kept"), and those of them that the job
# it runs reads ("offered"): the file's real path -> (the token of that write, the matrix).
_kept: dict[str, tuple[str, Any]] = {}
_offered: dict[str, tuple[str, Any]] = {}


def job_started_at() -> float | None:
    """When the job's own process started (seconds since the epoch), in a worker; ``None`` elsewhere."""
    return _job.get("started_at")


def in_worker() -> bool:
    """Whether this process is a pool worker running a job."""
    return bool(_job)


def job_usage() -> dict[str, float]:
    """The worker's peak memory (MB) and CPU seconds during its job so far (Linux), for the job's record."""
    if not _job:
        return {}
    now = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "pool_worker": os.getpid(),
        "worker_max_rss_mb": round(_peak_rss_kb() / 1024, 1),
        "worker_cpu_s": round(now.ru_utime + now.ru_stime - _job["cpu_before"], 2),
    }


def keep_for_next_job(path: str | Path, matrix: Any, *, stamp: str) -> None:
    """In a worker, keep ``matrix``, the ``X`` of the ``.h5ad`` just put in place at ``path``, for the next job.

    ``stamp`` is the token the file carries (:data:`omicsprep.io.writers.STAMP`). The caller
    changes the matrix no more. Elsewhere (a job in its own process) nothing is kept.
    """
    if _job:
        _kept[os.path.realpath(path)] = (stamp, matrix)


def take_kept(path: str | Path, *, stamp: str | None) -> Any:
    """The matrix kept for this job as ``path``'s ``X``, if the file's token ``stamp`` is its write's; else ``None``."""
    kept_stamp, matrix = _offered.pop(os.path.realpath(path), (None, None))
    if matrix is None or stamp != kept_stamp:
        return None
    log.info("%s: its matrix taken from this worker's memory, where the job that wrote it left it", path)
    return matrix


def _peak_rss_kb() -> int:
    """VmHWM, the process's peak resident memory since it started or since :func:`_reset_peak_rss`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError):  # Linux 4.0+: "5" resets the peak to the current size
        Path("/proc/self/clear_refs").write_text("5")


def preload() -> float:
    """Import :data:`PRELOADED` (in the server, before it forks workers); the seconds taken."""
    start = time.perf_counter()
    for name in PRELOADED:
        importlib.import_module(name)
    return round(time.perf_counter() - start, 2)


def _boot() -> dict[str, float]:
    """Fork the figure process; on a usable GPU, create a context. Returns seconds per stage.

    The figure process is forked first, while this process has no threads and no GPU library
    (a process forked after CUDA started must not be used).
    """
    from omicsprep import backend, background

    seconds, start = {}, time.perf_counter()
    background.keep_figure_process(preload="omicsprep.plotting")
    seconds["figures"] = time.perf_counter() - start
    if backend.gpu_unavailable_reason() is None:
        start = time.perf_counter()
        backend.cupy().cuda.runtime.free(0)  # the CUDA context
        seconds["gpu"] = time.perf_counter() - start
    return {name: round(value, 2) for name, value in seconds.items()}


def libraries_to_import() -> list[str]:
    """The installed :data:`IMPORTED_WHILE_IDLE` (on a usable GPU only), then :data:`IMPORTED_WHILE_IDLE_LAST`."""
    from omicsprep import backend

    gpu = IMPORTED_WHILE_IDLE if backend.gpu_unavailable_reason() is None else ()
    return [name for name in (*gpu, *IMPORTED_WHILE_IDLE_LAST) if importlib.util.find_spec(name.partition(".")[0])]


def import_while_idle(channel: socket.socket, modules: list[str]) -> None:
    """Import ``modules`` in order, taking each off the list, until all are imported or a job waits on ``channel``.

    A job's GPU preparation still importing is waited for first: a module is never imported by
    two threads at once. A module that fails to import is left to the job that needs it to report.
    """
    if not modules:
        return
    from omicsprep import backend

    backend.finish_preparation()
    start = time.perf_counter()
    while modules and not select.select([channel], [], [], 0)[0]:
        with contextlib.suppress(Exception):
            importlib.import_module(modules.pop(0))
    if not modules:
        log.info("worker %d imported its libraries while idle (%.2f s)", os.getpid(), time.perf_counter() - start)


def become_worker(channel_fd: int) -> NoReturn:
    """In a process just forked from the server: keep only ``channel_fd`` and the standard streams, serve jobs, exit.

    The server's other descriptors (its socket, its lock, other workers' channels, jobs'
    connections) are closed, so that none outlives the server in a worker; its signal
    handler is undone. Never returns into the server's code.
    """
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.closerange(3, channel_fd)
        os.closerange(channel_fd + 1, os.sysconf("SC_OPEN_MAX"))
        serve_jobs(channel_fd)
    except BaseException:  # noqa: BLE001 - reported in the pool's log, as an uncaught one in a process of its own
        traceback.print_exc()
    finally:  # serve_jobs ends the process itself; here only after a failure
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(1)


def serve_jobs(channel_fd: int) -> NoReturn:
    """A worker's life: boot, say so on ``channel_fd``, then run each job sent; exit after a job that failed."""
    channel = socket.socket(fileno=channel_fd)
    seconds = _boot()
    log.info("worker %d ready: %s", os.getpid(), seconds)
    send(channel, {"ready": os.getpid()})
    modules = libraries_to_import()
    settled = False
    while True:
        import_while_idle(channel, modules)
        if not modules and not settled:  # the server gives jobs to settled workers first
            send(channel, {"settled": os.getpid()})
            settled = True
        if _kept and not select.select([channel], [], [], KEPT_IDLE_SECONDS)[0]:
            _kept.clear()
        request, fds = receive(channel)
        if request is None:
            os._exit(0)
        code, job_logging = _run_job(request, fds)
        kept = list(_kept) if code == 0 else []
        send(
            channel, {"exit": code, "kept": kept}
        )  # its own process exits now: Snakemake goes on while this one tidies
        if code != 0:  # a failed or cancelled job may have left this process in any state
            os._exit(0)
        _forget_job_state(*job_logging)
        send(channel, {"ready": os.getpid()})


def _run_job(request: dict[str, Any], fds: list[int]) -> tuple[int, tuple[list[logging.Handler], int]]:
    """Run one job's script as its own process would, then give back its streams, folder and environment.

    Returns its exit status, and the log handlers and level the process had before it, for
    :func:`_forget_job_state`.
    """
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    saved = (sys.stdin, sys.stdout, sys.stderr, list(sys.argv), list(sys.path), dict(os.environ), Path.cwd())
    saved_logging = root_logging()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    close_all(fds)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    previous_umask = os.umask(request["umask"])
    sys.argv = list(request["run"])
    sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))
    _reset_peak_rss()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _job.update(started_at=request["started_at"], cpu_before=usage.ru_utime + usage.ru_stime)
    _offered.update((path, _kept[path]) for path in request["take"] if path in _kept)
    _kept.clear()
    tempfile.tempdir = None  # found again from the job's TMPDIR (Snakemake's tmpdir resource), not an earlier job's
    try:
        code = _run(sys.argv[0])
    finally:
        _job.clear()
        for path, entry in _offered.items():  # not read (its obs only, say): kept for the file's next reader
            _kept.setdefault(path, entry)
        _offered.clear()
        tempfile.tempdir = None
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        for target, fd in enumerate(saved_fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin, sys.stdout, sys.stderr, sys.argv, sys.path[:], environment, cwd = saved
        os.environ.clear()
        os.environ.update(environment)
        os.chdir(cwd)
        os.umask(previous_umask)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code, saved_logging


def _forget_job_state(handlers: list[logging.Handler], level: int) -> None:
    """What a job leaves in the process beside its outputs, given back: log handlers, timings, device memory.

    After the job's own process was told its exit status: a full collection takes 0.07-0.1 s in a
    process with the stages imported (a CPU machine), more with RAPIDS, which the next job in the
    sample's chain need not wait for.
    """
    from omicsprep import backend, timings

    restore_root_logging(handlers, level)
    logging.captureWarnings(capture=False)
    timings.reset_phases()
    if "cupy" in sys.modules:
        backend.release_device_memory()  # a full collection first: arrays in cycles hold their blocks
    else:
        gc.collect()


def _run(script: str) -> int:
    """Run ``script`` as ``__main__``; its exit status, as the interpreter would give it."""
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports an uncaught one
        traceback.print_exc()
        code = 1
    return code
