"""Host memory, disk, threads and GPUs a rule's job needs, from the size of its inputs.

The rules declare ``mem_mb`` and ``disk_mb`` with these (``rules/common/resources.smk`` wraps them as
Snakemake's callable resources), so local runs and cluster profiles size each job by its
data rather than by one figure per rule. Each rule's figures are a base (the Python process,
its libraries and the GPU runtime) plus a multiple of its inputs' megabytes, calibrated by
``benchmarks/resources.py`` and the atlas-size runs in ``benchmarks/RESULTS.md``
(section "Resources follow the data"). Memory grows with each retry (``attempt``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MB = 1_000_000


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the system has one: Linux)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# A job on a local GPU whose inputs hold at most this many megabytes shares the GPU with other
# such jobs (it asks for no whole GPU: gpu=0); a larger one holds it (gpu=1), apart from other
# large ones. A 10,000-cell sample holds about 60 MB, 100,000 cells about 700 MB, 1,000,000
# cells about 7 GB, and a job's device memory peaks at a few times its inputs.
SHARED_GPU_MAX_INPUT_MB = 2000.0
# Threads of a job on the CPU backend (a profile's set-threads overrides them); a job on the GPU
# asks for one: its work is on the device (and it may wait for a worker of the pool meanwhile).
CPU_THREADS = {"qc": 2, "cluster": 4}


def gpu_expected() -> bool:
    """Whether backend ``auto`` will find a GPU here, told without starting CUDA: a visible NVIDIA device and RAPIDS."""
    import importlib.util

    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    devices = Path("/dev").glob("nvidia[0-9]*")
    return any(devices) and all(importlib.util.find_spec(name) is not None for name in ("cupy", "rapids_singlecell"))


def gpus(*, backend: str, inputs_mb: float, local: bool) -> int:
    """GPUs a job asks the scheduler for: none on the CPU; on a cluster one; locally one only for large inputs.

    Parameters
    ----------
    backend
        The rule's configured backend (``cpu``, ``gpu`` or ``auto``).
    inputs_mb
        The job's inputs (:func:`paths_mb`).
    local
        Whether Snakemake runs the job on this machine (not a cluster executor).
    """
    if backend == "cpu":
        return 0
    return 1 if not local or inputs_mb > SHARED_GPU_MAX_INPUT_MB else 0


def threads(rule: str, *, backend: str, on_gpu: bool) -> int:
    """Threads of a rule's jobs: one on the GPU, else the rule's CPU threads (:data:`CPU_THREADS`).

    Parameters
    ----------
    rule
        The rule.
    backend
        The rule's configured backend.
    on_gpu
        Whether backend ``auto`` lands on the GPU here (:func:`gpu_expected`).
    """
    return 1 if backend == "gpu" or (backend == "auto" and on_gpu) else CPU_THREADS.get(rule, 1)


POOL_WORKERS = "OMICSPREP_POOL_WORKERS"


def pool_workers(cores: int) -> int:
    """Warm processes of the GPU job pool (:mod:`omicsprep.pool`): half the cores, at most 8, one per 8 GB of memory.

    ``OMICSPREP_POOL_WORKERS`` in the environment sets the number instead.

    Raises
    ------
    ValueError
        That setting is not a whole number of 1 or more.
    """
    if value := os.environ.get(POOL_WORKERS, "").strip():
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{POOL_WORKERS}={value!r}: give a whole number of workers, 1 or more")
        return int(value)
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return max(1, min(8, cores // 2, int(memory_gb // 8)))


@dataclass(frozen=True)
class ResourceModel:
    """A rule's needs: ``base + per_input x inputs`` megabytes, of memory and of disk.

    The defaults are a matrix rule's (a matrix read whole): see :data:`MODELS`.

    Attributes
    ----------
    memory_base_mb
        Memory of the rule's process before its data: interpreter, libraries, CUDA context.
    memory_per_input_mb
        Peak memory per megabyte of inputs (compressed matrices expand when read).
    disk_per_input_mb
        Outputs per megabyte of inputs.
    disk_base_mb
        Outputs of any size (figures, tables).
    gpu_memory_per_input_mb
        Peak memory per megabyte of inputs where the rule's backend is ``gpu``, if it differs
        (its matrices wait on the GPU); ``None``: as on the CPU. A rule on ``auto`` is sized
        as on the CPU, since where it lands is known only when it runs.
    """

    # Measured (benchmarks/RESULTS.md, "Resources follow the data"): on the CPU backend, qc's
    # peak was 1.6-1.7 GB for a 198 MB matrix and 2.7 GB for a 981 MB one (20,000 and 100,000
    # cells), and cluster's 0.8-0.9 and 2.0 GB for its 120 and 588 MB input; on the GPU at
    # 3,000,000 cells qc's host peak was 78 GB for a 29 GB matrix, and 30 GB since the matrix
    # goes to the GPU in row blocks and is written from there (tree afb640d).
    # 3,000 MB plus 3x the inputs covers all of them. Inputs count their values uncompressed
    # (paths_mb): a gzip .h5ad holds about five times its size.
    memory_base_mb: float = 3000.0
    memory_per_input_mb: float = 3.0
    disk_per_input_mb: float = 1.5
    disk_base_mb: float = 100.0
    gpu_memory_per_input_mb: float | None = None


# Outputs: qc writes 0.6x its input, cluster 2.1-2.3x its input (the embeddings and layers).
MODELS: dict[str, ResourceModel] = {
    # Reads are streamed in chunks: memory follows the chunk and the cells, not the file
    # (0.37-0.54 GB from 10M to 100M reads, docs/steps.md "Counting UMIs from reads").
    "count_umis": ResourceModel(memory_base_mb=4000, memory_per_input_mb=0.1, disk_per_input_mb=0.2),
    # Not measured: a raw matrix read whole, plus emptyDrops' and the quick clustering's copies.
    "call_cells": ResourceModel(memory_per_input_mb=4.0, disk_per_input_mb=0.5),
    # Not measured: CellBender reads the raw matrix into its own process (PyTorch, pyro).
    "cellbender": ResourceModel(memory_base_mb=4000, memory_per_input_mb=4.0, disk_per_input_mb=2.0),
    # On the GPU the host holds less: qc and cluster in one process (a rule since merged into
    # them) peaked at 0.78x their inputs at 1,000,000 cells (7.6 GB) and 1.04x at 3,000,000
    # (30.4 GB, the matrix in row blocks); 1.5x leaves room.
    "qc": ResourceModel(disk_per_input_mb=1.0, gpu_memory_per_input_mb=1.5),
    "cluster": ResourceModel(disk_per_input_mb=2.5, gpu_memory_per_input_mb=1.5),
    # Not measured: as a matrix rule.
    "coexpression": ResourceModel(),
    "protein": ResourceModel(),
    # Fragments are streamed in chunks; the cells x tiles matrix is what stays (1.35 GB peak
    # for a 4.2 GB fragments file, benchmarks/RESULTS.md "Fragments to tiles").
    "atac": ResourceModel(memory_per_input_mb=0.5, disk_per_input_mb=0.5),
    "multiome": ResourceModel(),
    # Not measured against inputs: the samples are concatenated in memory, their matrices and
    # the merged one.
    "merge": ResourceModel(memory_base_mb=4000, memory_per_input_mb=4.0, disk_per_input_mb=1.5),
    # Not measured: the counts read whole, log-normalized once more, scored in blocks of cells.
    "annotate": ResourceModel(memory_per_input_mb=3.0, disk_per_input_mb=0.1),
}


def memory_mb(rule: str, *, inputs_mb: float, attempt: int = 1, backend: str = "cpu") -> int:
    """Megabytes of host memory for a job of ``rule`` whose inputs total ``inputs_mb``.

    Parameters
    ----------
    rule
        A rule of :data:`MODELS`.
    inputs_mb
        The job's inputs, megabytes on disk.
    attempt
        Snakemake's attempt (1 first): each retry asks for that many times more.
    backend
        The rule's configured backend (``cpu``, ``gpu`` or ``auto``).

    Returns
    -------
    Whole megabytes.
    """
    model = MODELS[rule]
    per_input = model.memory_per_input_mb
    if backend == "gpu" and model.gpu_memory_per_input_mb is not None:
        per_input = model.gpu_memory_per_input_mb
    return int(model.memory_base_mb + per_input * inputs_mb) * attempt


def disk_mb(rule: str, *, inputs_mb: float) -> int:
    """Megabytes of disk for the outputs of a job of ``rule`` whose inputs total ``inputs_mb``."""
    model = MODELS[rule]
    return int(model.disk_base_mb + model.disk_per_input_mb * inputs_mb)


def paths_mb(paths: Iterable[str]) -> float:
    """Megabytes of files, and of every file within folders (a MatrixMarket folder, a Zarr store).

    On disk, but HDF5 files (.h5ad, 10x .h5) count their values uncompressed (:func:`_held_bytes`).

    Raises
    ------
    FileNotFoundError
        A path does not exist yet, named as given (Snakemake then sizes the job once it does).
    """
    total = 0
    for path in paths:
        location = Path(path)
        if not location.exists():
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", path)
        files = location.rglob("*") if location.is_dir() else [location]
        total += sum(_held_bytes(file) for file in files if file.is_file())
    return total / MB


HDF5_SUFFIXES = (".h5ad", ".h5")


def _held_bytes(file: Path) -> int:
    """Bytes a file holds: an HDF5 file (.h5ad, a 10x .h5) its values uncompressed, any other its size.

    A compressed .h5ad (``h5ad_compression: gzip``, the default) takes about a fifth of its
    values on disk, and a Cell Ranger matrix less: memory follows the values read, not the file.
    """
    size = file.stat().st_size
    if file.suffix not in HDF5_SUFFIXES:
        return size
    import h5py

    values = 0

    def add(_: str, node: object) -> None:
        nonlocal values
        if isinstance(node, h5py.Dataset):  # each once: hard links (a layer's shared indices) are one object
            values += (node.size or 0) * node.dtype.itemsize  # an empty (null) dataspace has no size

    try:
        with h5py.File(file, "r") as handle:
            handle.visititems(add)
    except OSError:  # not HDF5 after all: its size
        return size
    return max(size, values)
