"""Reading chromatin inputs: 10x fragment files in chunks, peaks and genes (BED), chromosome sizes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from omicsprep.backend import Backend
from omicsprep.errors import InputError, existing_file
from omicsprep.io.text import cudf_text_chunks, line_blocks, unparsable
from omicsprep.timings import timed_phase

FRAGMENT_COLUMNS = ["chrom", "start", "end", "barcode", "count"]
FRAGMENT_TYPES = {"chrom": "str", "start": "int64", "end": "int64", "barcode": "str", "count": "int64"}
FRAGMENTS = f"10x fragments with columns {FRAGMENT_COLUMNS}"  # what a fragment file holds, in errors
BYTES_PER_FRAGMENT = 48  # a 10x fragments line, about
# Default fragments per chunk: the CPU's memory grows with it; the GPU counts faster in
# larger chunks (benchmarks/RESULTS.md).
FRAGMENT_CHUNK_ROWS = {"cpu": 1_000_000, "gpu": 20_000_000}


def fragment_chunks(path: str | Path, *, chunk_rows: int | None = None, backend: Backend = "cpu") -> Iterator:
    """Stream a 10x ``fragments.tsv[.gz|.bz2|.zst|.lz4]`` in chunks of about ``chunk_rows`` fragments.

    Columns chrom, start, end, barcode, reads; ``#`` header lines are skipped. The chunks hold
    ``FRAGMENT_CHUNK_ROWS[backend]`` fragments by default.

    On the CPU the chunks are pandas DataFrames parsed by pyarrow; on the GPU, cuDF
    DataFrames parsed on the device (:func:`omicsprep.io.text.cudf_text_chunks`).

    Raises
    ------
    InputError
        Missing or unparsable file (e.g. non-integer coordinates).
    """
    path = existing_file(path)
    chunk_rows = FRAGMENT_CHUNK_ROWS[backend] if chunk_rows is None else chunk_rows
    block_bytes = max(1 << 20, chunk_rows * BYTES_PER_FRAGMENT)
    chunks = _fragment_chunks_cudf(path, block_bytes) if backend == "gpu" else _fragment_chunks_arrow(path, block_bytes)
    try:
        yield from chunks
    except InputError:
        raise
    except ValueError as exc:  # pyarrow's parse errors
        raise unparsable(f"{type(exc).__name__}: {exc}", path=path, what=FRAGMENTS) from exc


def _fragment_chunks_arrow(path: Path, block_bytes: int) -> Iterator[pd.DataFrame]:
    """Chunks parsed by pyarrow from blocks of whole lines, one block in memory at a time.

    (Arrow's streaming reader reads ahead several.) Chromosomes and barcodes are
    dictionary-encoded (categorical), a few bytes a fragment.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    strings = pa.dictionary(pa.int32(), pa.string())
    types = {k: strings if v == "str" else pa.type_for_alias(v) for k, v in FRAGMENT_TYPES.items()}
    for text in line_blocks(path, block_bytes):
        yield pacsv.read_csv(
            pa.py_buffer(text),
            read_options=pacsv.ReadOptions(column_names=FRAGMENT_COLUMNS),
            parse_options=pacsv.ParseOptions(delimiter="\t", invalid_row_handler=_skip_comment_rows),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(FRAGMENT_TYPES)),
        ).to_pandas()


def _fragment_chunks_cudf(path: Path, block_bytes: int) -> Iterator:
    """Chunks parsed by cuDF on the GPU, their coordinates checked (cuDF reads a non-integer as missing)."""
    for frame in cudf_text_chunks(
        path,
        names=FRAGMENT_COLUMNS,
        block_bytes=block_bytes,
        what=FRAGMENTS,
        sep="\t",
        usecols=list(FRAGMENT_TYPES),
        dtype=FRAGMENT_TYPES,
        comment="#",
    ):
        if frame["start"].isnull().any() or frame["end"].isnull().any():
            raise unparsable("non-integer or missing coordinates", path=path, what=FRAGMENTS)
        yield frame


def _skip_comment_rows(row) -> str:
    """Skip ``#`` header lines; refuse any other malformed row."""
    return "skip" if row.text.startswith("#") else "error"


@timed_phase("read")
def read_peaks(path: str | Path) -> pd.DataFrame:
    """Intervals from a BED file: ``chrom``, ``start``, ``end``, and ``strand`` from a sixth column.

    ``#``, ``track`` and ``browser`` lines are skipped.

    Raises
    ------
    InputError
        Missing or unparsable file, or an interval whose end is not after its start.
    """
    path = existing_file(path)
    try:  # up to BED12's columns, so one-field track and browser lines parse too
        raw = pd.read_csv(path, sep="\t", header=None, comment="#", dtype=str, names=range(12))
        raw = raw[~raw[0].str.startswith(("track", "browser"))]
        peaks = pd.DataFrame({"chrom": raw[0], "start": raw[1].astype(np.int64), "end": raw[2].astype(np.int64)})
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot be read as BED ({exc})", path=path) from exc
    if raw[5].notna().any():
        peaks["strand"] = raw[5].fillna(".")
    if (peaks["end"] <= peaks["start"]).any() or (peaks["start"] < 0).any():
        raise InputError("holds intervals whose end is not after their start", path=path)
    return peaks.reset_index(drop=True)


@timed_phase("read")
def read_tss(path: str | Path) -> pd.DataFrame:
    """Transcription start sites of the genes in a BED file: ``chrom`` and ``position``.

    The position is the start, or the last base for genes on the ``-`` strand (sixth column).

    Raises
    ------
    InputError
        As :func:`read_peaks`.
    """
    genes = read_peaks(path)
    minus = (genes["strand"] == "-").to_numpy() if "strand" in genes else np.zeros(len(genes), bool)
    return pd.DataFrame({"chrom": genes["chrom"], "position": np.where(minus, genes["end"] - 1, genes["start"])})


@timed_phase("read")
def read_chrom_sizes(path: str | Path) -> dict[str, int]:
    """Chromosome lengths from a two-column ``name<TAB>length`` file (UCSC ``chrom.sizes``).

    A FASTA index ``.fai`` works too: its first two columns are these.

    Raises
    ------
    InputError
        Missing or unparsable file.
    """
    path = existing_file(path)
    try:
        sizes = pd.read_csv(
            path,
            sep="\t",
            header=None,
            usecols=[0, 1],
            names=["chrom", "length"],
            comment="#",
            dtype={"chrom": str, "length": np.int64},
        )
    except ValueError as exc:
        raise InputError(f"cannot be read as chromosome sizes (name, length) ({exc})", path=path) from exc
    return dict(zip(sizes["chrom"], sizes["length"].astype(int), strict=True))
