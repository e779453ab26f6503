"""Peak memory of ``omicsprep count-umis`` against input size and ``--chunk-rows``.

    python -m benchmarks umi_memory --reads 3000000 12000000 --chunk-rows 500000 5000000 \
        [--memory-limit-mb 1000] [--bam]

Generates a molecule table (Parquet, one row per read; reads.py's reads, written 6M
reads at a time) per size, cached in the work folder, counts it in a fresh process per
(size, chunk) and records the process's peak resident memory; the table is appended to
RESULTS.md. With ``--bam`` the input is a BAM instead: umi.py's BAM of
``--bam-base-reads`` reads, its records repeated to each size (a multiple of it) by
copying BGZF blocks, so a 100M-read BAM takes seconds rather than the 20 minutes pysam
needs to write one. Memory bounded by the chunk size shows as peak memory that stays flat while
the input grows. With ``--memory-limit-mb`` the count runs in a cgroup (v1) with that hard
limit on memory and swap, so an input larger than the limit shows that it really fits.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from benchmarks.common import RESULTS, append_results
from benchmarks.umi import benchmark_bam, bgzf_blocks
from omicsprep.testing.reads import generate_reads


def peak_rss_mb(command: list[str]) -> tuple[float, float]:
    """Seconds and peak resident memory (MB) of a command run in a fresh child process."""
    # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: fork a helper per command.
    probe = (
        "import resource, subprocess, sys, time; s = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, capture_output=True); "
        "print(time.perf_counter() - s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *command], check=True, capture_output=True, text=True)
    seconds, kilobytes = out.stdout.split()
    return float(seconds), int(kilobytes) / 1024


def write_table(path: Path, n_reads: int, piece: int = 6_000_000) -> None:
    """Generated reads as Parquet, ``piece`` reads (their own cells) at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, pa.schema([("cell", pa.string()), ("umi", pa.string()), ("gene", pa.string())])) as out:
        for seed, start in enumerate(range(0, n_reads, piece)):
            reads = generate_reads(
                min(piece, n_reads - start), n_cells=5_000, n_genes=10_000, secondary_rate=0, seed=seed
            )
            out.write_table(pa.Table.from_pandas(reads[["cell", "umi", "gene"]], preserve_index=False))


def repeated_bam(workdir: Path, base_reads: int, copies: int) -> Path:
    """umi.py's BAM of ``base_reads`` reads with its records ``copies`` times over.

    The header's BGZF block is kept once (htslib writes the header in blocks of its own),
    the blocks of records are copied ``copies`` times, then the end-of-file block.
    """
    base = benchmark_bam(workdir, base_reads)
    if copies == 1:
        return base
    path = workdir / f"reads_{base_reads}_x{copies}.bam"
    if path.exists():
        return path
    data = base.read_bytes()
    header_end = 18 + len(bgzf_blocks(data)[0][0]) + 8  # the first block: the header alone
    eof = data[-28:]
    with path.open("wb") as out:
        out.write(data[:header_end])
        for _ in range(copies):
            out.write(data[header_end:-28])
        out.write(eof)
    return path


def in_memory_mb(path: Path) -> int:
    """What holding the whole table in memory as Arrow would take (counted batch by batch)."""
    import pyarrow.parquet as pq

    return round(sum(batch.nbytes for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 20)) / 2**20)


def limited(command: list[str], limit_mb: int | None) -> list[str]:
    """``command`` run inside a fresh cgroup with a hard memory (and swap) limit."""
    if limit_mb is None:
        return command
    group = Path(f"/sys/fs/cgroup/memory/omicsprep-umi-{limit_mb}")
    group.mkdir(exist_ok=True)
    for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
        (group / name).write_text(str(limit_mb << 20))
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *command]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reads", type=int, nargs="+", default=[3_000_000, 12_000_000])
    parser.add_argument("--chunk-rows", type=int, nargs="+", default=[500_000, 5_000_000])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-umi"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--memory-limit-mb", type=int, default=None, help="hard memory limit (cgroup v1)")
    parser.add_argument("--bam", action="store_true", help="BAM input (umi.py's, repeated) instead of tables")
    parser.add_argument("--bam-base-reads", type=int, default=10_000_000)


def run(args: argparse.Namespace) -> None:
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n_reads in args.reads:
        if args.bam:
            if n_reads % args.bam_base_reads:
                raise SystemExit(f"--reads must be multiples of --bam-base-reads ({args.bam_base_reads}) with --bam")
            table = repeated_bam(args.workdir, args.bam_base_reads, n_reads // args.bam_base_reads)
        else:
            table = args.workdir / f"molecules_{n_reads}.parquet"
            if not table.exists():
                write_table(table, n_reads)
        for chunk_rows in args.chunk_rows:
            command = [
                str(Path(sys.executable).parent / "omicsprep"),
                "count-umis",
                str(table),
                "-o",
                str(args.workdir / "memory.h5ad"),
                "--chunk-rows",
                str(chunk_rows),
            ]
            seconds, peak = peak_rss_mb(limited(command, args.memory_limit_mb))
            row = {
                "reads": n_reads,
                "input": "bam" if args.bam else "molecules",
                "input_mb": round(table.stat().st_size / 2**20),
                **({} if args.bam else {"in_memory_mb": in_memory_mb(table)}),
                "chunk_rows": chunk_rows,
                "memory_limit_mb": args.memory_limit_mb or "none",
                "seconds": round(seconds, 1),
                "peak_rss_mb": round(peak),
            }
            rows.append(row)
            print(row, flush=True)
    append_results(
        args.results,
        title="UMI counting memory",
        table=pd.DataFrame(rows),
        note=(
            f"umi.py's BAM of {args.bam_base_reads:,} reads (2,000 cells), its records repeated to each size"
            if args.bam
            else "Molecule tables (Parquet, a row per read, 5,000 new cells per 6M reads); `in_memory_mb`: the "
            "whole table as Arrow"
        )
        + "; peak RSS of the whole process, Python and libraries included.",
    )
