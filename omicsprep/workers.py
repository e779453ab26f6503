"""Warm workers: processes that have imported a rule's libraries before the rule starts.

A rule is a process, and a GPU rule's process spends 5-6 s importing rapids-singlecell,
cuML, cuDF and AnnData before its first step: at 5,000 cells more than all of its steps.
``omicsprep workers start`` starts a server on this machine that keeps a few processes with
those imports done, and no CUDA context. Each rule's script hands itself to one
(:func:`hand_off`, at its first line): the worker takes the rule's working directory,
environment (``CUDA_VISIBLE_DEVICES`` included: CUDA starts in the worker only then),
arguments, umask and standard streams, runs the script, and exits. The server starts
another worker and passes the exit status back to the rule's process, which exits with it.
A rule's process that ends (a cancelled job) makes its worker stop as the process would
(SIGTERM). Without a server, with ``OMICSPREP_WORKERS=off``, or with a server started in
another environment (another Python, package code changed since, other import-time
settings), the script runs in its own process as before; the last case says so on
standard error.

Workers are started, not forked from one process holding the imports: children forked
from a process that had imported the GPU libraries crashed (SIGSEGV) in their first cuML
steps on the H200. Each worker runs one rule, so nothing carries from one rule to the next.

A server may also warm its idle workers up (:func:`warm_up`, which ``omicsprep workers
start`` asks for on a GPU that processes share): each runs rule qc_cluster's steps once on
a small generated sample, so that what steps load at their first use in a process is loaded
before its rule arrives. On the GPU that is the CUDA context, CuPy's kernels read from its
cache, the libraries' modules and handles: 1.4-1.5 s of a 5,000-cell rule on the H200. A
worker warmed up on the GPU holds a CUDA context on the server's ``CUDA_VISIBLE_DEVICES``,
so a rule that sees other devices runs in its own process. Workers warm up one at a time,
and only while no rule waits: a rule that comes meanwhile goes to another idle worker
(warm ones first), so a run started right after ``omicsprep workers start`` does not wait
for warm-ups; it waits only where the one idle worker is warming up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import runpy
import selectors
import signal
import site
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omicsprep.errors import InputError

log = logging.getLogger(__name__)

IN_WORKER = "OMICSPREP_IN_WORKER"  # set in a worker's environment: its scripts run where they are
SWITCH = "OMICSPREP_WORKERS"  # "off": rules never hand off
RUNTIME_DIR = "OMICSPREP_RUNTIME_DIR"  # where the server's socket and log go (default: $XDG_RUNTIME_DIR or /tmp)
# What a rule imports, imported by each worker before it waits for one.
PRELOADED = (
    "snakemake.iocontainers",
    "snakemake.logging",
    "threadpoolctl",
    "omicsprep.workflow",
    "omicsprep.pipeline",
    "omicsprep.io",
    "omicsprep.plotting",
)
PRELOADED_GPU = ("cupy", "cuml", "pylibcugraph", "rapids_singlecell")  # where all are installed
# Settings read when libraries are imported: a rule whose values differ from the server's runs in its own process.
IMPORT_TIME_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "LANG")
IMPORT_TIME_PREFIXES = ("PYTHON", "LC_", "CUDA_", "CUPY_", "NUMBA_", "RAPIDS_", "OMICSPREP_")
# Read at run time (or per rule by run_script): they may differ.
RUN_TIME_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_CACHE_PATH", "NUMBA_NUM_THREADS", IN_WORKER, SWITCH, RUNTIME_DIR)
MAX_SOCKET_PATH = 107  # bytes, Linux's sun_path less its final zero
WARM_UP_CELLS = 2000  # generated cells a worker warms up on: every step runs, in a few seconds
_HEADER = struct.Struct("!I")
_MAX_FDS = 4


# -- where the server is, and what it was started with ----------------------------------------------------------------


def socket_path() -> Path:
    """The server socket of this Python and package, for this user (one per environment)."""
    base = os.environ.get(RUNTIME_DIR) or os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/omicsprep-{os.getuid()}"
    folder = Path(base)
    key = hashlib.sha1(f"{sys.executable}\0{Path(__file__).parent}".encode()).hexdigest()[:12]
    path = folder / f"omicsprep-workers-{key}.sock"
    if len(str(path).encode()) > MAX_SOCKET_PATH:
        raise InputError(
            f"too long for a socket's path (at most {MAX_SOCKET_PATH} bytes); set {RUNTIME_DIR}", path=path
        )
    return path


def fingerprint() -> dict[str, Any]:
    """What a worker's imports depend on: the interpreter, the package's code and import-time settings."""
    package = Path(__file__).parent
    sources = [path.stat().st_mtime_ns for path in package.rglob("*.py")]
    settings = {
        name: value
        for name, value in os.environ.items()
        if (name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES)) and name not in RUN_TIME_NAMES
    }
    return {
        "python": sys.executable,
        "version": sys.version,
        "package": str(package),
        "code": [len(sources), max(sources, default=0)],
        "packages": [_installed(folder) for folder in _package_folders()],
        "settings": dict(sorted(settings.items())),
    }


def _installed(folder: str) -> str:
    """A digest of what is installed in a package folder.

    Its entries' names (installs, removals and upgrades change them) and the times of its
    metadata (a reinstall rewrites it); not its own time, which the ``__pycache__`` folder
    that Python writes at a module's first import changes too.
    """
    metadata = (".dist-info", ".egg-info", ".egg-link", ".pth")
    installed = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name == "__pycache__":
                continue
            try:
                installed.append((entry.name, entry.stat().st_mtime_ns if entry.name.endswith(metadata) else 0))
            except FileNotFoundError:  # removed since the listing (an install under way)
                continue
    return hashlib.sha256(repr(sorted(installed)).encode()).hexdigest()


def _package_folders() -> list[str]:
    """The folders of installed packages of this interpreter (the user's, and PYTHONPATH's, too)."""
    folders = [*site.getsitepackages(), site.getusersitepackages(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return [folder for folder in folders if folder and Path(folder).is_dir()]


def _difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """The first part of two fingerprints that differs, in words."""
    if ours["code"] != theirs["code"]:
        return "omicsprep's code changed since the workers started"
    if ours["packages"] != theirs["packages"]:
        return "packages were installed or removed since the workers started"
    for key in ("python", "version", "package"):
        if ours[key] != theirs[key]:
            return f"{key} differs ({theirs[key]} there)"
    names = sorted(
        set(ours["settings"]) ^ set(theirs["settings"])
        | {name for name in ours["settings"] if theirs["settings"].get(name) != ours["settings"][name]}
    )
    return f"environment variables differ: {', '.join(names)}"


# -- messages: length-prefixed JSON, with file descriptors alongside --------------------------------------------------


def _send(sock: socket.socket, message: dict[str, Any], *, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the descriptors sent with it; ``(None, [])`` when the peer has gone."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    if not head:
        return None, fds
    while len(head) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(head))
        if not more:
            return None, fds
        head += more
    (size,) = _HEADER.unpack(head)
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None, fds
        data += more
    return json.loads(data), fds


def _ask(request: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any] | None:
    """The server's answer to ``request``, or ``None`` when no server answers."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(socket_path()))
        _send(sock, request)
        answer, _ = _receive(sock)
        return answer
    return None


# -- a rule's side ----------------------------------------------------------------------------------------------------


def hand_off() -> None:
    """Run this script in a warm worker, when this environment's server runs; exit with its status.

    Returns (the script goes on here) when no worker can take it. A rule's script calls it
    before importing anything else.
    """
    if _job or os.environ.get(IN_WORKER) or os.environ.get(SWITCH) == "off" or sys.platform != "linux":
        return
    try:
        path = socket_path()
    except InputError:  # no server can have started there
        return
    if not path.exists() or not _private(path.parent):
        return
    for fd in (0, 1, 2):  # a closed one would be taken by the socket, and handed over as a stream
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    conn = socket.socket(socket.AF_UNIX)
    request = {
        "run": sys.argv,
        "cwd": str(Path.cwd()),
        "env": dict(os.environ),
        "umask": _umask(),
        "started_at": time.time() - _seconds_since_start(),
        "fingerprint": fingerprint(),
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    try:
        conn.connect(str(path))
        if _peer_uid(conn) != os.getuid():
            raise PermissionError(f"{path} is served by another user")
        _send(conn, request, fds=[0, 1, 2])
        answer, _ = _receive(conn)
    except OSError as exc:  # a server stopping or gone
        answer = {"refused": f"{type(exc).__name__}: {exc}"}
    if answer is None or "refused" in answer:
        reason = "the server closed the connection" if answer is None else answer["refused"]
        print(
            f"omicsprep: warm workers at {path} not used ({reason}); this rule runs in its own process", file=sys.stderr
        )
        conn.close()
        return
    status, _ = _receive(conn)  # the worker runs meanwhile; our end's closing (this process ending) stops it
    if status is None:
        print(
            f"omicsprep error: the server at {path} stopped while worker {answer['worker']} ran this rule",
            file=sys.stderr,
        )
        os._exit(1)
    code = status["exit"]
    os._exit(code if code >= 0 else 128 - code)  # a signal's number, as a shell reports it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _seconds_since_start() -> float:
    from omicsprep.workflow import seconds_since_process_start

    return seconds_since_process_start() or 0.0


# -- a worker's side --------------------------------------------------------------------------------------------------

_job: dict[str, Any] = {}  # the rule a worker runs: when its process started, the worker's pid


def job_started_at() -> float | None:
    """When the rule's own process started (seconds since the epoch), in a worker; ``None`` elsewhere."""
    return _job.get("started_at")


def job_worker() -> int | None:
    """The pid of this worker while it runs a rule; ``None`` elsewhere."""
    return _job.get("worker")


def _preload() -> dict[str, float]:
    """Import what rules import (GPU libraries where all are installed, not starting CUDA); seconds per module."""
    modules = list(PRELOADED)
    if all(importlib.util.find_spec(name) is not None for name in PRELOADED_GPU):
        modules += PRELOADED_GPU
    seconds = {}
    for name in modules:
        start = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the rule imports it again, and reports it
            log.warning("worker %d: importing %s failed (%s: %s)", os.getpid(), name, type(exc).__name__, exc)
        seconds[name] = round(time.perf_counter() - start, 2)
    if _cuda_started():  # the rule's CUDA_VISIBLE_DEVICES would be ignored
        raise RuntimeError("importing the GPU libraries started CUDA in the worker; workers cannot be used")
    return seconds


def _cuda_started() -> bool:
    """Whether the CUDA driver was initialized in this process (without initializing it)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    error, _ = driver.cuDeviceGetCount()
    return error != driver.CUresult.CUDA_ERROR_NOT_INITIALIZED


def serve_one(channel_fd: int) -> None:
    """A worker's life: import, say so on ``channel_fd``, warm up if told, run the rule it is sent, exit with it."""
    channel = socket.socket(fileno=channel_fd)
    seconds = _preload()
    log.info("worker %d ready: %s", os.getpid(), seconds)
    _send(channel, {"ready": os.getpid()})
    while True:
        request, fds = _receive(channel)
        if request is None:
            os._exit(0)
        if "warm_up" not in request:
            break
        failure = _warm_up(request["warm_up"], n_cells=request["cells"])
        _send(channel, {"warmed": os.getpid(), "failure": failure})
    conn_fd, *std_fds = fds
    conn = socket.socket(fileno=conn_fd)
    for target, fd in enumerate(std_fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"], **{IN_WORKER: "1"})
    os.umask(request["umask"])
    sys.argv = request["run"]
    sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))
    _job.update(started_at=request["started_at"], worker=os.getpid())
    threading.Thread(target=_stop_when_gone, args=(conn,), name="omicsprep-rule-watch", daemon=True).start()
    os._exit(_run(request["run"][0]))


def _warm_up(backend: str, *, n_cells: int) -> str | None:
    """Run rule qc_cluster's steps once on ``backend``, on ``n_cells`` generated cells; why that failed, or ``None``.

    What the steps load at their first use in a process is then loaded in this one. The
    results are dropped, and on the GPU the memory CuPy's pools keep is given back. A
    failure is logged: the rule then runs here as in a worker not warmed up.
    """
    from omicsprep.cli import workflow_config
    from omicsprep.warmup import warm_kernels

    start = time.perf_counter()
    try:
        warm_kernels(workflow_config([]), backend=backend, n_cells=n_cells)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - the rule meets the same problem, and reports it
        log.warning("worker %d: warming up (%s) failed (%s: %s)", os.getpid(), backend, type(exc).__name__, exc)
        return f"{type(exc).__name__}: {exc}"
    finally:
        if backend == "gpu":
            from omicsprep.backend import release_device_memory

            release_device_memory()
    log.info("worker %d warmed up (%s, %d cells) in %.1f s", os.getpid(), backend, n_cells, time.perf_counter() - start)
    return None


STOP_GRACE_SECONDS = 10.0


def _stop_when_gone(conn: socket.socket) -> None:
    """SIGTERM this worker once the rule's process has ended (nothing more comes on ``conn``).

    The rule's SIGTERM handler runs once a long C call returns; past ``STOP_GRACE_SECONDS``
    the worker is killed, as its rule's own process would have been with it.
    """
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)


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
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


# -- the server -------------------------------------------------------------------------------------------------------


@dataclass
class _Worker:
    process: subprocess.Popen
    channel: socket.socket
    ready: bool = False
    warming: bool = False
    warm: bool = False
    client: socket.socket | None = None  # the rule's connection, while it runs


@dataclass
class _Server:
    n_workers: int
    idle_seconds: float
    listener: socket.socket
    fingerprint: dict[str, Any]
    workers: list[_Worker] = field(default_factory=list)
    waiting: list[tuple[socket.socket, dict[str, Any], list[int]]] = field(default_factory=list)
    last_active: float = field(default_factory=time.monotonic)
    stopping: bool = False
    stop_requested: bool = False  # by SIGTERM; acted on in the loop
    socket_inode: int = 0
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    warm_up: dict[str, Any] | None = None  # what idle workers warm up with (:func:`warm_up`), while it works
    holds_gpu: bool = False  # a worker warmed up on the GPU: its CUDA context is on our CUDA_VISIBLE_DEVICES

    def start_worker(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, IN_WORKER: "1"}
        process = subprocess.Popen(
            _module_command("worker", str(theirs.fileno())),
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
            cwd="/",
        )
        theirs.close()
        worker = _Worker(process, ours)
        self.workers.append(worker)
        self.selector.register(ours, selectors.EVENT_READ, worker)

    def serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.dispatch()  # starts the workers
        while not (self.stopping and not self.workers):
            for key, _ in self.selector.select(timeout=0.5):
                if key.data is None:
                    self.accept()
                else:
                    self.hear_from(key.data)
            if self.stop_requested:
                self.stop()
            self.reap()
            self.dispatch()
            idle = not any(worker.client for worker in self.workers) and not self.waiting
            if idle and time.monotonic() - self.last_active > self.idle_seconds:
                log.info("idle for %.0f s: stopping", self.idle_seconds)
                self.stop()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(5.0)
        fds: list[int] = []
        try:
            if _peer_uid(conn) != os.getuid():
                raise PermissionError("a process of another user")
            request, fds = _receive(conn)
            self.answer(conn, request, fds)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("request refused: %s: %s", type(exc).__name__, exc)
            _close_all(fds)
            conn.close()

    def answer(self, conn: socket.socket, request: dict[str, Any] | None, fds: list[int]) -> None:
        """Answer a status or stop request at once; queue a rule, or refuse it."""
        if request is None:
            conn.close()
        elif "status" in request:
            _send(conn, self.status())
            conn.close()
        elif "stop" in request:
            _send(conn, {"stopping": os.getpid()})
            conn.close()
            self.stop()
        elif "warm_up" in request:
            if not self.stopping and self.warm_up is None:
                self.warm_up = {"warm_up": request["warm_up"], "cells": request["cells"]}
                self.holds_gpu = self.holds_gpu or request["warm_up"] == "gpu"
            _send(conn, self.status())
            conn.close()
        elif (reason := self.refusal(request)) is not None:
            _send(conn, {"refused": reason})
            _close_all(fds)
            conn.close()
        else:
            conn.settimeout(None)
            self.waiting.append((conn, request, fds))
            self.last_active = time.monotonic()

    def refusal(self, request: dict[str, Any]) -> str | None:
        """Why a worker may not run the rule of ``request``; ``None`` when one may."""
        if self.stopping:
            return "the server is stopping"
        if request["fingerprint"] != self.fingerprint:
            return _difference(request["fingerprint"], self.fingerprint)
        if request["affinity"] != sorted(os.sched_getaffinity(0)):  # a scheduler's job, given some of the cores
            return "the rule may use other CPUs than the workers (a scheduler's job?)"
        ours, theirs = os.environ.get("CUDA_VISIBLE_DEVICES"), request["env"].get("CUDA_VISIBLE_DEVICES")
        if self.holds_gpu and theirs != ours:
            return f"the workers hold CUDA contexts on CUDA_VISIBLE_DEVICES={ours}; the rule sees {theirs}"
        return None

    def hear_from(self, worker: _Worker) -> None:
        with contextlib.suppress(OSError):
            message, _ = _receive(worker.channel)
            if message is not None and "ready" in message:
                worker.ready = True
                return
            if message is not None and "warmed" in message:
                worker.warming, worker.warm = False, message["failure"] is None
                if message["failure"] is not None:  # the next workers would fail alike
                    log.warning("warming up stopped: worker %d failed to (%s)", worker.process.pid, message["failure"])
                    self.warm_up = None
                return
        self.selector.unregister(worker.channel)  # the worker is exiting; reaped below
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(timeout=1)

    def dispatch(self) -> None:
        """Give each waiting rule to a ready worker; keep ``n_workers`` spare, and one more per rule still waiting.

        Rules arriving together then wait for workers importing side by side, as their own
        processes would import, rather than for one batch after another. Warm workers are
        given rules first; one warming up finishes first (a rule waits for the rest of its
        warm-up, and does not share its failure). Idle workers warm up one at a time, while
        no rule waits.
        """
        idle = [worker for worker in self.workers if worker.ready and worker.client is None and not worker.warming]
        for worker in sorted(idle, key=lambda worker: not worker.warm):
            if not self.waiting:
                break
            conn, request, fds = self.waiting.pop(0)
            try:
                _send(conn, {"worker": worker.process.pid})
            except OSError:  # the rule's process ended while it waited
                _close_all(fds)
                conn.close()
                continue
            job = {key: request[key] for key in ("run", "cwd", "env", "umask", "started_at")}
            _send(worker.channel, job, fds=[conn.fileno(), *fds])
            _close_all(fds)
            worker.client = conn
            log.info("worker %d runs %s in %s", worker.process.pid, request["run"][0], request["cwd"])
        if self.stopping:
            return
        spare = sum(worker.client is None for worker in self.workers)
        for _ in range(self.n_workers + len(self.waiting) - spare):
            self.start_worker()
        if self.warm_up is not None and not self.waiting and not any(worker.warming for worker in self.workers):
            cold = [worker for worker in self.workers if worker.ready and worker.client is None and not worker.warm]
            if cold:  # one at a time: the others stay free for rules
                _send(cold[0].channel, self.warm_up)
                cold[0].warming = True

    def reap(self) -> None:
        for worker in [worker for worker in self.workers if worker.process.poll() is not None]:
            self.workers.remove(worker)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(worker.channel)
            worker.channel.close()
            code = worker.process.returncode
            if worker.client is not None:
                with contextlib.suppress(OSError):
                    _send(worker.client, {"exit": code})
                worker.client.close()
                self.last_active = time.monotonic()
                log.info("worker %d exited: %d", worker.process.pid, code)
            elif worker.warming and not self.stopping:
                log.error("worker %d exited warming up (%d): warming up stopped", worker.process.pid, code)
                self.warm_up = None
            elif not self.stopping:  # it could not import: rules run in their own processes instead
                log.error("worker %d exited before running a rule (%d): stopping", worker.process.pid, code)
                self.stop()

    def stop(self) -> None:
        """Stop taking rules; idle workers end now, busy ones when their rule ends."""
        if self.stopping:
            return
        self.stopping = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            if socket_path().stat().st_ino == self.socket_inode:
                socket_path().unlink()
        for conn, _, fds in self.waiting:
            with contextlib.suppress(OSError):
                _send(conn, {"refused": "the server is stopping"})
            _close_all(fds)
            conn.close()
        self.waiting.clear()
        for worker in self.workers:
            if worker.client is None:
                worker.process.terminate()

    def status(self) -> dict[str, Any]:
        return {
            "server": os.getpid(),
            "socket": str(socket_path()),
            "idle_minutes": self.idle_seconds / 60,
            "warming_up": self.warm_up is not None,
            "workers": [{"pid": w.process.pid, "state": _state(w), "warm": w.warm} for w in self.workers],
        }


def _state(worker: _Worker) -> str:
    return "busy" if worker.client else "warming up" if worker.warming else "ready" if worker.ready else "importing"


def _module_command(*args: str) -> list[str]:
    """The command running this module in this interpreter, without the current folder on its path (``-P``)."""
    return [sys.executable, "-P", "-m", "omicsprep.workers", *args]


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def serve(*, n_workers: int, idle_minutes: float) -> None:
    """Run the server in this process until ``idle_minutes`` pass without a rule, or a stop request.

    One server per socket: it holds a lock beside the socket while it runs, and another
    start leaves at once.
    """
    path = _private_socket_path()
    lock = path.with_suffix(".lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("a server runs at %s already", path)
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead server's (none holds the lock)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    path.chmod(0o600)
    listener.listen(64)
    server = _Server(n_workers, idle_minutes * 60, listener, fingerprint(), socket_inode=path.stat().st_ino)

    def stop_on_sigterm(signum: int, frame: object) -> None:
        server.stop_requested = True

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    log.info("server %d at %s: %d workers, stops after %.0f idle minutes", os.getpid(), path, n_workers, idle_minutes)
    server.serve()
    lock.close()


def _private_socket_path() -> Path:
    """:func:`socket_path`, in a folder made, or found, readable and writable by this user only.

    Raises
    ------
    InputError
        The folder belongs to another user, or others may write to it.
    """
    path = socket_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _private(path.parent):
        raise InputError(
            "not private to this user (owner or permissions): warm workers are not started", path=path.parent
        )
    return path


def _private(folder: Path) -> bool:
    info = folder.stat()
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (Linux's SO_PEERCRED)."""
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


# -- omicsprep workers start|stop|status -----------------------------------------------------------------------------


def status() -> dict[str, Any] | None:
    """The running server's pid, socket and workers' states; ``None`` when none runs."""
    return _ask({"status": True})


def start(*, n_workers: int, idle_minutes: float, wait_seconds: float = 120.0) -> dict[str, Any]:
    """Start this environment's server in the background (unless it runs), and wait until a worker is ready.

    Returns
    -------
    The server's status.

    Raises
    ------
    InputError
        Not on Linux (descriptors and peers' users are read from Unix sockets as Linux does),
        or the socket's folder is not private, or the server stopped or had no worker ready.
    """
    if sys.platform != "linux":
        raise InputError(f"warm workers run on Linux only, not {sys.platform}")
    running = status()
    if running is not None:
        return running
    path = _private_socket_path()
    log_path = path.with_suffix(".log")
    with log_path.open("a") as log_file:
        server = subprocess.Popen(
            _module_command("serve", str(n_workers), str(idle_minutes)),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # outlives the command, and the terminal's signals
        )
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = status()
        if now is not None and any(worker["state"] == "ready" for worker in now["workers"]):
            return now
        if server.poll() is not None:
            break
    state = "stopped" if server.poll() is not None else f"had no worker ready in {wait_seconds:.0f} s"
    raise InputError(f"the warm workers' server {state}: {log_path.read_text().strip()[-2000:]}", path=log_path)


def warm_up(backend: str, *, n_cells: int = WARM_UP_CELLS) -> dict[str, Any] | None:
    """Have the running server warm its idle workers up on ``backend``, one at a time; do not wait.

    Each runs rule qc_cluster's steps once on ``n_cells`` generated cells (see the module's
    notes). A worker warmed up on the GPU holds a CUDA context: ask for it only where
    processes may share the devices (:func:`omicsprep.backend.gpus_shared`).

    Returns
    -------
    The server's status, or ``None`` when none runs.
    """
    return _ask({"warm_up": backend, "cells": n_cells})


def wait_until_warm(*, wait_seconds: float = 300.0) -> dict[str, Any] | None:
    """Wait until a worker is warm, or warming up has stopped (a failure: the server's log says why).

    Returns
    -------
    The server's status, or ``None`` when none runs.

    Raises
    ------
    InputError
        No worker was warm in ``wait_seconds``.
    """
    state = status()
    deadline = time.monotonic() + wait_seconds
    while state is not None and state["warming_up"] and not any(worker["warm"] for worker in state["workers"]):
        if time.monotonic() > deadline:
            raise InputError(f"no worker warmed up in {wait_seconds:.0f} s", path=socket_path().with_suffix(".log"))
        time.sleep(0.2)
        state = status()
    return state


def stop() -> dict[str, Any] | None:
    """Ask the server to stop (busy workers finish their rules first); ``None`` when none runs."""
    return _ask({"stop": True})


def main(argv: list[str]) -> None:
    """``python -m omicsprep.workers serve N MINUTES`` (the server) or ``worker FD`` (one worker)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if argv[0] == "serve":
        serve(n_workers=int(argv[1]), idle_minutes=float(argv[2]))
    elif argv[0] == "worker":
        serve_one(int(argv[1]))


if __name__ == "__main__":
    # As omicsprep.workers, the module a rule's script imports (not a second copy as __main__).
    importlib.import_module("omicsprep.workers").main(sys.argv[1:])
