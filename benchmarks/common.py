"""What the benchmark suites share: the benchmark settings, the workflow's run, the machine, RESULTS.md."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import pandas as pd
import yaml

from omicsprep.testing import snakemake_command
from omicsprep.testing.generate import generate, write_10x_h5

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "RESULTS.md"

# Settings shared by the workflow and the peer: fixed thresholds (the peer does no MAD).
BENCH_CONFIG = {
    "qc": {"filter": {"method": "thresholds", "min_genes": 200, "max_pct_mt": 20}, "min_cells_per_gene": 3},
    "doublets": {"enabled": True, "expected_rate": 0.04, "remove": True},
    "leiden": {"resolutions": [1.0]},
    "louvain": {"resolutions": []},
    "markers": {"algorithm": "leiden", "resolution": 1.0, "method": "wilcoxon", "n_genes": 25},
    "coexpression": {"enabled": False},  # the scanpy peer has no counterpart (coexpr_bench.py times it)
}


def bench_config(workdir: Path, *, h5ad_compression: str | None = None) -> Path:
    """The shipped config with BENCH_CONFIG's sections merged in (its ``qc.filter`` replaces).

    ``h5ad_compression``, if given, replaces the shipped one (``none``: uncompressed).
    """
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for section, values in BENCH_CONFIG.items():
        config[section] = {**config.get(section, {}), **values}
    if h5ad_compression is not None:
        config["h5ad_compression"] = None if h5ad_compression == "none" else h5ad_compression
    path = workdir / "bench_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def bench_settings(workdir: Path) -> dict:
    """:func:`bench_config`'s settings with the schema's defaults filled in."""
    from omicsprep.cli import workflow_config

    return workflow_config([bench_config(workdir)])


def clustering_options(config: dict):
    """The cluster rule's options from a whole configuration: a section per field, as the workflow gives them."""
    from omicsprep.options import ClusteringOptions, from_sections

    return from_sections(ClusteringOptions, config)


def dataset(workdir: Path, n_cells: int, n_genes: int, jobs: int) -> Path:
    path = workdir / "data" / f"{n_cells}x{n_genes}.h5"
    if not path.exists():  # written atomically, so an existing file is whole
        write_10x_h5(generate(n_cells, n_genes, seed=0, jobs=jobs), path)
    return path


def stop_pool() -> None:
    """Stop this user's GPU pool (:mod:`omicsprep.pool`) and wait until it is gone: as before a first run."""
    from omicsprep import pool

    pool.stop()
    deadline = time.monotonic() + 60
    while pool.status() is not None and time.monotonic() < deadline:
        time.sleep(0.1)


def run_arguments(rundir: Path, *, config: Path, sheet: Path) -> list[str]:
    """Snakemake's arguments for a run in ``rundir``; ``--config`` comes last, so that more settings may follow."""
    return ["--directory", str(rundir), "--configfile", str(config), "--config", f"samples={sheet}"]


def run_snakemake(
    rundir: Path,
    *,
    config: Path,
    sheet: Path,
    backend: str,
    cores: int,
    settings: Sequence[str] = (),
    extra: Sequence[str] = ("--resources", "gpu=1"),
    environment: dict[str, str] | None = None,
) -> float:
    """Run the whole workflow in ``rundir`` (every job, quietly); its wall seconds.

    ``settings`` (``key=value``) go after ``--config``; ``extra`` arguments are passed on
    (by default one GPU); ``environment`` adds to :func:`user_environment`.
    """
    command = snakemake_command(
        *run_arguments(rundir, config=config, sheet=sheet),
        f"backend={backend}",
        *settings,
        "--cores",
        str(cores),
        *extra,
        "--forceall",
        "--quiet",
    )
    # The disk takes earlier runs' outputs (17 GB at 1M cells) in first: a run started while
    # they are still being written back waits on them (Snakemake's start took 1.3-9.1 s).
    os.sync()
    start = time.perf_counter()
    env = {**user_environment(), **(environment or {})}
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"workflow ({backend}) failed:\n{result.stderr[-5000:]}")
    return time.perf_counter() - start


def machine() -> str:
    gpu = ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError, IndexError):
        gpu = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=True
            )
            .stdout.strip()
            .splitlines()[0]
        )
    return f"{platform.node()}: {os.cpu_count()} CPU cores ({cpu_model()}), {platform.machine()}" + (
        f", {gpu}" if gpu else ""
    )


def cpu_model() -> str:
    """The CPU model (Linux): leases of one GPU kind came with other CPUs, and CPU-backend runs differ by them."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown CPU"


def append_results(path: Path, *, title: str, note: str, table: pd.DataFrame, level: str = "###") -> str:
    """Append ``table`` to RESULTS.md; return the date stamp.

    Under a heading naming the date and the command that made it, with this machine and ``note``.
    """
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with path.open("a") as handle:
        handle.write(
            f"\n{level} {title}, {stamp}: `{command}`\n\nMachine: {machine()}. {note}\n\n"
            + table.astype(str).to_markdown(index=False)
            + "\n"
        )
    return stamp


def user_environment() -> dict[str, str]:
    """The environment as on a user's machine, where Python caches compiled modules (``__pycache__``).

    Some sandboxes set PYTHONDONTWRITEBYTECODE, and every process then compiles omicsprep's
    modules anew (about 1 s on 2 cores), a cost no user pays after the first run. A pool
    socket named by the caller's environment is left out: the workflow starts its own.
    """
    return {
        name: value for name, value in os.environ.items() if name not in ("PYTHONDONTWRITEBYTECODE", "OMICSPREP_POOL")
    }


def kernel_caches(folder: Path) -> dict[str, str]:
    """Environment variables that point the kernel caches at folders under ``folder``.

    CuPy's and Numba's compiled kernels, and the CUDA driver's (Numba's PTX is compiled to
    the GPU's code by the driver). Empty at first, as on a fresh machine.
    """
    caches = {name: folder / name.lower() for name in ("CUPY_CACHE_DIR", "NUMBA_CACHE_DIR", "CUDA_CACHE_PATH")}
    for path in caches.values():
        path.mkdir(parents=True, exist_ok=True)
    return {name: str(path) for name, path in caches.items()}


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with ``extra``, for a child running a suite (``python -m benchmarks``) from any folder."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, **(extra or {}), "PYTHONPATH": os.pathsep.join(paths)}


def measure_in_child(suite: str, *args: str) -> dict | None:
    """Run the benchmark ``suite`` with ``args`` in a fresh Python process; return its JSON row.

    The row is its last line of output, printed too (``None``, with its error printed, on failure).
    """
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", suite, *args], capture_output=True, text=True, env=child_environment()
    )
    if result.returncode != 0:
        print(result.stderr[-3000:], flush=True)
        return None
    row = json.loads(result.stdout.strip().splitlines()[-1])
    print(row, flush=True)
    return row


def device_statistics():
    """RMM's allocation statistics, switched on, or ``None`` where this RMM lacks them.

    CuPy allocates through RMM once RAPIDS is imported.
    """
    try:
        import rmm.statistics

        rmm.statistics.enable_statistics()
    except (ImportError, AttributeError):
        return None
    return rmm.statistics


def versions() -> str:
    import importlib.metadata as md

    names = ["scanpy", "anndata", "snakemake", "rapids-singlecell", "cuml-cu13", "cugraph-cu13"]
    found = []
    for name in names:
        with contextlib.suppress(md.PackageNotFoundError):
            found.append(f"{name} {md.version(name)}")
    return f"Python {platform.python_version()}, " + ", ".join(found)


class BackgroundThread:
    """A daemon thread running ``self._run`` while the ``with`` block lasts; ``self._stop`` is set at its end."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
