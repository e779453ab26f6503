"""Checks of STARsolo's inputs that STAR itself skips or reports obscurely.

STAR 2.7.10b, tried on the synthetic fixture (tests/test_star.py): does not compare the read
names of the two files; stops silently (exit 0) at the end of the cDNA file when the barcode
file has more reads; exits 0 with every read refused ("noNinUMI") when read 1 is shorter than
barcode+UMI under ``--soloBarcodeReadLength 0``. When the barcode file ends first, or a
truncated gzip ends inside a record, it stops with "quality string length is not equal to
sequence length" (:func:`star_failure` says what that means); a gzip cut that happened to
fall between records would pass as a shorter file (``gzip -cd`` complains only on stderr).
"""

from __future__ import annotations

import gzip
import itertools
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import IO

import pandas as pd

from omicsprep.align.chemistry import Chemistry
from omicsprep.errors import InputError, existing_file

BLOCK_BYTES = 1 << 22
GZIP_MAGIC = b"\x1f\x8b"
MIN_WHITELIST_MATCH = 0.10


def _zlib() -> ModuleType:
    """The fastest zlib-compatible decompressor installed: ISA-L, zlib-ng, or zlib."""
    for name in ("isal.isal_zlib", "zlib_ng.zlib_ng"):
        try:
            return __import__(name, fromlist=["decompressobj"])
        except ImportError:
            continue
    return zlib


def is_gzip(path: Path) -> bool:
    """Whether ``path`` starts with gzip's magic bytes (a name's suffix may lie)."""
    with path.open("rb") as handle:
        return handle.read(2) == GZIP_MAGIC


def _decompressed_blocks(path: Path) -> Iterator[bytes]:
    """The file's bytes, gunzipped (every member) when it is gzipped.

    Raises
    ------
    InputError
        A gzip that ends before its last member does, or whose data or checksum is corrupt.
    """
    library = _zlib()
    with path.open("rb") as handle:
        if not is_gzip(path):
            yield from iter(lambda: handle.read(BLOCK_BYTES), b"")
            return
        decompressor = library.decompressobj(31)
        try:
            for block in iter(lambda: handle.read(BLOCK_BYTES), b""):
                while block:
                    yield decompressor.decompress(block)
                    block = decompressor.unused_data
                    if decompressor.eof and block:  # a further member (bgzip, concatenated files)
                        decompressor = library.decompressobj(31)
            yield decompressor.flush()
        except library.error as exc:
            raise InputError(f"corrupt gzip ({exc})", path=path) from exc
        if not decompressor.eof:
            raise InputError("truncated gzip: the file ends inside compressed data (an incomplete copy?)", path=path)


def gzip_intact(path: str | Path) -> None:
    """Decompress the whole file, checking each member's CRC and length; plain files pass.

    Meant to run in a thread beside STAR (zlib releases the GIL while it decompresses): a
    gzip cut between records would pass STAR as a shorter file, without an error.

    Raises
    ------
    InputError
        "truncated gzip" or "corrupt gzip".
    """
    for _ in _decompressed_blocks(existing_file(path)):
        pass


def fastq_read_count(path: str | Path) -> int:
    """Reads in a FASTQ (gzipped or not): its lines over four, in one decompression pass.

    Raises
    ------
    InputError
        A truncated or corrupt gzip, or a line count that is not a multiple of four.
    """
    path = existing_file(path)
    lines, last = 0, b"\n"
    for block in _decompressed_blocks(path):
        lines += block.count(b"\n")
        last = block[-1:] or last
    lines += last != b"\n"  # a last line without its newline
    if lines % 4:
        raise InputError(f"FASTQ has {lines} lines, not a multiple of 4: the last record is cut short", path=path)
    return lines // 4


def check_read_counts(fastq_1: list[Path], fastq_2: list[Path], *, threads: int = 2) -> list[int]:
    """Each lane's reads, checking that read 1 and read 2 hold as many (a full pass over all files).

    STAR stops silently at the end of a shorter cDNA file; this is the check that catches it.

    Returns
    -------
    The reads of each lane.

    Raises
    ------
    InputError
        Different read counts in a lane's two files, or a truncated gzip.
    """
    with ThreadPoolExecutor(max_workers=threads) as pool:
        counts_1 = list(pool.map(fastq_read_count, fastq_1))
        counts_2 = list(pool.map(fastq_read_count, fastq_2))
    for path_1, path_2, n_1, n_2 in zip(fastq_1, fastq_2, counts_1, counts_2, strict=True):
        if n_1 != n_2:
            raise InputError(f"holds {n_1} reads but its read-2 file {str(path_2)!r} holds {n_2}", path=path_1)
    return counts_1


def _open_text(path: Path) -> IO[str]:
    return gzip.open(path, "rt") if is_gzip(path) else path.open()


def _records(path: Path, handle: IO[str]) -> Iterator[tuple[str, str]]:
    """(name, sequence) of each FASTQ record; the name without ``@``, comment and ``/1``/``/2``."""
    for number in itertools.count():
        try:
            lines = [handle.readline() for _ in range(4)]
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"truncated or corrupt gzip: {exc} (after {number} reads)", path=path) from exc
        if not lines[0]:
            return
        if not lines[3] or not lines[0].startswith("@") or not lines[2].startswith("+"):
            raise InputError(f"FASTQ record {number + 1} is malformed or cut short: {lines[0].strip()!r}", path=path)
        name = lines[0][1:].split(maxsplit=1)[0] if lines[0][1:].strip() else ""
        yield re.sub(r"/[12]$", "", name), lines[1].rstrip("\r\n")


def check_fastq_pairs(fastq_1: list[Path], fastq_2: list[Path], *, chemistry: Chemistry, n_reads: int = 10000) -> None:
    """Check the first ``n_reads`` of each lane: same read names, read 1 long enough, gzip readable.

    Parameters
    ----------
    fastq_1, fastq_2
        Barcode+UMI reads and cDNA reads, one file per lane, in the same lane order.
    chemistry
        The read layout: read 1 must hold ``chemistry.barcode_read_length`` bases.
    n_reads
        Records compared per lane.

    Raises
    ------
    InputError
        Different numbers of lanes; read names that differ (the first pair shown); one file
        ending before the other within ``n_reads``; a read 1 shorter than barcode+UMI; a
        malformed record; a gzip that cannot be read.
    """
    if len(fastq_1) != len(fastq_2):
        raise InputError(
            f"{len(fastq_1)} read-1 file(s) but {len(fastq_2)} read-2 file(s): lanes must pair up", path=fastq_1[0]
        )
    for path_1, path_2 in zip(map(existing_file, fastq_1), map(existing_file, fastq_2), strict=True):
        _check_lane(path_1, path_2, chemistry=chemistry, n_reads=n_reads)


def _check_lane(path_1: Path, path_2: Path, *, chemistry: Chemistry, n_reads: int) -> None:
    with _open_text(path_1) as handle_1, _open_text(path_2) as handle_2:
        records = itertools.zip_longest(_records(path_1, handle_1), _records(path_2, handle_2))
        for number, (record_1, record_2) in enumerate(itertools.islice(records, n_reads), start=1):
            if record_1 is None or record_2 is None:
                shorter, other = (path_1, path_2) if record_1 is None else (path_2, path_1)
                raise InputError(
                    f"ends after {number - 1} reads, before its mate file {str(other)!r}: the two files of a "
                    "lane hold different numbers of reads",
                    path=shorter,
                )
            if record_1[0] != record_2[0]:
                raise InputError(
                    f"read {number} is named {record_1[0]!r} but read {number} of {str(path_2)!r} is "
                    f"{record_2[0]!r}: read 1 and read 2 files are not mates (wrong lane or sample?)",
                    path=path_1,
                )
            if len(record_1[1]) < chemistry.barcode_read_length:
                raise InputError(
                    f"read {number} ({record_1[0]!r}) has {len(record_1[1])} bases, fewer than the "
                    f"{chemistry.barcode_read_length} of chemistry {chemistry.name!r}'s barcode and UMI "
                    "(read 1 and read 2 swapped, or the wrong chemistry?)",
                    path=path_1,
                )


def _fasta_lengths(path: Path) -> dict[str, int]:
    """Sequence name (up to the first space) -> bases, from blocks of whole lines.

    Headers are found with ``bytes.find`` and bases counted as bytes less line ends, so a
    3 Gb genome takes about as long as reading it.
    """
    lengths: dict[str, int] = {}
    name, carry = None, b""
    for block in itertools.chain(_decompressed_blocks(path), [b"\n"]):
        data = carry + block
        cut = data.rfind(b"\n") + 1
        data, carry = data[:cut], data[cut:]
        start = 0
        for header in _header_starts(data):
            bases = _bases(data[start:header])
            if name is None and bases:
                raise InputError("is not a FASTA file (sequence before the first '>' header)", path=path)
            if name is not None:
                lengths[name] += bases
            start = data.index(b"\n", header) + 1
            name = data[header + 1 : start].split(maxsplit=1)[0].decode() if data[header + 1 : start].strip() else ""
            lengths[name] = 0
        if name is None and _bases(data):
            raise InputError("is not a FASTA file (no '>' header)", path=path)
        if name is not None:
            lengths[name] += _bases(data[start:])
    if not lengths:
        raise InputError("FASTA holds no sequence", path=path)
    return lengths


def _header_starts(data: bytes) -> Iterator[int]:
    """Offsets of the lines of ``data`` (whole lines) that start with ``>``."""
    if data.startswith(b">"):
        yield 0
    found = data.find(b"\n>")
    while found != -1:
        yield found + 1
        found = data.find(b"\n>", found + 1)


def _bases(sequence: bytes) -> int:
    return len(sequence) - sequence.count(b"\n") - sequence.count(b"\r")


def _gtf_chromosomes(path: Path) -> tuple[set[str], int]:
    """The GTF's chromosomes and its number of exon lines."""
    chromosomes: set[str] = set()
    n_exons = 0
    try:
        chunks = pd.read_csv(
            path, sep="\t", header=None, usecols=[0, 2], comment="#", dtype=str, quoting=3, chunksize=1_000_000
        )
        for chunk in chunks:
            chromosomes.update(chunk[0].unique())
            n_exons += int((chunk[2] == "exon").sum())
    except (ValueError, pd.errors.ParserError, OSError, EOFError) as exc:
        raise InputError(f"cannot be read as a GTF ({exc})", path=path) from exc
    return chromosomes, n_exons


def check_reference(fasta: str | Path, gtf: str | Path) -> int:
    """Check that the GTF's chromosomes are in the FASTA; return the genome's length.

    Both may be gzipped. The FASTA is read in blocks (about as fast as it decompresses).

    Returns
    -------
    Total bases of the FASTA, for STAR's ``--genomeSAindexNbases``.

    Raises
    ------
    InputError
        A GTF chromosome absent from the FASTA (a few named, and how many), a GTF without
        exon lines, a file that is not FASTA/GTF, a truncated gzip.
    """
    fasta, gtf = existing_file(fasta), existing_file(gtf)
    lengths = _fasta_lengths(fasta)
    chromosomes, n_exons = _gtf_chromosomes(gtf)
    if n_exons == 0:
        raise InputError("GTF has no 'exon' lines: STAR counts genes by their exons", path=gtf)
    missing = sorted(chromosomes - set(lengths))
    if missing:
        shown = ", ".join(map(repr, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise InputError(
            f"{len(missing)} of the GTF's {len(chromosomes)} chromosomes are not in the FASTA {str(fasta)!r} "
            f"({shown}; the FASTA has e.g. {', '.join(map(repr, list(lengths)[:3]))}): annotation of another "
            "genome build, or 'chr' prefixes in one file only?",
            path=gtf,
        )
    return sum(lengths.values())


def _sampled_barcodes(fastq_1: list[Path], *, chemistry: Chemistry, n_reads: int) -> Counter:
    """Cell barcodes of the first ``n_reads`` reads, over the lanes in order."""
    barcodes: Counter = Counter()
    remaining = n_reads
    for path in fastq_1:
        with _open_text(existing_file(path)) as handle:
            for _, sequence in itertools.islice(_records(path, handle), remaining):
                barcodes[chemistry.cell_barcode(sequence)] += 1
                remaining -= 1
        if remaining <= 0:
            break
    return barcodes


def whitelist_match_rate(
    fastq_1: list[Path], whitelist: str | Path, *, chemistry: Chemistry, n_reads: int = 100000
) -> float:
    """Fraction of the first ``n_reads`` reads whose cell barcode is in the whitelist exactly.

    The whitelist (gzipped or not; 10x's v3 list has 6.8 million barcodes) is streamed
    against the sampled barcodes, so it is never held in memory. For a single-segment
    (``CB_UMI_Simple``) layout: a complex one has a whitelist per segment.
    """
    if chemistry.solo_type != "CB_UMI_Simple":
        raise ValueError(f"whitelist_match_rate needs a single barcode segment; {chemistry.name!r} has several")
    barcodes = _sampled_barcodes(fastq_1, chemistry=chemistry, n_reads=n_reads)
    total = sum(barcodes.values())
    if total == 0:
        raise InputError("holds no reads", path=fastq_1[0])
    matched = 0
    with _open_text(existing_file(whitelist)) as handle:
        for line in handle:
            matched += barcodes.pop(line.strip(), 0)
    return matched / total


def check_whitelist(
    fastq_1: list[Path],
    whitelist: str | Path,
    *,
    chemistry: Chemistry,
    n_reads: int = 100000,
    min_rate: float = MIN_WHITELIST_MATCH,
) -> float:
    """:func:`whitelist_match_rate`, refusing a rate below ``min_rate``.

    A 10x library against its own whitelist matches 90% and more; a few percent means another
    chemistry's whitelist or barcode layout.

    Raises
    ------
    InputError
        The rate is below ``min_rate``.
    """
    rate = whitelist_match_rate(fastq_1, whitelist, chemistry=chemistry, n_reads=n_reads)
    if rate < min_rate:
        raise InputError(
            f"the whitelist {str(whitelist)!r} matches {rate:.1%} of barcodes (chemistry {chemistry.name!r}, "
            f"first {n_reads} reads): wrong chemistry or whitelist?",
            path=fastq_1[0],
        )
    return rate


_EXITING = re.compile(r"^EXITING:? because of (.*)$", re.MULTILINE)
_READS_INPUT = "FATAL ERROR in reads input: quality string length is not equal to sequence length"


def star_failure(log_text: str) -> str | None:
    """STAR's fatal error in ``Log.out`` (or its stdout) as one sentence; ``None`` when there is none.

    STAR writes "EXITING because of <problem>", lines of detail, "SOLUTION: <advice>", a blank
    line. STAR 2.7.10b reports a barcode file (read 1) that ends before the cDNA file (read 2)
    as "quality string length is not equal to sequence length", followed by the cDNA read's
    name and an empty barcode record; a record cut short inside a file gives the same message
    with a partial sequence.
    """
    exiting = _EXITING.search(log_text)
    if exiting is None:
        return None
    problem = exiting.group(1).strip()
    block = log_text[exiting.end() :].lstrip("\n").split("\n\n", 1)[0].splitlines()
    solution = next((line.removeprefix("SOLUTION:").strip() for line in block if line.startswith("SOLUTION:")), "")
    detail = [line.strip() for line in itertools.takewhile(lambda line: not line.startswith("SOLUTION:"), block)]
    if problem == _READS_INPUT and detail:
        read = detail[0].lstrip("@").split(maxsplit=1)[0] if detail[0] else "?"
        if len(detail) > 1 and detail[1].startswith("+"):
            return (
                f"STAR stopped at read {read!r}: the read-1 (barcode) files hold fewer reads than the read-2 "
                "(cDNA) files, or a read-1 file is truncated"
            )
        return f"STAR stopped at read {read!r}: a FASTQ record is cut short (a truncated or malformed file?)"
    sentence = f"STAR failed: {problem}" + (f" ({'; '.join(filter(None, detail))})" if any(detail) else "")
    return sentence + (f"; STAR suggests: {solution}" if solution else "")
