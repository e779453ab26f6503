"""How fast can a BAM be read on one core? Inflate and record-scan rates, apart.

    python benchmarks/bam_ceiling.py --reads 1000000 [--workdir /tmp/omicsprep-umi]

For the generated BAM of ``--reads`` reads (umi_bench.py's, cached in ``--workdir``) it
times, on one core: inflating every BGZF block with zlib, zlib-ng, ISA-L and libdeflate
(those installed: ``pip install zlib-ng isal deflate``), the output kept in memory, and
with libdeflate also dropped block by block (``inflate_libdeflate_dropped``: as a reader
that reuses one buffer); and a Numba scan of the inflated
records that finds each read's flag, MAPQ and the offsets of its CB, UB and GX tags, then
hashes the cell and gene names and 2-bit packs the UMI (what deduplication needs, as
integers). The scan is compiled on a first pass, then timed. Rates are reads/s per core,
each the best of ``--repeats`` runs; the table, with machine and date, is appended to
``--results``.
"""

from __future__ import annotations

import argparse
import importlib
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import append_results  # noqa: E402
from umi_bench import benchmark_bam, bgzf_blocks  # noqa: E402

INFLATERS = {
    "zlib": ("zlib", lambda module: lambda raw, size: module.decompress(raw, -15, size)),
    "zlib-ng": ("zlib_ng.zlib_ng", lambda module: lambda raw, size: module.decompress(raw, -15, size)),
    "isal": ("isal.isal_zlib", lambda module: lambda raw, size: module.decompress(raw, -15, size)),
    "libdeflate": ("deflate", lambda module: lambda raw, size: module.deflate_decompress(raw, size)),
}


def inflate_rate(
    blocks: list[tuple[bytes, int]], name: str, n_reads: int, *, keep: bool
) -> tuple[float | None, list[bytes]]:
    """Reads/s inflating every block with library ``name`` (``None`` where it is not installed), and the blocks.

    ``keep``: the output of every block is kept in memory; else each is dropped at once (it
    stays in cache, as in a reader that inflates into one reused buffer).
    """
    module_name, make = INFLATERS[name]
    try:
        inflate = make(importlib.import_module(module_name))
    except ImportError:
        return None, []
    start = time.perf_counter()
    if keep:
        parts = [inflate(raw, size) for raw, size in blocks]
    else:
        for raw, size in blocks:
            inflate(raw, size)
        parts = []
    return n_reads / (time.perf_counter() - start), parts


@njit(cache=True)
def _int32(buf, at):
    return np.int32(buf[at] | (buf[at + 1] << 8) | (buf[at + 2] << 16) | (np.int64(buf[at + 3]) << 24))


@njit(cache=True)
def _fnv1a(buf, start, length):
    value = np.uint64(14695981039346656037)
    for i in range(start, start + length):
        value = (value ^ np.uint64(buf[i])) * np.uint64(1099511628211)
    return value


@njit(cache=True)
def scan_records(buf, start, tags):
    """Flag, MAPQ, cell and gene hashes and the packed UMI of every record from ``start``.

    -1 / 0 where a tag is missing or a UMI base is not ACGT.
    """
    n_max = (len(buf) - start) // 36
    flags = np.empty(n_max, np.int32)
    mapqs = np.empty(n_max, np.int32)
    cells = np.zeros(n_max, np.uint64)
    genes = np.zeros(n_max, np.uint64)
    umis = np.full(n_max, -1, np.int64)
    codes = np.full(256, -1, np.int64)
    codes[65], codes[67], codes[71], codes[84] = 0, 1, 2, 3
    n, position = 0, start
    while position + 4 <= len(buf):
        end = position + 4 + _int32(buf, position)
        record = position + 4
        flags[n] = buf[record + 14] | (buf[record + 15] << 8)
        mapqs[n] = buf[record + 9]
        n_cigar = buf[record + 12] | (buf[record + 13] << 8)
        length = _int32(buf, record + 16)
        at = record + 32 + buf[record + 8] + 4 * n_cigar + (length + 1) // 2 + length
        while at + 3 <= end:
            kind = buf[at + 2]
            which = -1
            for t in range(3):
                if buf[at] == tags[t, 0] and buf[at + 1] == tags[t, 1]:
                    which = t
            at += 3
            if kind == 90 or kind == 72:  # Z, H: NUL-terminated
                stop = at
                while buf[stop] != 0:
                    stop += 1
                if which == 0:
                    cells[n] = _fnv1a(buf, at, stop - at)
                elif which == 2:
                    genes[n] = _fnv1a(buf, at, stop - at)
                elif which == 1:
                    packed = np.int64(0)
                    for i in range(at, stop):
                        code = codes[buf[i]]
                        if code < 0:
                            packed = -1
                            break
                        packed = (packed << 2) | code
                    umis[n] = packed
                at = stop + 1
            elif kind == 66:  # B: typed array
                sub = buf[at]
                size = 1 if sub in (99, 67) else 2 if sub in (115, 83) else 4
                at += 5 + size * _int32(buf, at + 1)
            else:
                at += 1 if kind in (65, 99, 67) else 2 if kind in (115, 83) else 4
        n += 1
        position = end
    return flags[:n], mapqs[:n], cells[:n], genes[:n], umis[:n]


def records_start(inflated: bytes) -> int:
    """Offset of the first record, past the BAM header."""
    text = struct.unpack_from("<i", inflated, 4)[0]
    position = 8 + text
    for _ in range(struct.unpack_from("<i", inflated, position)[0]):
        position += 4 + struct.unpack_from("<i", inflated, position + 4)[0] + 4
    return position + 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep-umi"))
    parser.add_argument("--repeats", type=int, default=3, help="each rate is the best of this many runs")
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n_reads in args.reads:
        bam = benchmark_bam(args.workdir, n_reads)
        blocks = bgzf_blocks(bam.read_bytes())
        row, inflated = {"reads": n_reads, "bam_mb": round(bam.stat().st_size / 1e6, 1)}, b""
        for name, keep in [*((name, True) for name in INFLATERS), ("libdeflate", False)]:
            runs = [inflate_rate(blocks, name, n_reads, keep=keep) for _ in range(args.repeats)]  # a shared machine
            rates = [rate for rate, _ in runs]
            row[f"inflate_{name}" + ("" if keep else "_dropped")] = None if rates[0] is None else round(max(rates))
            if not inflated and runs[0][1]:  # the same bytes from every library: joined once
                inflated = b"".join(runs[0][1])
        row["inflated_bytes_per_read"] = round(len(inflated) / n_reads)
        buf, tags = np.frombuffer(inflated, np.uint8), np.array([[ord(c) for c in t] for t in ("CB", "UB", "GX")])
        scan_records(buf, records_start(inflated), tags)  # compiles (or loads the cache)
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            flags, _, cells, genes, umis = scan_records(buf, records_start(inflated), tags)
            seconds.append(time.perf_counter() - start)
        row["numba_scan"] = round(n_reads / min(seconds))
        row["records_found"] = len(flags)
        row["distinct_cells"], row["distinct_genes"] = len(np.unique(cells)), len(np.unique(genes))
        row["umis_with_n"] = int((umis < 0).sum())
        rows.append(row)
        print(row, flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    append_results(
        args.results,
        title="Reading a BAM on one core: inflate and scan rates",
        table=table,
        note=f"reads/s on one core, best of {args.repeats} runs; inflate: every BGZF block of the "
        "generated BAM with each library; numba_scan: flag, MAPQ, cell and gene hashes and "
        "packed UMI of every inflated record (compiled).",
    )


if __name__ == "__main__":
    main()
