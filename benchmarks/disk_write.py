"""How fast this machine takes a large output: one array written raw and through HDF5, as .h5ad matrices are.

    python -m benchmarks disk_write --gigabytes 2.8 --dir /tmp [--repeats 3]

A float32 array of ``--gigabytes`` (a 1M-cell sample's normalized values are about 2.8 GB)
is written ``--repeats`` times each way: with one ``write`` call, and as an HDF5 dataset
contiguous and chunked (anndata makes its sparse matrices' datasets resizable, so chunked).
The kernel's dirty-page settings and the dirty and writeback memory after each write are
printed: a write that outruns them waits on the disk.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import h5py
import numpy as np


def dirty() -> str:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return f"dirty {fields['Dirty'].strip()}, writeback {fields['Writeback'].strip()}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gigabytes", type=float, default=2.8)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace) -> None:
    settings = ("dirty_ratio", "dirty_background_ratio", "dirty_bytes", "dirty_background_bytes")
    print(", ".join(f"{name} {Path('/proc/sys/vm', name).read_text().strip()}" for name in settings))
    values = np.random.default_rng(0).random(int(args.gigabytes * 1e9 / 4), dtype=np.float32)
    path = args.dir / "disk_write_bench.out"

    def raw() -> None:
        with path.open("wb") as file:
            file.write(memoryview(values))

    def hdf5(**layout) -> None:
        with h5py.File(path, "w") as file:
            file.create_dataset("values", data=values, **layout)

    ways = {"raw write": raw, "HDF5 contiguous": hdf5, "HDF5 chunked (resizable)": lambda: hdf5(maxshape=(None,))}
    try:
        for _ in range(args.repeats):
            for name, write in ways.items():
                start = time.perf_counter()
                write()
                seconds = time.perf_counter() - start
                gigabytes = values.nbytes / 1e9
                print(f"{name}: {gigabytes:.2f} GB in {seconds:.2f} s, {gigabytes / seconds:.2f} GB/s; {dirty()}")
                path.unlink()
    finally:
        path.unlink(missing_ok=True)
