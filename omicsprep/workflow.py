"""Plumbing shared by the workflow's scripts: logging to the rule's log, clear errors, shared rule bodies."""

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
from omicsprep.timings import phase, phase_seconds

if TYPE_CHECKING:
    from types import ModuleType

    import numpy as np
    import pandas as pd
    from anndata import AnnData

    from omicsprep.backend import Backend
    from omicsprep.io import H5adParts

log = logging.getLogger("omicsprep")


def run_script(
    main: Callable[[], None],
    *,
    log_path: str | Path,
    sample: str | None = None,
    threads: int = 1,
    backend: str | None = None,
) -> None:
    """Run a rule's script body with logging to ``log_path`` and one-line user errors.

    A job whose backend may be the GPU (``backend`` ``auto`` or ``gpu``) first hands itself
    to the workflow's pool of warm processes, where one runs (:func:`omicsprep.pool.hand_over`);
    the script then runs in a worker of the pool, and this process exits with its status.
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
    """
    startup = seconds_since_process_start()
    if backend in ("auto", "gpu"):
        pool.hand_over(started_at=time.time() - (startup or 0.0))
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


def run_rule(main: Callable[[], None], snakemake: Any, *, sample: str | None = None, pooled: bool = True) -> None:
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
        Whether the GPU pool may run a rule whose params hold a backend.
    """
    run_script(
        main,
        log_path=snakemake.log[0],
        sample=sample or snakemake.wildcards.get("sample"),
        threads=snakemake.threads,
        backend=snakemake.params.get("backend") if pooled else None,
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


def quality_control(adata: AnnData, *, snakemake: Any, backend: Backend) -> tuple[AnnData, pd.DataFrame]:
    """Rule qc's work (:func:`omicsprep.rna.pipeline.run_qc`).

    The pipeline is imported here (:func:`_pipeline`).

    Parameters
    ----------
    adata
        The sample's raw counts, in host memory.
    snakemake
        The rule's ``snakemake`` object: params ``qc``, ``doublets`` and ``seed``; its log.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The cells that passed and every input cell's metrics, as :func:`~omicsprep.rna.pipeline.run_qc` returns them.

    Raises
    ------
    TooFewCellsError
        Too few cells passed; every input cell's metrics are written beside the rule's log first.
    """
    from omicsprep import io
    from omicsprep.errors import TooFewCellsError
    from omicsprep.options import DoubletOptions, QcOptions, from_config

    try:
        return _pipeline().run_qc(
            adata,
            options=from_config(QcOptions, snakemake.params.qc),
            doublet_options=from_config(DoubletOptions, snakemake.params.doublets),
            seed=snakemake.params.seed,
            backend=backend,
        )
    except TooFewCellsError as exc:  # the table beside the log: Snakemake removes a failed job's outputs
        beside_log = Path(snakemake.log[0]).with_suffix(".cell_metrics.parquet")
        io.write_table(exc.metrics, beside_log, index=True)
        raise TooFewCellsError(f"{exc.problem} (each cell's metrics and fail reason: {beside_log})") from None


def write_qc(adata: AnnData, metrics: pd.DataFrame, *, snakemake: Any) -> None:
    """Rule qc's tables and AnnData, from the cells that passed (brought to host memory first).

    Parameters
    ----------
    adata
        The cells that passed QC, in host memory or on the GPU.
    metrics
        Every input cell's QC metrics.
    snakemake
        The rule's ``snakemake`` object: outputs ``metrics`` and ``h5ad``, config ``h5ad_compression``.
    """
    from omicsprep import io
    from omicsprep.backend import to_host

    to_host(adata)
    io.write_table(metrics, snakemake.output.metrics, index=True)
    io.write_h5ad(adata, snakemake.output.h5ad, compression=snakemake.config["h5ad_compression"])


def cluster(
    adata: AnnData, *, snakemake: Any, backend: Backend, after_step: Callable[[str, AnnData], None] | None = None
) -> pd.DataFrame:
    """Rule cluster's work on QC'd cells, in place.

    Parameters
    ----------
    adata
        The cells that passed QC, in host memory or on the GPU; back in host memory after.
    snakemake
        The rule's ``snakemake`` object: params ``steps`` and ``seed``.
    backend
        ``"cpu"`` or ``"gpu"``.
    after_step
        Called as each step ends (:func:`omicsprep.rna.pipeline.run_clustering`).

    Returns
    -------
    The marker genes table.
    """
    from omicsprep.options import ClusteringOptions, from_config

    options = from_config(ClusteringOptions, snakemake.params.steps)
    return _pipeline().run_clustering(
        adata, options=options, seed=snakemake.params.seed, backend=backend, after_step=after_step
    )


def _pipeline() -> ModuleType:
    """:mod:`omicsprep.rna.pipeline`, imported at first use (phase ``imports``).

    A GPU rule imports it after its start-up began (:func:`omicsprep.backend.prepare_gpu`):
    creating the CUDA context, which lets Python run, overlaps this import.
    """
    with phase("imports"):
        return importlib.import_module("omicsprep.rna.pipeline")


def write_clustering(adata: AnnData, markers: pd.DataFrame, *, snakemake: Any, h5ad: str | H5adParts) -> None:
    """Rule cluster's outputs: the markers, the cells' table and the AnnData.

    Parameters
    ----------
    adata
        The clustered cells, in host memory.
    markers
        The marker genes table.
    snakemake
        The rule's ``snakemake`` object: outputs ``obs`` and ``markers``, config ``h5ad_compression``.
    h5ad
        Where the processed AnnData goes, or its file with the matrices written already
        (:func:`write_normalized`), finished here.
    """
    from omicsprep import io

    io.write_table(markers, snakemake.output.markers)
    io.write_table(adata.obs, snakemake.output.obs, index=True)
    if isinstance(h5ad, str):
        io.write_h5ad(adata, h5ad, compression=snakemake.config["h5ad_compression"])
    else:
        h5ad.finish(adata)


def write_normalized(processed: H5adParts, adata: AnnData, *, counts: Any) -> None:
    """Write the processed AnnData's normalized matrix and counts, final before clustering ends.

    Parameters
    ----------
    processed
        The processed AnnData's file.
    adata
        The cells being clustered, with ``X`` normalized (in host memory or on the GPU).
    counts
        Their counts in host memory, as read from rule qc's output (``layers["counts"]``
        holds the same values, on the GPU there).
    """
    from omicsprep.backend import asnumpy

    normalized = asnumpy(adata.X)
    processed.write("X", normalized)
    processed.write_layers({"counts": counts}, x=normalized)


def write_qc_figures(metrics: pd.DataFrame, *, sample: str, histograms: str, scatter: str) -> None:
    """Draw and write the QC figures of every input cell (rule qc, in its second process).

    Parameters
    ----------
    metrics
        The QC metrics table of :func:`omicsprep.rna.pipeline.run_qc`.
    sample
        The figures' title.
    histograms, scatter
        Where the histograms and the UMIs-against-genes scatter go.
    """
    from omicsprep import io, plotting

    io.write_figure(plotting.qc_histograms(metrics, title=sample), histograms)
    io.write_figure(plotting.qc_scatter(metrics, title=sample), scatter)


def write_embedding_figure(coords: np.ndarray, obs: pd.DataFrame, *, sample: str, keys: list[str], path: str) -> None:
    """Draw and write the UMAP with a panel per column of ``obs`` among ``keys`` (those present).

    Rule cluster draws the metrics' figure once UMAP is done, beside clustering, and the
    clusters' after.

    Parameters
    ----------
    coords
        The UMAP coordinates, one row per cell.
    obs
        The cells' table.
    sample
        The figure's title.
    keys
        The columns to colour by.
    path
        Where the figure goes.
    """
    from omicsprep import io, plotting

    present = [key for key in keys if key in obs]
    io.write_figure(plotting.embedding_panels(coords, obs, keys=present, title=sample), path)


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
    ``benchmarks/run.py`` and rule run_times read it back from the rule's log. A job run by
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
