"""Reads with cell, UMI and gene, streamed from BAM/SAM files or molecule tables.

BAM files are read by :mod:`omicsprep.reads.bam` into integer codes
(:func:`usable_bam_codes`). SAM records are decoded by oxbow (Rust, Arrow-native) in
batches; tables are read in chunks, by pyarrow on the CPU backend and parsed by cuDF on the
GPU backend. Both are filtered by the same Arrow compute functions, so no Python code runs
per read and both backends skip the same reads. Those usable reads come out as Arrow tables
(``cell``, ``umi``, ``gene``, and ``reads`` when a table row stands for several reads), to be
partitioned by cell.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from omicsprep.backend import Backend, cudf
from omicsprep.errors import InputError, existing_file, naming_file
from omicsprep.io.text import STREAM_CODECS, cudf_parse_errors, cudf_text_chunks, unparsable
from omicsprep.jit_cache import track_sources
from omicsprep.options import BamOptions, TableOptions
from omicsprep.reads.bam import BamRecords
from omicsprep.reads.bgzf import bgzf_eof_present
from omicsprep.reads.umi import check_umi_lengths, pack_umis

track_sources()  # before the functions below are compiled and cached (cache=True)

# Where the cell barcode and UMI sit in read names: umis-style `...:CELL_<cb>:UMI_<umi>:...`
# and umi_tools extract's `<read>_<cb>_<umi>`.
READ_NAME_PATTERNS = {
    "umis": ("CELL_(?P<cell>[^:]+)", "UMI_(?P<umi>[^:]+)"),
    "read_id": ("_(?P<cell>[^_]+)_[^_]+$", "_(?P<umi>[^_]+)$"),
}
UNUSABLE_FLAGS = 0x4 | 0x100 | 0x800  # unmapped, secondary, supplementary
MISSING = "-"  # STARsolo's value of a missing CB, UB, GX or GN
# Why reads are skipped, in the order they are checked (each read counted under its first).
UNUSABLE_ALIGNMENT, LOW_MAPQ, MISSING_VALUE, SKIPPED_GENE, SEVERAL_GENES, UMI_WITH_N = (
    "unmapped, secondary or supplementary",
    "below min_mapq",
    "missing cell, UMI or gene",
    "gene matches skip_gene_regex",
    "several genes",
    "UMI with N",
)
BAM_BYTES_PER_READ = 10  # below any real BAM's, so partitions err on the small side


@dataclass
class ReadTable:
    """Reads as codes.

    ``reads`` has ``cell``, ``gene`` (int codes), ``umi`` (packed) and, for aggregated
    tables, ``reads``.
    """

    reads: pd.DataFrame
    cells: pd.Index
    genes: pd.Index


SAMPLE_BYTES = 16 << 20  # of text, to estimate a compressed table's rows


def estimated_reads(path: str | Path, *, fmt: str) -> int:
    """Reads (rows) in the input: exact for Parquet, estimated for BAM and text.

    A text table's rows are estimated from the lines in its first 16 MB (all its lines for a
    smaller file): a pass over a compressed file just to count its lines would cost as much
    as reading it.
    """
    import pyarrow.parquet as pq

    path = existing_file(path)
    if fmt != "molecules":
        return max(1, path.stat().st_size // BAM_BYTES_PER_READ)
    try:
        if ".parquet" in [s.lower() for s in path.suffixes]:
            return pq.read_metadata(path).num_rows
        with pa.OSFile(str(path)) as raw:
            codec = STREAM_CODECS.get(path.suffix)  # case-sensitive, as pyarrow's readers detect it
            text = pa.CompressedInputStream(raw, codec) if codec else raw
            sample = text.read(SAMPLE_BYTES)
            sample_bytes_in_file = raw.tell()
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot be read as {fmt} ({type(exc).__name__}: {exc})", path=path) from exc
    lines = sample.count(b"\n") + (not sample.endswith(b"\n"))
    if len(sample) < SAMPLE_BYTES:  # the whole file, less its header line
        return max(1, lines - 1)
    return max(1, path.stat().st_size * lines // sample_bytes_in_file)


def usable_reads(
    path: str | Path,
    *,
    fmt: str,
    bam: BamOptions,
    table: TableOptions,
    skip_gene_regex: str,
    chunk_rows: int,
    skipped: Counter,
    backend: Backend = "cpu",
) -> Iterator[pa.Table]:
    """Stream the usable reads of a BAM/SAM file or a molecule table, batch by batch.

    A molecule table is read by cuDF on the GPU backend, by pyarrow on the CPU; BAM/SAM by
    oxbow on either.

    Unmapped, secondary and supplementary alignments, reads under ``min_mapq``, reads
    missing a cell, UMI or gene, genes matching ``skip_gene_regex`` and reads assigned to
    several genes (``A;B`` or ``A,B``) are skipped and counted in ``skipped``. Sorted input
    is not required.

    Raises
    ------
    InputError
        Missing, truncated or unreadable input.
    """
    path = existing_file(path)
    try:
        if fmt == "molecules":
            yield from _table_reads(
                path,
                table=table,
                skip_gene_regex=skip_gene_regex,
                chunk_rows=chunk_rows,
                skipped=skipped,
                backend=backend,
            )
        else:
            yield from _bam_reads(path, bam=bam, skip_gene_regex=skip_gene_regex, skipped=skipped)
    except InputError:
        raise
    except BaseException as exc:  # oxbow reports corrupt input as a Rust panic
        device_errors = (RuntimeError, MemoryError) if fmt == "molecules" and backend == "gpu" else ()
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, *device_errors)):  # not the input's fault
            raise
        raise InputError(f"cannot be read as {fmt} ({type(exc).__name__}: {exc})", path=path) from exc


def _bam_reads(path: Path, *, bam: BamOptions, skip_gene_regex: str, skipped: Counter) -> Iterator[pa.Table]:
    import oxbow

    if path.suffix.lower() == ".bam" and not bgzf_eof_present(path):
        raise InputError("BAM is truncated (no BGZF end-of-file block)", path=path)
    fields = ["flag", "mapq"] + (["qname"] if bam.umi_source != "tag" else [])
    tags = [(bam.gene_tag, "Z")] + ([(bam.cell_tag, "Z"), (bam.umi_tag, "Z")] if bam.umi_source == "tag" else [])
    if path.suffix.lower() == ".sam":
        batches = oxbow.from_sam(str(path), compression=None, fields=fields, tag_defs=tags).batches()
    else:
        batches = oxbow.from_bam(str(path), fields=fields, tag_defs=tags).batches()
    for arrow_batch in batches:
        batch = pa.record_batch(arrow_batch)
        gene = batch.column("tags").field(bam.gene_tag)
        if bam.umi_source == "tag":
            cell, umi = batch.column("tags").field(bam.cell_tag), batch.column("tags").field(bam.umi_tag)
        else:
            cell_pattern, umi_pattern = READ_NAME_PATTERNS[bam.umi_source]
            names = batch.column("qname")
            cell = pc.extract_regex(names, cell_pattern).field("cell")
            umi = pc.extract_regex(names, umi_pattern).field("umi")
        gene, cell, umi = (pc.if_else(pc.equal(values, MISSING), None, values) for values in (gene, cell, umi))
        usable = _usable(
            gene,
            cell,
            umi,
            skipped=skipped,
            skip_gene_regex=skip_gene_regex,
            unusable_alignment=pc.not_equal(pc.bit_wise_and(batch.column("flag"), UNUSABLE_FLAGS), 0),
            low_mapq=pc.less(batch.column("mapq"), bam.min_mapq),
        )
        yield pa.table({"cell": cell, "umi": umi, "gene": gene}).filter(usable)


TABLE_BYTES_PER_ROW = 64  # a molecule table's text line, about


def _molecule_table(columns: list[str]) -> str:
    """What a molecule table holds, named in errors."""
    return f"a molecule table with columns {columns}"


def _delimiter(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    return "\t" if ".tsv" in suffixes or ".txt" in suffixes else ","


def _table_batches(
    path: Path, *, columns: list[str], chunk_rows: int, text_columns: tuple[str, ...] = ()
) -> Iterator[pa.RecordBatch]:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffixes = [s.lower() for s in path.suffixes]
    try:
        if ".parquet" in suffixes:
            yield from pq.ParquetFile(path).iter_batches(batch_size=chunk_rows, columns=columns)
            return
        yield from pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=max(1 << 20, chunk_rows * TABLE_BYTES_PER_ROW)),
            parse_options=pacsv.ParseOptions(delimiter=_delimiter(path)),
            convert_options=pacsv.ConvertOptions(
                include_columns=columns, strings_can_be_null=True, column_types=dict.fromkeys(text_columns, pa.string())
            ),
        )
    except (pa.ArrowInvalid, KeyError) as exc:
        raise unparsable(exc, path=path, what=_molecule_table(columns)) from exc


def _table_reads(
    path: Path, *, table: TableOptions, skip_gene_regex: str, chunk_rows: int, skipped: Counter, backend: Backend
) -> Iterator[pa.Table]:
    """Usable reads of a molecule table, chunk by chunk.

    Parsed by cuDF on the GPU backend (:func:`_cudf_chunks`), by pyarrow on the CPU, and
    filtered by the same Arrow code.
    """
    columns = [table.cell_column, table.umi_column, table.gene_column]
    wanted = columns + ([table.count_column] if table.count_column else [])
    chunks: Iterator[pa.RecordBatch]
    if backend == "gpu":
        chunks = (
            batch
            for chunk in _cudf_chunks(path, columns=wanted, text_columns=columns, chunk_rows=chunk_rows)
            for batch in chunk[wanted].to_arrow(preserve_index=False).to_batches()
        )  # as pyarrow's
    else:
        chunks = _table_batches(path, columns=wanted, chunk_rows=chunk_rows, text_columns=tuple(columns))
    for batch in chunks:
        cell, umi, gene = (batch.column(c).cast(pa.string()) for c in columns)
        usable = _usable(gene, cell, umi, skipped=skipped, skip_gene_regex=skip_gene_regex)
        reads = {"reads": batch.column(table.count_column).cast(pa.int64())} if table.count_column else {}
        yield pa.table({"cell": cell, "umi": umi, "gene": gene, **reads}).filter(usable)


def _cudf_chunks(path: Path, *, columns: list[str], text_columns: list[str], chunk_rows: int) -> Iterator:
    """DataFrames of about ``chunk_rows`` rows parsed by cuDF on the device.

    Parquet row groups, or blocks of whole lines of the (decompressed) text.

    Raises
    ------
    InputError
        An empty file, a header without the columns, or text cuDF cannot parse.
    """
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    what = _molecule_table(columns)
    if ".parquet" in [s.lower() for s in path.suffixes]:
        row_groups = pq.read_metadata(path)
        group, rows = [], 0
        for index in range(row_groups.num_row_groups):
            group.append(index)
            rows += row_groups.row_group(index).num_rows
            if rows >= chunk_rows or index == row_groups.num_row_groups - 1:
                with cudf_parse_errors(path=path, what=what):
                    frame = cudf().read_parquet(path, columns=columns, row_groups=group)
                yield frame
                group, rows = [], 0
        return
    na_values = list(pacsv.ConvertOptions().null_values)  # as pyarrow reads them on the CPU
    for frame in cudf_text_chunks(
        path,
        names=None,
        block_bytes=max(1 << 20, chunk_rows * TABLE_BYTES_PER_ROW),
        what=what,
        sep=_delimiter(path),
        usecols=columns,
        dtype=dict.fromkeys(text_columns, "str"),
        na_values=na_values,
        keep_default_na=False,
    ):
        for column in text_columns:  # quoted ones too ("NA"), as pyarrow reads them
            frame[column] = frame[column].where(~frame[column].isin(na_values))
        yield frame


def _usable(
    gene: pa.Array,
    cell: pa.Array,
    umi: pa.Array,
    *,
    skipped: Counter,
    skip_gene_regex: str,
    unusable_alignment: pa.Array | None = None,
    low_mapq: pa.Array | None = None,
) -> pa.Array:
    """Mask of usable reads; each unusable one is counted once, under its first reason.

    The gene patterns are matched once per distinct gene (a few thousand, not millions of
    reads) and spread back to the reads.
    """
    genes = pc.dictionary_encode(gene)
    skipped_gene, several_genes = _gene_checks(genes.dictionary, skip_gene_regex)
    checks = {
        UNUSABLE_ALIGNMENT: unusable_alignment,
        LOW_MAPQ: low_mapq,
        MISSING_VALUE: pc.or_(pc.or_(pc.is_null(gene), pc.is_null(cell)), pc.is_null(umi)),
        SKIPPED_GENE: pc.take(skipped_gene, genes.indices),
        SEVERAL_GENES: pc.take(several_genes, genes.indices),
    }
    usable = pa.array(np.ones(len(gene), dtype=bool))
    for reason, failed in checks.items():
        if failed is None:
            continue
        failed = pc.and_(usable, pc.fill_null(failed, fill_value=False))
        skipped[reason] += pc.sum(failed).as_py() or 0
        usable = pc.and_(usable, pc.invert(failed))
    return usable


def _gene_checks(genes: pa.Array, skip_gene_regex: str) -> tuple[pa.Array, pa.Array]:
    """Per gene name: whether it matches ``skip_gene_regex``, and whether it names several genes."""
    return pc.match_substring_regex(genes, skip_gene_regex or "$^"), pc.match_substring_regex(genes, "[;,]")


def usable_bam_codes(
    records: BamRecords, *, min_mapq: int, skip_gene_regex: str, skipped: Counter
) -> Iterator[pd.DataFrame]:
    """The usable reads of a BAM as codes, chunk by chunk; skipped ones counted as :func:`usable_reads` counts them.

    Parameters
    ----------
    records
        The file's reader; ``cell`` and ``gene`` are codes into its ``cells`` and ``genes``.
    min_mapq, skip_gene_regex
        As :class:`BamOptions` and :class:`~omicsprep.options.UmiOptions` say.
    skipped
        Reads skipped, by reason (UMIs with N included, as :func:`encode_reads` counts them).

    Returns
    -------
    DataFrames of ``cell``, ``gene`` (int32) and ``umi`` (packed, uint64).

    Raises
    ------
    InputError
        UMIs of mixed lengths or longer than 32 bases; errors of the reader.
    """
    skip_gene = np.zeros(0, dtype=bool)
    several_genes = np.zeros(0, dtype=bool)
    umi_lengths: set[int] = set()
    for chunk in records:
        if records.genes.size > len(skip_gene):  # new genes: their names checked once
            names = pa.array(records.genes.names(len(skip_gene)), type=pa.string())
            skipped_now, several_now = _gene_checks(names, skip_gene_regex)
            skip_gene = np.append(skip_gene, skipped_now.to_numpy(zero_copy_only=False))
            several_genes = np.append(several_genes, several_now.to_numpy(zero_copy_only=False))
        usable, counts, shortest, longest = _usable_records(
            chunk.flag, chunk.mapq, chunk.cell, chunk.gene, chunk.umi_length, chunk.umi_acgt,
            skip_gene, several_genes, min_mapq, UNUSABLE_FLAGS,
        )  # fmt: skip
        for reason, n in zip(BAM_SKIP_REASONS, counts.tolist(), strict=True):
            skipped[reason] += n
        if longest >= 0:
            umi_lengths.update((shortest, longest))
            with naming_file(records.path):
                check_umi_lengths(min(umi_lengths), max(umi_lengths))
        yield pd.DataFrame({"cell": chunk.cell[usable], "gene": chunk.gene[usable], "umi": chunk.umi[usable]})


BAM_SKIP_REASONS = (UNUSABLE_ALIGNMENT, LOW_MAPQ, MISSING_VALUE, SKIPPED_GENE, SEVERAL_GENES, UMI_WITH_N)


@numba.njit(cache=True)
def _usable_records(flag, mapq, cell, gene, umi_length, umi_acgt, skip_gene, several_genes, min_mapq, unusable_flags):
    """Mask of usable records and records skipped per reason of :data:`BAM_SKIP_REASONS` (the first that applies).

    Also the shortest and longest UMI of the records that pass all but the N check (-1: none does).
    """
    usable = np.zeros(flag.size, np.bool_)
    skipped = np.zeros(len(BAM_SKIP_REASONS), np.int64)
    shortest, longest = np.int64(1 << 30), np.int64(-1)
    for i in range(flag.size):
        if flag[i] & unusable_flags:
            skipped[0] += 1
        elif mapq[i] < min_mapq:
            skipped[1] += 1
        elif cell[i] < 0 or gene[i] < 0 or umi_length[i] < 0:
            skipped[2] += 1
        elif skip_gene[gene[i]]:
            skipped[3] += 1
        elif several_genes[gene[i]]:
            skipped[4] += 1
        else:
            shortest, longest = min(shortest, umi_length[i]), max(longest, umi_length[i])
            if umi_acgt[i]:
                usable[i] = True
            else:
                skipped[5] += 1
    return usable, skipped, shortest, longest


def encode_reads(reads: pa.Table, *, skipped: Counter, path: Path) -> ReadTable:
    """Usable reads to codes: UMIs packed, cells and genes numbered, UMIs with N dropped.

    Raises
    ------
    InputError
        UMIs of mixed lengths or longer than 32 bases.
    """
    with naming_file(path):
        packed, valid = pack_umis(reads.column("umi").combine_chunks())
    skipped[UMI_WITH_N] += int((~valid).sum())
    kept = reads.filter(pa.array(valid))
    codes, names = {}, {}
    for name in ("cell", "gene"):
        encoded = pc.dictionary_encode(kept.column(name).combine_chunks())
        codes[name] = encoded.indices.to_numpy().astype(np.int32)
        names[name] = pd.Index(encoded.dictionary.to_pylist())
    frame = {"cell": codes["cell"], "gene": codes["gene"], "umi": packed[valid]}
    if "reads" in kept.column_names:
        frame["reads"] = kept.column("reads").to_numpy().astype(np.int64)
    return ReadTable(reads=pd.DataFrame(frame), cells=names["cell"], genes=names["gene"])
