"""CuPy's kernels compiled ahead, in parallel processes (``omicsprep warm-kernels``).

CuPy compiles each kernel with NVRTC at first use, one after another, and caches it on disk
(``CUPY_CACHE_DIR``, by default ``~/.cupy/kernel_cache``). Rules qc and cluster ask for 140 of them:
on a fresh H200 machine that took 42 s, 27 s of it for 12 CUB reductions of 2-3 s each
(``benchmarks/kernel_compile.py``). Threads barely help: NVRTC compiled the 140 in 30.5 s
in 16 threads. So omicsprep ships the requests that ``omicsprep warm-kernels --record`` saw
(:data:`MANIFEST`: sources and options, not binaries), and the workflow's pool of GPU
processes (:mod:`omicsprep.pool`) hands them to one process per core as it starts (7.3 s on
16 cores of that machine), as ``omicsprep warm-kernels`` does before it runs the steps for
whatever the manifest lacks. A marker in the cache records that the manifest was compiled.

A manifest holds to the CuPy release that recorded it: under another one, the sources CuPy
generates may differ, so nothing is compiled ahead, and kernels compile at first use as before.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import heapq
import importlib
import inspect
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = Path(__file__).with_name("cupy_kernels.json.gz")

# The compiler's arguments that do not name a kernel: where its cache is, where its log goes.
UNRECORDED_ARGUMENTS = ("cache_dir", "log_stream")


def _compiler() -> Any:
    from omicsprep.backend import cupy_compiler

    return cupy_compiler()


def _roots() -> dict[str, str]:
    """Install folders named in compiler options, longest first: CuPy's package and its site-packages."""
    from omicsprep.backend import cupy

    package = Path(str(cupy().__file__)).parent
    return {"{cupy}": str(package), "{site}": str(package.parent)}


def portable_options(options: tuple[str, ...] | list[str], roots: dict[str, str]) -> list[str]:
    """``options`` with each root folder written as its placeholder (``roots``: placeholder to folder)."""
    return _replaced(options, [(folder, placeholder) for placeholder, folder in roots.items()])


def local_options(options: list[str], roots: dict[str, str]) -> tuple[str, ...]:
    """Options of a manifest with its placeholders replaced by this install's folders."""
    return tuple(_replaced(options, list(roots.items())))


def _replaced(options: tuple[str, ...] | list[str], replacements: list[tuple[str, str]]) -> list[str]:
    """Each option with every ``(old, new)`` of ``replacements`` applied, in order."""
    replaced = []
    for option in options:
        for old, new in replacements:
            option = option.replace(old, new)
        replaced.append(option)
    return replaced


@contextlib.contextmanager
def recorded_requests() -> Iterator[list[dict[str, Any]]]:
    """Record every kernel CuPy is asked to compile (or load from its cache) inside the ``with`` block.

    Yields the list that fills: each request's arguments by name (options portable, see
    :func:`portable_options`) and its ``seconds``. Requests with ``name_expressions`` are left
    out: CuPy compiles those again in every process.
    """
    compiler = _compiler()
    # CuPy offers no hook on its compiles: its module function is wrapped (CuPy 13 and 14).
    original = compiler._compile_module_with_cache  # noqa: SLF001
    signature, roots, requests = inspect.signature(original), _roots(), []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            arguments = dict(signature.bind(*args, **kwargs).arguments)
            if not arguments.get("name_expressions"):
                for name in UNRECORDED_ARGUMENTS:
                    arguments.pop(name, None)
                arguments["options"] = portable_options(arguments.get("options", ()), roots)
                requests.append({"arguments": arguments, "seconds": time.perf_counter() - start})

    compiler._compile_module_with_cache = recorded  # noqa: SLF001
    try:
        yield requests
    finally:
        compiler._compile_module_with_cache = original  # noqa: SLF001


def manifest_of(requests: list[dict[str, Any]], *, cupy_version: str) -> dict[str, Any]:
    """A manifest of ``requests`` (from :func:`recorded_requests`): each kernel once, its slowest time kept.

    The long texts that many kernels share (CuPy's headers, passed as ``extra_source``) are
    stored once, in ``texts``, and named by their index.
    """
    kernels: dict[str, dict[str, Any]] = {}
    texts: list[str] = []
    for request in requests:
        arguments = dict(request["arguments"])
        extra = arguments.get("extra_source")
        if extra is not None:
            if extra not in texts:
                texts.append(extra)
            arguments["extra_source"] = texts.index(extra)
        key = json.dumps(arguments, sort_keys=True)
        seconds = max(request["seconds"], kernels[key]["seconds"]) if key in kernels else request["seconds"]
        kernels[key] = {"arguments": arguments, "seconds": round(seconds, 3)}
    return {"cupy": cupy_version, "texts": texts, "kernels": list(kernels.values())}


def write_manifest(manifest: dict[str, Any], path: Path) -> None:
    """Write ``manifest`` as gzipped JSON, atomically."""
    from omicsprep.io import atomic_path

    with atomic_path(path, timed=False) as temporary:
        temporary.write_bytes(gzip.compress(json.dumps(manifest).encode(), mtime=0))


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` (:func:`write_manifest`)."""
    return _decoded(path.read_bytes())


def _decoded(manifest_bytes: bytes) -> dict[str, Any]:
    return json.loads(gzip.decompress(manifest_bytes))


def balanced_groups(kernels: list[dict[str, Any]], *, n_groups: int) -> list[list[dict[str, Any]]]:
    """``kernels`` in ``n_groups`` groups of about equal recorded seconds (longest first, to the least loaded)."""
    loads = [(0.0, index) for index in range(n_groups)]
    groups: list[list[dict[str, Any]]] = [[] for _ in range(n_groups)]
    for kernel in sorted(kernels, key=lambda kernel: -kernel["seconds"]):
        seconds, index = heapq.heappop(loads)
        groups[index].append(kernel)
        heapq.heappush(loads, (seconds + kernel["seconds"], index))
    return [group for group in groups if group]


def compile_manifest(manifest: dict[str, Any]) -> None:
    """Compile the kernels of ``manifest`` into CuPy's cache, in this process."""
    compiler, roots = _compiler(), _roots()
    for kernel in manifest["kernels"]:
        arguments = dict(kernel["arguments"])
        arguments["options"] = local_options(arguments.get("options", []), roots)
        if arguments.get("extra_source") is not None:
            arguments["extra_source"] = manifest["texts"][arguments["extra_source"]]
        compiler._compile_module_with_cache(**arguments)  # noqa: SLF001


class AheadCompilation:
    """Processes compiling a manifest's kernels into CuPy's cache; :meth:`finish` waits for them.

    Parameters
    ----------
    processes
        The processes started (empty when the cache holds the manifest already, or when
        the manifest is of another CuPy release).
    marker
        The file written into the cache once they all succeeded (``None``: none to write).
    folder
        The temporary folder of their groups' files, removed at the end.
    """

    def __init__(self, processes: list[subprocess.Popen], marker: Path | None, folder: Path | None) -> None:
        self.processes, self.marker, self.folder, self.started = processes, marker, folder, time.perf_counter()

    def finish(self) -> bool:
        """Wait for the processes; mark the cache when all succeeded. Whether they did (``True`` when none ran)."""
        failed = [process.args for process in self.processes if process.wait() != 0]
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        if failed:
            log.warning(
                "kernels compiled ahead: %d of %d processes failed (see above)", len(failed), len(self.processes)
            )
            return False
        if self.marker is not None:
            self.marker.touch()
            log.info(
                "kernels compiled ahead in %d processes in %.1f s",
                len(self.processes),
                time.perf_counter() - self.started,
            )
        return True


def start_compiling_ahead(*, processes: int, manifest_path: Path = MANIFEST) -> AheadCompilation:
    """Start compiling a manifest's kernels into CuPy's cache in up to ``processes`` processes, unless done before.

    Call it with a CUDA context current (each process creates its own, to load what it compiled).

    Parameters
    ----------
    processes
        Processes at most; each compiles a share of about equal recorded time.
    manifest_path
        The manifest (:func:`write_manifest`).
    """
    from omicsprep.backend import cupy

    cp = cupy()
    manifest_bytes = manifest_path.read_bytes()
    manifest = _decoded(manifest_bytes)  # its bytes name the cache's marker
    if manifest["cupy"] != cp.__version__:
        log.info("kernels not compiled ahead: the manifest is of CuPy %s, this is %s", manifest["cupy"], cp.__version__)
        return AheadCompilation([], None, None)
    device = cp.cuda.Device()
    # The cache's kernels are for this device's architecture and this CUDA release.
    identity = b" ".join(
        [manifest_bytes, str((device.compute_capability, cp.cuda.runtime.runtimeGetVersion())).encode()]
    )
    marker = _cache_dir() / f"omicsprep-kernels-{hashlib.sha256(identity).hexdigest()[:16]}"
    if marker.exists():
        return AheadCompilation([], None, None)
    marker.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="omicsprep-kernels-"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": _visible_device(device.id)}
    started = []
    for index, group in enumerate(balanced_groups(manifest["kernels"], n_groups=max(1, processes))):
        path = folder / f"group{index}.json"
        path.write_text(json.dumps({**manifest, "kernels": group}))
        command = [sys.executable, "-m", "omicsprep.kernels", str(path)]
        started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env))
    return AheadCompilation(started, marker, folder)


@contextlib.contextmanager
def shipped_kernels_compiling(backend: str, *, processes: int) -> Iterator[None]:
    """On the GPU backend, compile the shipped kernels (:data:`MANIFEST`) while the block runs; wait for them after.

    Nothing on the CPU backend, or when the cache holds them already. Creates a CUDA
    context in this process (each compiling process creates its own).

    Parameters
    ----------
    backend
        ``"cpu"`` or ``"gpu"``.
    processes
        Compiling processes at most.
    """
    if backend != "gpu":
        yield
        return
    from omicsprep.backend import cupy

    cupy().cuda.runtime.free(0)
    compilation = start_compiling_ahead(processes=processes)
    try:
        yield
    finally:
        compilation.finish()


def _cache_dir() -> Path:
    """CuPy's kernel cache folder (CuPy 14 no longer tells it)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")


def _visible_device(index: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` naming only this process's device ``index``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[index] if visible else str(index)


def compile_shipped_kernels() -> None:
    """Compile the shipped kernels into this machine's cache in a process per core, unless done before (or no GPU)."""
    from omicsprep.backend import gpu_unavailable_reason
    from omicsprep.resources import usable_cores

    if (reason := gpu_unavailable_reason()) is not None:
        log.info("kernels not compiled ahead: %s", reason)
        return
    with shipped_kernels_compiling("gpu", processes=usable_cores()):
        pass


def main(argv: list[str] | None = None) -> None:
    """``python -m omicsprep.kernels --ahead`` (:func:`compile_shipped_kernels`, as a pool starts) or ``GROUP.json``.

    A group file holds the kernels one compiling process compiles (:func:`start_compiling_ahead`).
    """
    from omicsprep.backend import cupy

    (path,) = sys.argv[1:] if argv is None else argv
    if path == "--ahead":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
        compile_shipped_kernels()
        return
    group = json.loads(Path(path).read_text())
    Path(path).unlink()  # gone even when the command that started this process was stopped first
    cupy().cuda.runtime.free(0)  # a context, into which each compiled kernel is loaded
    compile_manifest(group)


if __name__ == "__main__":
    # As omicsprep.kernels (its logger's name, its globals), not a second copy as __main__.
    importlib.import_module("omicsprep.kernels").main()
