"""UMI counting speed: ``umi_tools count`` against ``omicsprep count-umis`` on the same BAM.

    python -m benchmarks umi [--reads 10000000] [--repeats 3] [--backends cpu gpu] [--workdir /tmp/omicsprep-umi]

Generates a realistic BAM per size (omicsprep/testing/reads.py: skewed genes and PCR
duplicates, sequencing errors, N, unassigned and multi-gene reads, secondary alignments;
cached in the work folder; 10M reads take pysam about 2 minutes to write), runs both tools
end to end (process start included) with the directional method, prints reads/s and the
ratio, and appends the table with machine, date and command to RESULTS.md. omicsprep runs
``--repeats`` times per backend (the machine may be shared; ``--backends``, cpu by default,
on all cores): its median and best seconds are given, the speed-up from the median.
``inflate_only`` is the rate at which one core merely decompresses the BAM's BGZF
blocks (zlib): the ceiling for any reader on that core; ``oxbow_decode`` and
``pysam_decode`` time the two readers considered, decoding only what deduplication needs.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import RESULTS, append_results, user_environment
from omicsprep.testing.reads import generate_reads, umi_tools_count_command, write_bam


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=user_environment())
    if result.returncode != 0:
        raise RuntimeError(f"{command[0]} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def console_script(name: str) -> str:
    """A console script of this Python's environment, else the first on PATH (wheels installed with --target)."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        raise SystemExit(f"{name} is not installed")
    return found


def benchmark_bam(workdir: Path, n_reads: int) -> Path:
    """The generated BAM of ``n_reads`` reads (2,000 cells, 10,000 genes), cached in ``workdir``."""
    bam = workdir / f"reads_{n_reads}.bam"
    if not bam.exists():
        write_bam(generate_reads(n_reads, n_cells=2000, n_genes=10_000, seed=0), bam)
    return bam


def bgzf_blocks(data: bytes) -> list[tuple[bytes, int]]:
    """Each BGZF block's raw deflate stream (between header and CRC) and its inflated size."""
    blocks, position = [], 0
    while position < len(data):
        block_size = struct.unpack_from("<H", data, position + 16)[0] + 1
        inflated = struct.unpack_from("<I", data, position + block_size - 4)[0]
        blocks.append((data[position + 18 : position + block_size - 8], inflated))
        position += block_size
    return blocks


def inflate_seconds(bam: Path) -> float:
    """Seconds to decompress every BGZF block of ``bam`` with zlib on one core.

    A floor under any BAM reader's time, whatever it does next.
    """
    data = bam.read_bytes()
    start = time.perf_counter()
    for raw, size in bgzf_blocks(data):
        zlib.decompress(raw, -15, size)
    return time.perf_counter() - start


def decode_seconds(bam: Path, reader: str) -> float:
    """Seconds to decode flag, MAPQ and the CB/UB/GX tags of every read, with oxbow or pysam.

    oxbow: Rust, Arrow batches, what omicsprep uses; pysam: htslib with 2 threads, a Python loop.
    """
    start = time.perf_counter()
    if reader == "oxbow":
        import oxbow
        import pyarrow as pa

        for batch in oxbow.from_bam(
            str(bam), fields=["flag", "mapq"], tag_defs=[("GX", "Z"), ("CB", "Z"), ("UB", "Z")]
        ).batches():
            pa.record_batch(batch)
    else:
        import pysam

        with pysam.AlignmentFile(str(bam), threads=2) as reads:
            for read in reads:
                read.flag, read.mapping_quality, read.get_tag("CB"), read.get_tag("UB"), read.get_tag("GX")
    return time.perf_counter() - start


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reads", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--repeats", type=int, default=3, help="runs of omicsprep per size")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-umi"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--skip-umi-tools-above", type=int, default=None, help="time umi_tools only up to this size")
    parser.add_argument("--backends", nargs="+", choices=["cpu", "gpu"], default=["cpu"])
    parser.add_argument("--skip-readers", action="store_true", help="do not time inflating alone, oxbow and pysam")


def run(args: argparse.Namespace) -> None:
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n_reads in args.reads:
        bam = benchmark_bam(args.workdir, n_reads)
        command = [console_script("omicsprep"), "count-umis", str(bam), "-o", str(args.workdir / "ours.h5ad")]
        size_rows = []
        for backend in args.backends:
            runs = [timed([*command, "--method", "directional", "--backend", backend]) for _ in range(args.repeats)]
            ours = float(np.median(runs))
            size_rows.append(
                {
                    "reads": n_reads,
                    "backend": backend,
                    "omicsprep_s": round(ours, 2),
                    "omicsprep_best_s": round(min(runs), 2),
                    "omicsprep_reads_per_s": round(n_reads / ours),
                }
            )
        if not args.skip_readers:
            size_rows[0] |= {
                "inflate_only_reads_per_s_per_core": round(n_reads / inflate_seconds(bam)),
                **{
                    f"{reader}_decode_reads_per_s": round(n_reads / decode_seconds(bam, reader))
                    for reader in ("oxbow", "pysam")
                },
            }
        if args.skip_umi_tools_above is None or n_reads <= args.skip_umi_tools_above:
            umi_tools = console_script("umi_tools")
            theirs = timed(
                umi_tools_count_command(umi_tools, bam, args.workdir / "umi_tools.tsv", method="directional")
            )
            for row in size_rows:
                row |= {
                    "umi_tools_s": round(theirs, 2),
                    "umi_tools_reads_per_s": round(n_reads / theirs),
                    "speedup": round(theirs / row["omicsprep_s"], 1),
                }
        for row in size_rows:
            rows.append(row)
            print(row, flush=True)
    append_results(
        args.results,
        title="UMI counting",
        table=pd.DataFrame(rows),
        note=f"Python {platform.python_version()}; directional method, one process each, start-up included.",
    )
