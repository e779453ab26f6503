"""Where this user's pool is, what its workers' imports depend on, and how its processes talk.

Messages are length-prefixed JSON, with file descriptors (a job's standard streams) alongside.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import site
import socket
import struct
import sys
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).parents[1]  # omicsprep's code, which the pool serves
# The pool's socket, set by the workflow for its jobs, which hand themselves over; set beforehand,
# the workflow uses that pool (``off``: none, each job in its own process).
POOL = "OMICSPREP_POOL"
# Settings read when libraries are imported: a job whose values differ runs in its own process.
IMPORT_TIME_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "LANG")
IMPORT_TIME_PREFIXES = ("PYTHON", "LC_", "CUDA_", "CUPY_", "NUMBA_", "RAPIDS_", "OMICSPREP_")
RUN_TIME_NAMES = ("CUDA_CACHE_PATH", "NUMBA_NUM_THREADS", POOL)  # read per job: they may differ
MAX_SOCKET_PATH = 107  # bytes, Linux's sun_path less its final zero
HEADER = struct.Struct("!I")
MAX_FDS = 4


def socket_path() -> Path:
    """The pool socket of this user, interpreter and package: ``$XDG_RUNTIME_DIR`` or ``/tmp/omicsprep-UID``."""
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/omicsprep-{os.getuid()}")
    key = hashlib.sha1(f"{sys.executable}\0{PACKAGE}".encode()).hexdigest()[:12]
    return folder / f"omicsprep-pool-{key}.sock"


def fingerprint() -> dict[str, Any]:
    """What a worker's imports depend on: the interpreter, the package's code, installed packages, settings."""
    sources = [path.stat().st_mtime_ns for path in PACKAGE.rglob("*.py")]
    settings = {
        name: absolute_python_path(value) if name == "PYTHONPATH" else value
        for name, value in os.environ.items()
        if (name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES)) and name not in RUN_TIME_NAMES
    }
    return {
        "python": sys.executable,
        "version": sys.version,
        "code": [str(PACKAGE), len(sources), max(sources, default=0)],
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
    python_path = absolute_python_path(os.environ.get("PYTHONPATH", "")).split(os.pathsep)
    folders = [*site.getsitepackages(), site.getusersitepackages(), *python_path]
    return [folder for folder in folders if folder and Path(folder).is_dir()]


def absolute_python_path(value: str) -> str:
    """A ``PYTHONPATH`` with its folders made absolute from this process's folder (empty entries kept).

    The pool's server runs in ``/``, its jobs in their runs' folders: relative folders would
    name other places in each.
    """
    return os.pathsep.join(str(Path(folder).absolute()) if folder else "" for folder in value.split(os.pathsep))


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


def send(sock: socket.socket, message: dict[str, Any], *, fds: list[int] | None = None) -> None:
    """Send ``message``, with ``fds`` (descriptors) alongside."""
    data = json.dumps(message).encode()
    payload = HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the descriptors sent with it; ``(None, [])`` once the peer has gone."""
    head, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    data = b""
    while head and len(head) < HEADER.size:
        more = sock.recv(HEADER.size - len(head))
        head = head + more if more else b""
    if not head:
        return None, fds
    (size,) = HEADER.unpack(head)
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None, fds
        data += more
    return json.loads(data), fds


def ask(request: dict[str, Any], *, path: Path | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
    """The server's answer to ``request``; ``None`` when no server answers."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path or socket_path()))
        send(sock, request)
        answer, _ = receive(sock)
        return answer
    return None


def close_all(fds: list[int]) -> None:
    """Close the descriptors ``fds`` (those already closed too)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (Linux's SO_PEERCRED)."""
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


def module_command(*args: str) -> list[str]:
    """The command running this module in this interpreter, without the current folder on its path (``-P``)."""
    return [sys.executable, "-P", "-m", "omicsprep.pool", *args]
