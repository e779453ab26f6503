"""Work beside a rule's main thread: outputs written in a background thread, figures drawn in a second process.

Each yields a function that queues work; the work runs in order, the block ends when all of
it has finished (the wait counts as phase ``write``), and the first failure raises then
(an exception of the block itself comes first).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omicsprep.timings import phase

if TYPE_CHECKING:
    from concurrent.futures import Future

log = logging.getLogger(__name__)

# The interpreter's thread switch interval while writers run beside a rule's steps (Python's
# default: 5 ms). The writer and its compressing threads take the interpreter's lock at every
# chunk, and a main thread busy in Python keeps it for the whole interval: a 400 MB deflated
# array took 5.5 s to write beside one, 1.6 s at 0.5 ms, 1.3 s beside a busy process
# (2-core vm, 2026-12-07); the main thread's Python ran about a third slower meanwhile.
WRITING_SWITCH_INTERVAL_S = 0.0005


@contextlib.contextmanager
def background_writes() -> Iterator[Callable[..., None]]:
    """Yield ``write_later(writer, *args, **kwargs)``: writers run in a background thread meanwhile.

    A rule then goes on computing (on the GPU, mostly) while its earlier outputs are
    written: HDF5 lets other threads run while it writes. The writers' seconds count as
    phase ``background_write``. Meanwhile threads switch every :data:`WRITING_SWITCH_INTERVAL_S`.
    """
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omicsprep-writer")
    previous = sys.getswitchinterval()
    sys.setswitchinterval(WRITING_SWITCH_INTERVAL_S)
    try:
        with _in_order(executor, wrap=_write_in_background) as write_later:
            yield write_later
    finally:
        sys.setswitchinterval(previous)


# A pool worker's figure process, forked before the worker imported the GPU libraries (keep_figure_process).
_kept: list[Executor] = []


@contextlib.contextmanager
def background_process(*, preload: str | None = None) -> Iterator[Callable[..., None]]:
    """Yield ``run_later(function, *args, **kwargs)``: the functions run in a second process meanwhile.

    A rule's figures are drawn there while it goes on computing and writing: drawing holds
    the interpreter, which a thread would share. The process is forked when the block
    starts, so a rule enters it first, while it is small (a copy of its memory stays
    shared until it exits) and has no GPU context, threads or input yet; ``preload``, a
    module, is imported there meanwhile. In a pool worker the process it forked at its start
    is used instead (a process with a CUDA context must not fork). Functions and arguments
    travel pickled. Where processes are not forked (other systems than Linux, where forking
    is unsafe or missing), each runs at once, here.
    """
    if _kept:
        with _in_order(_kept[0], shut_down=False) as run_later:
            yield partial(run_later, _run_in, Path.cwd(), current_umask())
        return
    if sys.platform != "linux":
        yield _run_now
        return
    with _in_order(_forked()) as run_later:
        run_later(_preload, preload)  # forks now
        yield run_later


def keep_figure_process(*, preload: str | None = None) -> None:
    """Fork, now, the process that :func:`background_process` uses from then on in this process (a pool worker).

    Call it before anything starts threads or CUDA: the process is a copy of this one.
    """
    if sys.platform == "linux" and not _kept:
        executor = _forked()
        executor.submit(_preload, preload).result()
        _kept.append(executor)


def _forked() -> Executor:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork")
    return ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_end_with, initargs=(os.getpid(),))


def _end_with(parent: int) -> None:
    """In a forked figure process: be killed when ``parent`` ends, however it ends.

    A forked child holds the write end of its own work queue, so it never reads an end from
    it: a parent that ends without shutting it down (``os._exit``, as a pool worker does, or
    a signal) would leave it waiting for ever. Linux signals when the *thread* that forked it
    ends: the executor forks from the thread that first submits, a rule's (or a pool
    worker's) main thread.
    """
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the line above
        os._exit(0)


@contextlib.contextmanager
def _in_order(
    executor: Executor, *, wrap: Callable[..., None] | None = None, shut_down: bool = True
) -> Iterator[Callable[..., None]]:
    """Yield ``later(function, *args, **kwargs)``: submits to ``executor`` (one worker: in order), through ``wrap``.

    The block ends once all has run (``executor`` shut down, unless ``shut_down`` is false).
    """
    futures: list[Future[None]] = []

    def later(function: Callable[..., None], /, *args: Any, **kwargs: Any) -> None:
        job = (wrap, function, *args) if wrap is not None else (function, *args)
        futures.append(executor.submit(*job, **kwargs))

    try:
        yield later
    finally:
        with phase("write"):
            if shut_down:
                executor.shutdown(wait=True)
            else:
                wait(futures)
    for future in futures:
        future.result()


def _write_in_background(writer: Callable[..., None], /, *args: Any, **kwargs: Any) -> None:
    start = time.perf_counter()
    with phase("background_write"):
        writer(*args, **kwargs)
    log.info("background write %s: %.2f s", getattr(writer, "__name__", writer), time.perf_counter() - start)


def _run_now(function: Callable[..., None], /, *args: Any, **kwargs: Any) -> None:
    function(*args, **kwargs)


def _run_in(folder: Path, umask: int, function: Callable[..., None], /, *args: Any, **kwargs: Any) -> None:
    """Run ``function`` in ``folder`` with ``umask``: a kept figure process serves jobs of other folders."""
    os.chdir(folder)
    os.umask(umask)
    function(*args, **kwargs)


def current_umask() -> int:
    """The umask of this process (read by setting it, then set back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _preload(module: str | None) -> None:
    if module is not None:
        importlib.import_module(module)
