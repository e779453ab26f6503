"""A rule's job as a process: its log, one-line errors, threads and memory, phases, and its end.

Every rule's script runs its body through :func:`run_rule`, which hands a GPU job to the
workflow's pool of warm processes (:mod:`omicsprep.pool`) or runs it here.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omicsprep import pool
from omicsprep.errors import BackendUnavailableError, InputError, OutOfMemoryError, OutOfSpaceError
from omicsprep.jit_cache import cache_sparse_matrix_kernels
from omicsprep.timings import phase, phase_seconds

if TYPE_CHECKING:
    from types import ModuleType

log = logging.getLogger("omicsprep")


def run_script(
    main: Callable[[], None],
    *,
    log_path: str | Path,
    sample: str | None = None,
    threads: int = 1,
    backend: str | None = None,
    pooled: bool = False,
    wait_for_worker: bool = True,
    inputs: list[str] | None = None,
) -> None:
    """Run a rule's script body with logging to ``log_path`` and one-line user errors.

    A pooled job first hands itself to the workflow's pool of warm processes, where one runs
    (:func:`omicsprep.pool.hand_over`); the script then runs in a worker of the pool, and this
    process exits with its status.
    Logging, warnings and standard error (the C libraries' too, such as HDF5's error
    stack) go to the log. Bad input, an unusable backend, a full disk (or too little room
    to start an output) and memory running out while writing end the rule with a single
    message naming the sample, the file and the problem, on the console and in the log
    (with the traceback for the last two); anything else keeps its
    traceback, in the log. SIGTERM (a cancelled job) unwinds the script, so that no
    temporary output is left behind. A body that succeeds ends the process at once
    (:func:`exit_at_once`), unless a pool worker runs it, which gives back what it took.

    Parameters
    ----------
    main
        The script's body.
    log_path
        The rule's log file.
    sample
        The sample the rule works on, named in errors.
    threads
        The rule's threads: BLAS/OpenMP pools and Numba use no more.
    backend
        The rule's configured backend, for a rule that may use the GPU.
    pooled
        Whether the workflow's pool of warm processes runs the job, where there is one.
    wait_for_worker
        Whether a pooled job waits for a worker, or runs in its own process when none is free.
    inputs
        The job's input files, for the pool to choose its worker.
    """
    startup = seconds_since_process_start()
    if pooled:
        pool.hand_over(started_at=time.time() - (startup or 0.0), inputs=inputs or (), wait=wait_for_worker)
    console = os.fdopen(os.dup(2), "w", buffering=1)
    log_file = Path(log_path).open("w", buffering=1)  # noqa: SIM115 - closed at the end (a pool worker goes on)
    os.dup2(log_file.fileno(), 2)
    sys.stderr = log_file
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    logging.basicConfig(
        stream=log_file, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    logging.captureWarnings(capture=True)
    limit_threads(threads)
    if backend is not None:  # a computing rule: it imports Numba anyway
        cache_sparse_matrix_kernels()
    return_freed_memory()
    started = time.perf_counter()
    try:
        main()
        log_phases(startup=startup, body=time.perf_counter() - started)
    except InputError as exc:
        if exc.sample is None and sample is not None:
            exc = exc.for_sample(sample)
        log.error("%s", exc)
        print(f"omicsprep error: {exc}", file=console)
        sys.exit(1)
    except (BackendUnavailableError, OutOfSpaceError, OutOfMemoryError) as exc:
        log.error("%s", exc, exc_info=not isinstance(exc, BackendUnavailableError))
        print(f"omicsprep error: sample {sample!r}: {exc}" if sample else f"omicsprep error: {exc}", file=console)
        sys.exit(1)
    except Exception:
        log.exception("failed")
        raise
    finally:
        if pool.in_worker():  # it goes on: what this job opened is closed (standard error is the log until then)
            sys.stderr = sys.__stderr__
            for stream in (console, log_file):
                stream.close()
    exit_at_once(log_file, console)


def run_rule(
    main: Callable[[], None],
    snakemake: Any,
    *,
    sample: str | None = None,
    pooled: bool | None = None,
    wait_for_worker: bool = True,
) -> None:
    """:func:`run_script` for a rule's script: its log, sample, threads and backend from ``snakemake``.

    Parameters
    ----------
    main
        The script's body.
    snakemake
        The rule's ``snakemake`` object.
    sample
        The sample named in errors, where the rule has no ``sample`` wildcard.
    pooled
        Whether the workflow's pool of warm processes runs the job, where there is one; by
        default, where the rule's params hold a backend that may be the GPU.
    wait_for_worker
        Whether a pooled job waits for a worker, or runs in its own process when none is free.
    """
    backend = snakemake.params.get("backend")
    run_script(
        main,
        log_path=snakemake.log[0],
        sample=sample or snakemake.wildcards.get("sample"),
        threads=snakemake.threads,
        backend=backend,
        pooled=backend in ("auto", "gpu") if pooled is None else pooled,
        wait_for_worker=wait_for_worker,
        inputs=[str(path) for path in snakemake.input],
    )


def exit_at_once(*streams: Any) -> None:
    """End a rule's process that succeeded without the interpreter's teardown; in a pool worker, return.

    Every output is closed and renamed by then. The interpreter's teardown (a GPU rule's
    CUDA context and memory pools, large arrays, module after module) is left to the
    system, which frees it all at once.
    """
    if pool.in_worker():
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, *streams):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


def import_timed(module: str) -> ModuleType:
    """``module``, imported at first use and counted as the job's ``imports`` phase.

    A GPU rule imports its pipeline after its start-up began (:func:`omicsprep.backend.prepare_gpu`):
    creating the CUDA context, which lets Python run, overlaps this import.
    """
    with phase("imports"):
        return importlib.import_module(module)


def seconds_since_process_start() -> float | None:
    """Seconds since this process started (Linux; ``None`` elsewhere): for a rule, its start-up and imports.

    In a pool worker (:mod:`omicsprep.pool`), since the job's own process started.
    """
    if (started_at := pool.job_started_at()) is not None:
        return max(0.0, time.time() - started_at)
    with contextlib.suppress(OSError, ValueError, IndexError, AttributeError):
        # Field 22 of /proc/self/stat: the start, in clock ticks of the boot-time clock (the
        # name in field 2 may hold spaces).
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    return None


PHASES_PREFIX = "phases "


def log_phases(*, startup: float | None, body: float) -> None:
    """Log, as one JSON line after :data:`PHASES_PREFIX`, where the rule's time went.

    ``startup`` (process start to the script's body), ``body`` (the body), and within the
    body the seconds of each :func:`omicsprep.timings.phase` (``read``, ``write``,
    ``gpu_import``, ``imports``); and the process's start and this moment (``started_at``, ``ended_at``,
    seconds since the epoch), which place the rule on the run's timeline.
    ``benchmarks/e2e.py`` and rule run_times read it back from the rule's log. A job run by
    a pool worker adds the worker's pid, its peak memory and its CPU seconds during the job
    (``pool_worker``, ``worker_max_rss_mb``, ``worker_cpu_s``): the rule's ``benchmark:``
    file measures the job's own process, which waited.
    """
    ended_at = time.time()
    seconds = {"startup": startup, "body": body, **phase_seconds()}
    line: dict[str, Any] = {name: round(value, 4) for name, value in seconds.items() if value is not None}
    line |= {"started_at": round(ended_at - body - (startup or 0.0), 3), "ended_at": round(ended_at, 3)}
    line |= pool.job_usage()
    log.info("%s%s", PHASES_PREFIX, json.dumps(line))


def read_phases(log_path: str | Path) -> dict[str, Any] | None:
    """The phases line :func:`log_phases` wrote into a rule's log; ``None`` when there is none."""
    path = Path(log_path)
    if not path.is_file():
        return None
    lines = [line for line in path.read_text(errors="replace").splitlines() if f" {PHASES_PREFIX}{{" in line]
    return json.loads(lines[-1].split(f" {PHASES_PREFIX}", 1)[1]) if lines else None


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)


def limit_threads(threads: int) -> None:
    """Keep BLAS/OpenMP pools and Numba within ``threads`` (a rule's share of the cores).

    Numba is told through its environment variable when not imported yet (a light rule
    need not pay for importing it).
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    if "numba" in sys.modules:
        numba = sys.modules["numba"]
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    else:
        os.environ["NUMBA_NUM_THREADS"] = str(max(1, min(threads, os.cpu_count() or 1)))


MMAP_THRESHOLD = 4 << 20  # bytes; glibc's M_MMAP_THRESHOLD
M_MMAP_THRESHOLD = -3


def return_freed_memory() -> None:
    """Give large freed buffers back to the system at once, so that a rule's memory follows what it holds.

    Chunked steps then keep one chunk, not the largest ever seen.

    glibc serves every allocation of 4 MB or more by its own mapping (by default the
    threshold rises to 32 MB as buffers are freed, and smaller ones then fragment the
    heap; a mapping also grows in place on realloc), and Arrow allocates through the
    system allocator rather than keeping its own pool of freed memory.
    """
    import ctypes
    import ctypes.util

    if "pyarrow" in sys.modules:
        pa = sys.modules["pyarrow"]
        pa.set_memory_pool(pa.system_memory_pool())
    else:  # read when Arrow first allocates (a light rule need not pay for importing it)
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "mallopt"):  # glibc (Linux); elsewhere the defaults stay
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
