"""Reads with cell, UMI and gene annotations, from BAM/SAM files, as integer-coded tables.

BAM records are decoded by oxbow (Rust, Arrow-native) in batches and filtered with Arrow
compute functions, so no Python code runs per read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from omicsprep.errors import InputError
from omicsprep.umi import pack_umis

UmiSource = Literal["tag", "read_id", "umis"]
# Where the cell barcode and UMI sit in read names: umis-style `...:CELL_<cb>:UMI_<umi>:...`
# and umi_tools extract's `<read>_<cb>_<umi>`.
READ_NAME_PATTERNS = {
    "umis": ("CELL_(?P<cell>[^:]+)", "UMI_(?P<umi>[^:]+)"),
    "read_id": ("_(?P<cell>[^_]+)_[^_]+$", "_(?P<umi>[^_]+)$"),
}
UNUSABLE_FLAGS = 0x4 | 0x100 | 0x800  # unmapped, secondary, supplementary
BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")


@dataclass
class ReadTable:
    """Reads as codes: ``reads`` has ``cell``, ``gene`` (int codes) and ``umi`` (packed)."""

    reads: pd.DataFrame
    cells: pd.Index
    genes: pd.Index
    skipped: Counter = field(default_factory=Counter)


def _check_bam_is_whole(path: Path) -> None:
    if not path.is_file():
        raise InputError("does not exist", path=path)
    with path.open("rb") as handle:
        if path.suffix.lower() == ".bam":
            handle.seek(max(path.stat().st_size - len(BGZF_EOF), 0))
            if handle.read() != BGZF_EOF:
                raise InputError("BAM is truncated (no BGZF end-of-file block)", path=path)


def _batches(path: Path, *, fields: list[str], tags: list[tuple[str, str]]):  # noqa: ANN202
    import oxbow

    if path.suffix.lower() == ".sam":
        source = oxbow.from_sam(str(path), compression=None, fields=fields, tag_defs=tags)
    else:
        source = oxbow.from_bam(str(path), fields=fields, tag_defs=tags)
    for batch in source.batches():
        yield pa.record_batch(batch)


def _cell_and_umi(batch: pa.RecordBatch, *, source: UmiSource, cell_tag: str, umi_tag: str) -> tuple[pa.Array, pa.Array]:
    if source == "tag":
        tags = batch.column("tags")
        return tags.field(cell_tag), tags.field(umi_tag)
    cell_pattern, umi_pattern = READ_NAME_PATTERNS[source]
    names = batch.column("qname")
    return pc.extract_regex(names, cell_pattern).field("cell"), pc.extract_regex(names, umi_pattern).field("umi")


def read_bam(
    path: str | Path,
    *,
    cell_tag: str = "CB",
    umi_tag: str = "UB",
    gene_tag: str = "GX",
    umi_source: UmiSource = "tag",
    min_mapq: int = 0,
    skip_gene_regex: str = "^(__|Unassigned)",
) -> ReadTable:
    """Read the cell, UMI and gene of every usable read of a BAM/SAM file.

    Unmapped, secondary and supplementary reads, reads under ``min_mapq``, reads missing
    a cell, UMI or gene, genes matching ``skip_gene_regex``, reads assigned to several
    genes (``A;B`` or ``A,B``) and UMIs with N are skipped and counted in ``skipped``.
    Sorted input is not required.

    Raises
    ------
    InputError
        Missing, truncated or unreadable file; no usable read; UMIs of mixed lengths.
    """
    path = Path(path)
    _check_bam_is_whole(path)
    fields = ["flag", "mapq"] + (["qname"] if umi_source != "tag" else [])
    tags = [(gene_tag, "Z")] + ([(cell_tag, "Z"), (umi_tag, "Z")] if umi_source == "tag" else [])
    skipped: Counter = Counter()
    kept: dict[str, list[pa.Array]] = {"cell": [], "umi": [], "gene": []}
    try:
        for batch in _batches(path, fields=fields, tags=tags):
            gene = batch.column("tags").field(gene_tag)
            cell, umi = _cell_and_umi(batch, source=umi_source, cell_tag=cell_tag, umi_tag=umi_tag)
            usable = _usable(
                gene, cell, umi, skipped=skipped, skip_gene_regex=skip_gene_regex,
                unusable_alignment=pc.not_equal(pc.bit_wise_and(batch.column("flag"), UNUSABLE_FLAGS), 0),
                low_mapq=pc.less(batch.column("mapq"), min_mapq),
            )
            for name, values in (("cell", cell), ("umi", umi), ("gene", gene)):
                kept[name].append(values.filter(usable))
    except InputError:
        raise
    except BaseException as exc:  # oxbow reports corrupt input as a Rust panic
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise InputError(f"cannot be read as BAM/SAM ({type(exc).__name__}: {exc})", path=path) from exc
    if not kept["cell"] or sum(len(a) for a in kept["cell"]) == 0:
        raise InputError(f"no usable read (skipped: {dict(skipped) or 'none'})", path=path)
    return _encode({name: pa.concat_arrays(arrays) for name, arrays in kept.items()}, skipped=skipped, path=path)


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
    """Mask of usable reads; each unusable one is counted once, under its first reason."""
    checks = {
        "unmapped, secondary or supplementary": unusable_alignment,
        "below min_mapq": low_mapq,
        "missing cell, UMI or gene": pc.or_(pc.or_(pc.is_null(gene), pc.is_null(cell)), pc.is_null(umi)),
        "gene matches skip_gene_regex": pc.match_substring_regex(gene, skip_gene_regex or "$^"),
        "several genes": pc.match_substring_regex(gene, "[;,]"),
    }
    usable = pa.array(np.ones(len(gene), dtype=bool))
    for reason, failed in checks.items():
        if failed is None:
            continue
        failed = pc.and_(usable, pc.fill_null(failed, False))
        skipped[reason] += pc.sum(failed).as_py() or 0
        usable = pc.and_(usable, pc.invert(failed))
    return usable


def _encode(columns: dict[str, pa.Array], *, skipped: Counter, path: Path, reads: pa.Array | None = None) -> ReadTable:
    """String columns to codes: packed UMIs, cells and genes numbered; N-UMIs dropped."""
    try:
        packed, valid = pack_umis(columns["umi"])
    except InputError as exc:
        raise InputError(exc.problem, path=path) from exc
    skipped["UMI with N"] += int((~valid).sum())
    mask = pa.array(valid)
    codes, names = {}, {}
    for name in ("cell", "gene"):
        encoded = pc.dictionary_encode(columns[name].filter(mask))
        codes[name] = encoded.indices.to_numpy().astype(np.int32)
        names[name] = pd.Index(encoded.dictionary.to_pylist())
    frame = {"cell": codes["cell"], "gene": codes["gene"], "umi": packed[valid]}
    if reads is not None:
        frame["reads"] = reads.filter(mask).to_numpy().astype(np.int64)
    return ReadTable(reads=pd.DataFrame(frame), cells=names["cell"], genes=names["gene"], skipped=skipped)


def molecule_table_batches(path: str | Path, *, columns: list[str], chunk_rows: int) -> Iterator[pa.RecordBatch]:
    """Stream a molecule table (Parquet, or CSV/TSV, gzipped or not) in batches of about
    ``chunk_rows`` rows, all columns as strings except a read count."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputError("does not exist", path=path)
    suffixes = [s.lower() for s in path.suffixes]
    try:
        if ".parquet" in suffixes:
            yield from pq.ParquetFile(path).iter_batches(batch_size=chunk_rows, columns=columns)
            return
        delimiter = "\t" if ".tsv" in suffixes or ".txt" in suffixes else ","
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=max(1 << 20, chunk_rows * 64)),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(include_columns=columns, strings_can_be_null=True),
        )
        yield from reader
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise InputError(f"cannot be read as a molecule table with columns {columns} ({exc})", path=path) from exc


def molecule_table_rows(path: str | Path, *, column: str) -> int:
    """Rows of a molecule table: from Parquet metadata, or one streaming pass over text."""
    import pyarrow.parquet as pq

    path = Path(path)
    if ".parquet" in [s.lower() for s in path.suffixes] and path.is_file():
        return pq.ParquetFile(path).metadata.num_rows
    return sum(batch.num_rows for batch in molecule_table_batches(path, columns=[column], chunk_rows=1 << 20))
