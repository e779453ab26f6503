"""Warm processes that run the workflow's GPU jobs one after another.

A rule is a process, and a GPU rule's process spends 7-10 s importing RAPIDS and AnnData and
creating a CUDA context before its first step (H200 machine, ``benchmarks/gpu_check.sh
probe``): many times the work of a 10,000-cell sample, and, with 16 such samples run side by
side, more than the CPU backend takes for the whole study. So the workflow starts a pool on
a machine whose GPU it uses locally (``onstart`` in ``rules/common/pool.smk``): a server and a few
workers, each of which imports the libraries and creates its CUDA context once, compiles
nothing twice, and runs job after job in its own process.

A GPU job's script hands itself to the pool (:func:`omicsprep.jobs.run_script` calls
:func:`hand_over` first): a worker takes the job's working folder, environment, arguments,
umask and standard streams, runs the script, gives back what it took, and tells the server
the exit status, which the job's own process exits with. A worker whose job failed or was
cancelled exits rather than run another (the server starts a new one), so a job runs in a
process that only ever finished other jobs cleanly. A job's own process that ends (Snakemake
cancelled it) stops its worker as it would have stopped itself (SIGTERM).

The pool serves this user, this interpreter and this package's code: a job started with
other code, other packages, other import-time settings or other CPUs (a scheduler's job)
runs in its own process, as it does without a pool. It outlives a run, so that the next run
(a changed resolution, another sample) finds it warm, and stops after ``idle_seconds``
without a job. On a cluster (a non-local executor) the workflow starts none: each job pays
its start once.

Snakemake's ``benchmark:`` file of a pooled job measures the job's own process, which waits;
the rule's log (its ``phases`` line) and ``results/run_times.tsv`` hold the worker's seconds
of CPU and its peak memory during the job.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import resource
import runpy
import selectors
import signal
import site
import socket
import struct
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omicsprep.background import current_umask

log = logging.getLogger(__name__)

# The pool's socket, set by the workflow for its jobs, which hand themselves over; set beforehand,
# the workflow uses that pool (``off``: none, each job in its own process).
POOL = "OMICSPREP_POOL"
IDLE_SECONDS = 600.0
# Each stage's chain of steps (what the rules' scripts call), and what else they import: each
# worker imports these before it takes a job.
STAGE_PIPELINES = tuple(
    f"omicsprep.{stage}.pipeline" for stage in ("rna", "cells", "network", "protein", "atac", "multiome")
)
PRELOADED = ("snakemake.iocontainers", "snakemake.logging", "threadpoolctl", *STAGE_PIPELINES, "omicsprep.io")
# GPU libraries, in the order a rule first uses them (a worker imports those that are installed).
PRELOADED_GPU = ("cupy", "cupyx.scipy.sparse", "rapids_singlecell", "cuml", "pylibcugraph")
# Settings read when libraries are imported: a job whose values differ runs in its own process.
IMPORT_TIME_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "LANG")
IMPORT_TIME_PREFIXES = ("PYTHON", "LC_", "CUDA_", "CUPY_", "NUMBA_", "RAPIDS_", "OMICSPREP_")
RUN_TIME_NAMES = ("CUDA_CACHE_PATH", "NUMBA_NUM_THREADS", POOL)  # read per job: they may differ
CANCEL_GRACE_SECONDS = 10.0
MAX_SOCKET_PATH = 107  # bytes, Linux's sun_path less its final zero
_HEADER = struct.Struct("!I")
_MAX_FDS = 4


# -- where the pool is, and what its workers imported --------------------------------------------------------------


def socket_path() -> Path:
    """The pool socket of this user, interpreter and package: ``$XDG_RUNTIME_DIR`` or ``/tmp/omicsprep-UID``."""
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/omicsprep-{os.getuid()}")
    key = hashlib.sha1(f"{sys.executable}\0{Path(__file__).parent}".encode()).hexdigest()[:12]
    return folder / f"omicsprep-pool-{key}.sock"


def fingerprint() -> dict[str, Any]:
    """What a worker's imports depend on: the interpreter, the package's code, installed packages, settings."""
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
        "code": [str(package), len(sources), max(sources, default=0)],
        "packages": [_installed(folder) for folder in _package_folders()],
        "settings": dict(sorted(settings.items())),
        "affinity": sorted(os.sched_getaffinity(0)),
    }


def _installed(folder: str) -> str:
    """A digest of a package folder's entries and of the times of their metadata (installs and upgrades change them)."""
    metadata = (".dist-info", ".egg-info", ".egg-link", ".pth")
    installed = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name == "__pycache__":  # written at first imports
                continue
            with contextlib.suppress(FileNotFoundError):  # removed since the listing
                installed.append((entry.name, entry.stat().st_mtime_ns if entry.name.endswith(metadata) else 0))
    return hashlib.sha256(repr(sorted(installed)).encode()).hexdigest()


def _package_folders() -> list[str]:
    folders = [*site.getsitepackages(), site.getusersitepackages(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return [folder for folder in folders if folder and Path(folder).is_dir()]


def difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """The first part of two fingerprints that differs, in words; ``None`` when they are equal."""
    words = {
        "code": "omicsprep's code changed since the pool started",
        "packages": "packages were installed or removed since the pool started",
        "python": "another Python",
        "version": "another Python",
        "affinity": "the job may use other CPUs than the pool (a scheduler's job?)",
        "settings": "import-time environment variables differ",
    }
    return next((text for key, text in words.items() if ours.get(key) != theirs.get(key)), None)


# -- messages: length-prefixed JSON, with file descriptors alongside ------------------------------------------------


def _send(sock: socket.socket, message: dict[str, Any], *, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the descriptors sent with it; ``(None, [])`` once the peer has gone."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    data = b""
    while head and len(head) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(head))
        head = head + more if more else b""
    if not head:
        return None, fds
    (size,) = _HEADER.unpack(head)
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None, fds
        data += more
    return json.loads(data), fds


def _ask(request: dict[str, Any], *, path: Path | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
    """The server's answer to ``request``; ``None`` when no server answers."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path or socket_path()))
        _send(sock, request)
        answer, _ = _receive(sock)
        return answer
    return None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# -- a job's side ---------------------------------------------------------------------------------------------------


def hand_over(*, started_at: float) -> None:
    """Have a worker of the pool run this script, when the workflow started one; exit with its status.

    Returns (the job runs here) without a pool, in a worker, or when the pool refuses the job
    (saying why on standard error).

    Parameters
    ----------
    started_at
        When this process started (seconds since the epoch): the job's start-up counts from it.
    """
    path = os.environ.get(POOL)
    if not path or path == "off" or _job or sys.platform != "linux" or not Path(path).exists():
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
        "fingerprint": fingerprint(),
    }
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(path)
        if _peer_uid(conn) != os.getuid():
            raise PermissionError(f"{path} is served by another user")
        _send(conn, request, fds=[0, 1, 2])
        answer, _ = _receive(conn)
    except OSError as exc:  # a pool stopping or gone
        answer = {"refused": f"{type(exc).__name__}: {exc}"}
    if answer is None or "refused" in answer:
        reason = "the pool closed the connection" if answer is None else answer["refused"]
        print(
            f"omicsprep: the pool at {path} did not take this job ({reason}); it runs in its own process",
            file=sys.stderr,
        )
        conn.close()
        return
    status, _ = _receive(conn)  # the worker runs the job; this process ending (cancelled) stops it
    if status is None:
        print(
            f"omicsprep error: the pool at {path} stopped while worker {answer['worker']} ran this job", file=sys.stderr
        )
        os._exit(1)
    code = status["exit"]
    os._exit(code if code >= 0 else 128 - code)  # a signal's number, as a shell reports it


# -- a worker's side ------------------------------------------------------------------------------------------------

_job: dict[str, Any] = {}  # the job a worker runs: when its own process started, the worker's pid


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


def _peak_rss_kb() -> int:
    """VmHWM, the process's peak resident memory since it started or since :func:`_reset_peak_rss`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError):  # Linux 4.0+: "5" resets the peak to the current size
        Path("/proc/self/clear_refs").write_text("5")


def _boot() -> dict[str, float]:
    """Fork the figure process; import what jobs import; on a usable GPU, import its libraries and create a context.

    The figure process is forked first, while this process has no threads and no GPU library
    (a process forked after CUDA started must not be used). Returns seconds per stage.
    """
    from omicsprep import backend, background

    background.keep_figure_process(preload="omicsprep.plotting")
    seconds, start = {}, time.perf_counter()
    for name in PRELOADED:
        importlib.import_module(name)
    seconds["imports"] = time.perf_counter() - start
    if backend.gpu_unavailable_reason() is None:
        start = time.perf_counter()
        for name in PRELOADED_GPU:
            if importlib.util.find_spec(name.partition(".")[0]) is not None:
                backend.gpu_module(name)
        backend.cupy().cuda.runtime.free(0)  # the CUDA context
        seconds["gpu"] = time.perf_counter() - start
    return {name: round(value, 2) for name, value in seconds.items()}


def serve_jobs(channel_fd: int) -> None:
    """A worker's life: boot, say so on ``channel_fd``, then run each job sent; exit after a job that failed."""
    channel = socket.socket(fileno=channel_fd)
    seconds = _boot()
    log.info("worker %d ready: %s", os.getpid(), seconds)
    _send(channel, {"ready": os.getpid()})
    while True:
        request, fds = _receive(channel)
        if request is None:
            os._exit(0)
        code = _run_job(request, fds)
        _send(channel, {"exit": code})
        if code != 0:  # a failed or cancelled job may have left this process in any state
            os._exit(0)


def _run_job(request: dict[str, Any], fds: list[int]) -> int:
    """Run one job's script as its own process would, then give back what it took; its exit status."""
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    saved = (sys.stdin, sys.stdout, sys.stderr, list(sys.argv), list(sys.path), dict(os.environ), Path.cwd())
    root = logging.getLogger()
    saved_logging = (list(root.handlers), root.level)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    _close_all(fds)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    previous_umask = os.umask(request["umask"])
    sys.argv = list(request["run"])
    sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))
    _reset_peak_rss()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _job.update(started_at=request["started_at"], cpu_before=usage.ru_utime + usage.ru_stime)
    try:
        return _run(sys.argv[0])
    finally:
        _job.clear()
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
        _forget_job_state(*saved_logging)


def _forget_job_state(handlers: list[logging.Handler], level: int) -> None:
    """What a job leaves in the process beside its outputs, given back: log handlers, timings, device memory."""
    from omicsprep import backend, timings

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(capture=False)
    timings.reset_phases()
    gc.collect()
    if "cupy" in sys.modules:
        backend.release_device_memory()


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


# -- the server -----------------------------------------------------------------------------------------------------


@dataclass
class _Worker:
    process: subprocess.Popen
    channel: socket.socket
    ready: bool = False
    client: socket.socket | None = None  # the job's own process, while the worker runs its job
    cancelled_at: float | None = None  # when its job's process ended: killed if still running after the grace


@dataclass
class _Server:
    n_workers: int
    idle_seconds: float
    listener: socket.socket
    fingerprint: dict[str, Any]
    kernels: subprocess.Popen | None  # compiling the shipped GPU kernels; jobs wait for it
    workers: list[_Worker] = field(default_factory=list)
    waiting: list[tuple[socket.socket, dict[str, Any], list[int]]] = field(default_factory=list)
    last_active: float = field(default_factory=time.monotonic)
    stopping: bool = False
    socket_inode: int = 0
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)

    def start_worker(self) -> None:
        ours, theirs = socket.socketpair()
        process = subprocess.Popen(
            _module_command("worker", str(theirs.fileno())), pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL
        )
        theirs.close()
        worker = _Worker(process, ours)
        self.workers.append(worker)
        self.selector.register(ours, selectors.EVENT_READ, worker)

    def serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        for _ in range(self.n_workers):
            self.start_worker()
        while not (self.stopping and not self.workers):
            for key, _ in self.selector.select(timeout=0.5):
                if key.data is None:
                    self.accept()
                elif isinstance(key.data, _Worker):
                    self.hear_from(key.data)
                else:  # a job's own process ended while its worker runs it: cancelled
                    self.cancel(key.data)
            self.reap()
            self.dispatch()
            busy = any(worker.client for worker in self.workers) or self.waiting
            if not busy and time.monotonic() - self.last_active > self.idle_seconds:
                log.info("idle for %.0f s: stopping", self.idle_seconds)
                self.stop()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(30.0)  # the request follows the connection at once, but a loaded machine may delay it
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
        """Answer a status, grow or stop request at once; queue a job, or refuse it."""
        if request is None:
            conn.close()
            return
        if "status" in request or "grow" in request:
            if "grow" in request and not self.stopping:
                for _ in range(request["grow"] - self.n_workers):
                    self.start_worker()
                self.n_workers = max(self.n_workers, request["grow"])
            _send(conn, self.status())
            conn.close()
        elif "stop" in request:
            _send(conn, {"stopping": os.getpid()})
            conn.close()
            self.stop()
        elif self.stopping or (reason := difference(request["fingerprint"], self.fingerprint)) is not None:
            _send(conn, {"refused": "the pool is stopping" if self.stopping else reason})
            _close_all(fds)
            conn.close()
        else:
            conn.settimeout(None)
            self.waiting.append((conn, request, fds))
            self.last_active = time.monotonic()

    def hear_from(self, worker: _Worker) -> None:
        with contextlib.suppress(OSError):
            message, _ = _receive(worker.channel)
            if message is not None and "ready" in message:
                worker.ready = True
                return
            if message is not None and "exit" in message and worker.client is not None:
                with contextlib.suppress(OSError):
                    _send(worker.client, {"exit": message["exit"]})
                with contextlib.suppress(KeyError, ValueError):  # unregistered already if cancelled
                    self.selector.unregister(worker.client)
                worker.client.close()
                worker.client, self.last_active = None, time.monotonic()
                return
        with contextlib.suppress(KeyError, ValueError):  # the worker is exiting; reaped below
            self.selector.unregister(worker.channel)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(timeout=1)

    def cancel(self, client: socket.socket) -> None:
        """The job's own process ended: stop its worker as the process would have stopped (SIGTERM)."""
        for worker in self.workers:
            if worker.client is client:
                log.info("job of worker %d cancelled: stopping the worker", worker.process.pid)
                self.selector.unregister(client)
                worker.process.terminate()
                worker.cancelled_at = time.monotonic()

    def dispatch(self) -> None:
        """Give waiting jobs to ready workers, oldest first, once the GPU kernels are compiled."""
        if self.kernels is not None and self.kernels.poll() is None:
            return
        for worker in self.workers:
            if not self.waiting:
                break
            if not worker.ready or worker.client is not None:
                continue
            conn, request, fds = self.waiting.pop(0)
            try:
                _send(conn, {"worker": worker.process.pid})
                job = {key: request[key] for key in ("run", "cwd", "env", "umask", "started_at")}
                _send(worker.channel, job, fds=fds)
            except OSError:  # the job's process ended while it waited
                conn.close()
                continue
            finally:
                _close_all(fds)
            worker.client = conn
            self.selector.register(conn, selectors.EVENT_READ, conn)
            log.info("worker %d runs %s in %s", worker.process.pid, request["run"][0], request["cwd"])

    def reap(self) -> None:
        for worker in self.workers:  # a cancelled job's worker still in a long call: killed, as its process would be
            if worker.cancelled_at is not None and time.monotonic() - worker.cancelled_at > CANCEL_GRACE_SECONDS:
                worker.process.kill()
        for worker in [worker for worker in self.workers if worker.process.poll() is not None]:
            self.workers.remove(worker)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(worker.channel)
            worker.channel.close()
            if worker.client is not None:  # it died running a job (or was stopped): the job failed
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(worker.client)
                with contextlib.suppress(OSError):
                    _send(worker.client, {"exit": worker.process.returncode or 1})
                worker.client.close()
            elif not worker.ready and not self.stopping:  # it could not boot: jobs run in their own processes
                log.error(
                    "worker %d exited before it was ready (%d): stopping", worker.process.pid, worker.process.returncode
                )
                self.stop()
            if not self.stopping:
                self.start_worker()

    def stop(self) -> None:
        """Take no more jobs; idle workers end now, busy ones once their job ends."""
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
                _send(conn, {"refused": "the pool is stopping"})
            _close_all(fds)
            conn.close()
        self.waiting.clear()
        for worker in self.workers:
            if worker.client is None:
                worker.process.terminate()

    def status(self) -> dict[str, Any]:
        states = ["busy" if w.client else "ready" if w.ready else "booting" for w in self.workers]
        return {"server": os.getpid(), "fingerprint": self.fingerprint, "workers": states, "waiting": len(self.waiting)}


def _module_command(*args: str) -> list[str]:
    """The command running this module in this interpreter, without the current folder on its path (``-P``)."""
    return [sys.executable, "-P", "-m", "omicsprep.pool", *args]


def serve(*, n_workers: int, idle_seconds: float) -> None:
    """Run the server in this process until it is stopped or idle; one server per socket (a lock beside it)."""
    path = socket_path()
    lock = path.with_suffix(".lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("a pool runs at %s already", path)
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead server's: none holds the lock
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    path.chmod(0o600)
    listener.listen(64)
    kernels = subprocess.Popen([sys.executable, "-P", "-m", "omicsprep.kernels", "--ahead"], stdin=subprocess.DEVNULL)
    server = _Server(n_workers, idle_seconds, listener, fingerprint(), kernels, socket_inode=path.stat().st_ino)
    signal.signal(signal.SIGTERM, lambda signum, frame: server.stop())
    log.info("pool %d at %s: %d workers, stops after %.0f idle seconds", os.getpid(), path, n_workers, idle_seconds)
    server.serve()
    lock.close()


def _peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (Linux's SO_PEERCRED)."""
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


# -- the workflow's side --------------------------------------------------------------------------------------------


def status(path: Path | None = None) -> dict[str, Any] | None:
    """The running pool's server, fingerprint, workers' states and jobs waiting; ``None`` when none runs.

    ``path``: its socket (by default this user's, :func:`socket_path`).
    """
    return _ask({"status": True}, path=path)


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
        _ask({"grow": n_workers})
        return path
    if running is not None:
        _ask({"stop": True})
        deadline = time.monotonic() + 10
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.parent.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022 or len(str(path).encode()) > MAX_SOCKET_PATH:
        log.warning("no pool of warm processes: %s is not private to this user, or too long a path", path.parent)
        return None
    with path.with_suffix(".log").open("a") as log_file:
        subprocess.Popen(
            _module_command("serve", str(n_workers), str(idle_seconds)),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # outlives the run, and the terminal's signals
        )
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path


def stop(path: Path | None = None) -> dict[str, Any] | None:
    """Ask the pool to stop (busy workers finish their jobs first); ``None`` when none runs."""
    return _ask({"stop": True}, path=path)


def main(argv: list[str]) -> None:
    """``python -m omicsprep.pool serve N IDLE_SECONDS`` (the server) or ``worker FD`` (one worker)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if argv[0] == "serve":
        serve(n_workers=int(argv[1]), idle_seconds=float(argv[2]))
    elif argv[0] == "worker":
        serve_jobs(int(argv[1]))


if __name__ == "__main__":
    # As omicsprep.pool, the module the jobs' scripts import (not a second copy as __main__).
    importlib.import_module("omicsprep.pool").main(sys.argv[1:])
