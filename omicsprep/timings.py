"""Where a rule's time goes: its phases (start-up, reading, writing), and the run-time tables.

A rule is a process. :func:`omicsprep.jobs.run_script` times its start-up (interpreter
and imports) and its body; the readers and writers of :mod:`omicsprep.io` count their seconds
as ``read`` and ``write``, :mod:`omicsprep.backend` its import of the GPU libraries as
``gpu_import``, and :mod:`omicsprep.io` (a reader's or writer's module, at first use) and
:mod:`omicsprep.jobs` (the pipeline) their imports as ``imports``, through
:func:`phase`. The steps inside (computing, device transfers) are timed by
:class:`omicsprep.provenance.StepTimer`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    import pandas as pd

_phase_seconds: dict[str, float] = {}
_open = threading.local()  # each thread's open phase, so that a background writer's phases nest apart

P = ParamSpec("P")
R = TypeVar("R")


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the enclosed block's seconds towards this process's phase ``name``.

    A phase inside another of the same thread counts once, as the outer one (a table
    written by a writer of several files is that writer's writing).
    """
    if getattr(_open, "name", None) is not None:
        yield
        return
    _open.name = name
    start = time.perf_counter()
    try:
        yield
    finally:
        _open.name = None
        _phase_seconds[name] = _phase_seconds.get(name, 0.0) + time.perf_counter() - start


def timed_phase(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function so that its calls count towards phase ``name`` (see :func:`phase`)."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def timed(*args: P.args, **kwargs: P.kwargs) -> R:
            with phase(name):
                return function(*args, **kwargs)

        return timed

    return decorate


def phase_seconds() -> dict[str, float]:
    """Seconds per phase so far in this process (in a pool worker, in its job)."""
    return dict(_phase_seconds)


def reset_phases() -> None:
    """Forget the phases counted so far: a pool worker's next job counts its own."""
    _phase_seconds.clear()


def run_time_table(
    benchmarks: Mapping[tuple[str, str], pd.DataFrame],
    provenance: Mapping[tuple[str, str], Mapping],
    phases: Mapping[tuple[str, str], Mapping] | None = None,
) -> pd.DataFrame:
    """One row per (sample, rule, step): seconds, and peak memory for whole rules.

    Parameters
    ----------
    benchmarks
        ``(sample, rule)`` to the rule's ``benchmark:`` table (Snakemake's columns).
    provenance
        ``(sample, rule)`` to its ``uns["omicsprep"][rule]`` record (backend, timings).
    phases
        ``(sample, rule)`` to the ``phases`` line of its log (:func:`omicsprep.jobs.read_phases`):
        a job run by a worker of the GPU pool (:mod:`omicsprep.pool`) has the worker's peak memory there.

    Returns
    -------
    Columns ``sample``, ``rule``, ``backend``, ``step``, ``seconds``, ``max_rss_mb``; the
    row with step ``total`` is the whole job: its seconds as Snakemake measured them, its peak
    memory the process's that ran it (the job's own, or its pool worker's).
    """
    import pandas as pd  # here: every rule imports this module, before its GPU start-up (prepare_gpu)

    rows = []
    for (sample, rule), bench in benchmarks.items():
        record = provenance.get((sample, rule), {})
        backend = record.get("backend", "")
        worker_peak = (phases or {}).get((sample, rule), {}).get("worker_max_rss_mb")
        rows.append(
            {
                "sample": sample,
                "rule": rule,
                "backend": backend,
                "step": "total",
                "seconds": float(bench["s"].iloc[-1]),
                "max_rss_mb": float(worker_peak if worker_peak is not None else bench["max_rss"].iloc[-1]),
            }
        )
        for step, seconds in record.get("timings", {}).items():
            rows.append(
                {
                    "sample": sample,
                    "rule": rule,
                    "backend": backend,
                    "step": step,
                    "seconds": float(seconds),
                    "max_rss_mb": float("nan"),
                }
            )
    return pd.DataFrame(rows, columns=["sample", "rule", "backend", "step", "seconds", "max_rss_mb"])
