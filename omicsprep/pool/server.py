"""The pool's server: it keeps its workers, queues the jobs handed over and gives each to a ready worker.

One server per socket (a lock beside it); it stops when asked or after ``idle_seconds``
without a job. It imports what jobs import once and forks each worker from itself: eight
workers importing at once took 6-9 s to be ready on the H100 machine (16 cores), against
about 4 s for one process (``benchmarks/RESULTS.md``), and a worker that replaces a failed one
is ready at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from omicsprep.pool.protocol import close_all, difference, fingerprint, peer_uid, receive, send, socket_path
from omicsprep.pool.worker import become_worker, preload

log = logging.getLogger(__name__)

CANCEL_GRACE_SECONDS = 10.0


@dataclass
class _Forked:
    """A process this one forked: the calls of :class:`subprocess.Popen` that the server makes."""

    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, *, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


@dataclass
class _Worker:
    process: _Forked
    channel: socket.socket
    ready: bool = False  # takes a job: booted, or done tidying after its last one
    booted: bool = False
    settled: bool = False  # done importing while idle: a job given to it waits for no import
    client: socket.socket | None = None  # the job's own process, while the worker runs its job
    kept: frozenset[str] = frozenset()  # files whose matrices its last job left in it (worker.keep_for_next_job)
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
        pid = os.fork()
        if pid == 0:
            become_worker(theirs.fileno())
        theirs.close()
        worker = _Worker(_Forked(pid), ours)
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
            if peer_uid(conn) != os.getuid():
                raise PermissionError("a process of another user")
            request, fds = receive(conn)
            self.answer(conn, request, fds)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("request refused: %s: %s", type(exc).__name__, exc)
            close_all(fds)
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
            send(conn, self.status())
            conn.close()
        elif "stop" in request:
            send(conn, {"stopping": os.getpid()})
            conn.close()
            self.stop()
        elif self.stopping or (reason := difference(request["fingerprint"], self.fingerprint)) is not None:
            send(conn, {"refused": "the pool is stopping" if self.stopping else reason})
            close_all(fds)
            conn.close()
        elif not request.get("wait", True) and self.free_workers() <= len(self.waiting):
            send(conn, {"busy": True})  # a job that would rather run in its own process than wait
            close_all(fds)
            conn.close()
        else:
            conn.settimeout(None)
            self.waiting.append((conn, request, fds))
            self.last_active = time.monotonic()

    def free_workers(self) -> int:
        """Workers without a job, ready or tidying after their last (a second at most), the GPU kernels compiled."""
        if self.kernels is not None and self.kernels.poll() is None:
            return 0
        return sum(worker.booted and worker.client is None for worker in self.workers)

    def hear_from(self, worker: _Worker) -> None:
        with contextlib.suppress(OSError):
            message, _ = receive(worker.channel)
            if message is not None and "ready" in message:
                worker.ready = worker.booted = True
                return
            if message is not None and "settled" in message:
                worker.settled = True
                return
            if message is not None and "exit" in message and worker.client is not None:
                worker.ready = False  # it tidies after its job, then says it is ready
                worker.kept = frozenset(message["kept"])
                for other in self.workers:  # written again: an older copy elsewhere is stale
                    if other is not worker:
                        other.kept -= worker.kept
                with contextlib.suppress(OSError):
                    send(worker.client, {"exit": message["exit"]})
                with contextlib.suppress(KeyError, ValueError):  # unregistered already if cancelled
                    self.selector.unregister(worker.client)
                worker.client.close()
                worker.client, self.last_active = None, time.monotonic()
                if message["exit"] != 0:  # it exits at once (worker.serve_jobs): reaped and replaced below
                    worker.process.wait(timeout=1)
                elif self.stopping:  # asked to stop while it ran the job
                    worker.process.terminate()
                return
        with contextlib.suppress(KeyError, ValueError):  # the worker is exiting; reaped once it has
            self.selector.unregister(worker.channel)

    def cancel(self, client: socket.socket) -> None:
        """The job's own process ended: stop its worker as the process would have stopped (SIGTERM)."""
        for worker in self.workers:
            if worker.client is client:
                log.info("job of worker %d cancelled: stopping the worker", worker.process.pid)
                self.selector.unregister(client)
                worker.process.terminate()
                worker.cancelled_at = time.monotonic()

    def dispatch(self) -> None:
        """Give waiting jobs to ready workers, oldest first, once the GPU kernels are compiled.

        A job that reads a file whose matrix a worker keeps goes to that worker, and waits for
        it while it tidies after the job that wrote the file (a second at most). Other jobs go
        first to workers done importing while idle: a job given to a worker in the middle of
        an import waits for it (MultiQC's, about a second, delayed a 100,000-cell cluster job
        by 0.9 s on an H100 while seven workers had nothing left to import).
        """
        if self.kernels is not None and self.kernels.poll() is None:
            return
        for waiting in list(self.waiting):
            worker = self.worker_for(set(waiting[1]["inputs"]))
            if worker is not None:
                self.waiting.remove(waiting)
                self.give(worker, *waiting)

    def worker_for(self, inputs: set[str]) -> _Worker | None:
        """The worker for a job reading ``inputs``: the one keeping one of them, else a free one.

        Free ones keeping nothing come first (another's kept matrix waits for its own job),
        then settled ones.
        """
        free = [worker for worker in self.workers if worker.booted and worker.client is None]
        keeping = [worker for worker in free if worker.kept & inputs]
        if keeping:
            return keeping[0] if keeping[0].ready else None
        ready = [worker for worker in free if worker.ready]
        return min(ready, key=lambda worker: (bool(worker.kept), not worker.settled), default=None)

    def give(self, worker: _Worker, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        """Send the job to ``worker``, and tell the job's process which worker runs it."""
        try:
            send(conn, {"worker": worker.process.pid})
            job = {key: request[key] for key in ("run", "cwd", "env", "umask", "started_at")}
            send(worker.channel, job | {"take": sorted(worker.kept.intersection(request["inputs"]))}, fds=fds)
        except OSError:  # the job's process ended while it waited
            conn.close()
            return
        finally:
            close_all(fds)
        worker.client, worker.kept = conn, frozenset()
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
                    send(worker.client, {"exit": worker.process.returncode or 1})
                worker.client.close()
            elif not worker.booted and not self.stopping:  # it could not boot: jobs run in their own processes
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
                send(conn, {"refused": "the pool is stopping"})
            close_all(fds)
            conn.close()
        self.waiting.clear()
        for worker in self.workers:
            if worker.client is None:
                worker.process.terminate()

    def status(self) -> dict[str, Any]:
        states = [
            "busy" if w.client else "ready" if w.ready else "tidying" if w.booted else "booting" for w in self.workers
        ]
        return {
            "server": os.getpid(),
            "fingerprint": self.fingerprint,
            "workers": states,
            "importing": sum(worker.booted and not worker.settled for worker in self.workers),
            "waiting": len(self.waiting),
        }


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
    seconds = preload()  # a failure ends the server: jobs then run in their own processes, and report it
    server = _Server(n_workers, idle_seconds, listener, fingerprint(), kernels, socket_inode=path.stat().st_ino)
    signal.signal(signal.SIGTERM, lambda signum, frame: server.stop())
    log.info(
        "pool %d at %s: %d workers, stops after %.0f idle seconds; imported what jobs import in %.2f s",
        os.getpid(),
        path,
        n_workers,
        idle_seconds,
        seconds,
    )
    server.serve()
    lock.close()
