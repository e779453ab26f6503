"""The pool's clients: a job that hands itself over, and the workflow that starts, asks and stops the pool."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omicsprep.background import current_umask
from omicsprep.pool.protocol import (
    MAX_SOCKET_PATH,
    POOL,
    absolute_python_path,
    ask,
    difference,
    fingerprint,
    module_command,
    peer_uid,
    receive,
    send,
    socket_path,
)
from omicsprep.pool.worker import in_worker

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

IDLE_SECONDS = 600.0


def hand_over(*, started_at: float, inputs: Sequence[str] = (), wait: bool = True) -> None:
    """Have a worker of the pool run this script, when the workflow started one; exit with its status.

    Returns (the job runs here) without a pool, in a worker, when the pool refuses the job
    (saying why on standard error), or, with ``wait`` false, when no worker is free.

    Parameters
    ----------
    started_at
        When this process started (seconds since the epoch): the job's start-up counts from it.
    inputs
        The job's input files: it goes to a worker that keeps one's matrix, if any does.
    wait
        Whether the job waits in the pool for a worker, or runs here when none is free.
    """
    path = os.environ.get(POOL)
    if not path or path == "off" or in_worker() or sys.platform != "linux" or not Path(path).exists():
        return
    for fd in (0, 1, 2):  # a closed one would be taken by the socket, and handed over as a stream
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    request = {
        "run": sys.argv,
        "cwd": str(Path.cwd()),
        "env": dict(os.environ),
        "umask": current_umask(),
        "started_at": started_at,
        "inputs": [os.path.realpath(path) for path in inputs],
        "fingerprint": fingerprint(),
        "wait": wait,
    }
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(path)
        if peer_uid(conn) != os.getuid():
            raise PermissionError(f"{path} is served by another user")
        send(conn, request, fds=[0, 1, 2])
        answer, _ = receive(conn)
    except OSError as exc:  # a pool stopping or gone
        answer = {"refused": f"{type(exc).__name__}: {exc}"}
    if answer is not None and "busy" in answer:
        conn.close()
        return
    if answer is None or "refused" in answer:
        reason = "the pool closed the connection" if answer is None else answer["refused"]
        print(
            f"omicsprep: the pool at {path} did not take this job ({reason}); it runs in its own process",
            file=sys.stderr,
        )
        conn.close()
        return
    status, _ = receive(conn)  # the worker runs the job; this process ending (cancelled) stops it
    if status is None:
        print(
            f"omicsprep error: the pool at {path} stopped while worker {answer['worker']} ran this job", file=sys.stderr
        )
        os._exit(1)
    code = status["exit"]
    os._exit(code if code >= 0 else 128 - code)  # a signal's number, as a shell reports it


def status(path: Path | None = None) -> dict[str, Any] | None:
    """The running pool's server, fingerprint, workers' states and imports, jobs waiting; ``None`` when none runs.

    ``path``: its socket (by default this user's, :func:`socket_path`).
    """
    return ask({"status": True}, path=path)


def start(*, n_workers: int, idle_seconds: float = IDLE_SECONDS) -> Path | None:
    """Make sure this user's pool runs with at least ``n_workers`` workers of this code; its socket.

    A pool of other code (or packages, or settings) is stopped and a new one started. Does not
    wait for the workers: jobs that come first wait in the pool. ``None`` where no pool can
    run (not Linux, or a socket folder that is not private to this user).
    """
    if sys.platform != "linux":
        return None
    path = socket_path()
    running = status()
    if running is not None and difference(fingerprint(), running["fingerprint"]) is None:
        ask({"grow": n_workers})
        return path
    if running is not None:
        ask({"stop": True})
        deadline = time.monotonic() + 10
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.parent.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022 or len(str(path).encode()) > MAX_SOCKET_PATH:
        log.warning("no pool of warm processes: %s is not private to this user, or too long a path", path.parent)
        return None
    env = dict(os.environ)
    if "PYTHONPATH" in env:  # its folders as found from here: the server runs in /
        env["PYTHONPATH"] = absolute_python_path(env["PYTHONPATH"])
    with path.with_suffix(".log").open("a") as log_file:
        subprocess.Popen(
            module_command("serve", str(n_workers), str(idle_seconds)),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # outlives the run, and the terminal's signals
            cwd="/",  # its workers come back here after each job: not the run's folder, which may be deleted
            env=env,
        )
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path


def stop(path: Path | None = None) -> dict[str, Any] | None:
    """Ask the pool to stop (busy workers finish their jobs first); ``None`` when none runs."""
    return ask({"stop": True}, path=path)
