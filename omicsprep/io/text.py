"""Text read a block of whole lines at a time, and parsed by cuDF on the GPU.

Fragment files and molecule tables share this reader; pyarrow parses the same blocks on
the CPU.
"""

from __future__ import annotations

import csv
import io as stdio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omicsprep.backend import cudf
from omicsprep.errors import InputError

STREAM_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}  # pyarrow's input streams, by suffix


def line_blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The (decompressed) text in blocks of about ``block_bytes`` that end with a line."""
    import pyarrow as pa

    with pa.input_stream(str(path), compression="detect") as handle:
        rest = b""
        while block := handle.read(block_bytes):
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # no line ends in this block
                rest += block
                continue
            text, rest = rest + block[:cut], block[cut:]
            yield text
        if rest.strip():
            yield rest


def unparsable(problem: object, *, path: Path, what: str) -> InputError:
    """The error for a file that cannot be parsed as ``what``, with the parser's ``problem``."""
    return InputError(f"cannot be read as {what} ({problem})", path=path)


@contextmanager
def cudf_parse_errors(*, path: Path, what: str) -> Iterator[None]:
    """Parse errors of cuDF's readers (a ``RuntimeError``) raised as :func:`unparsable`.

    Other GPU errors (``MemoryError`` from RMM) pass through.
    """
    try:
        yield
    except RuntimeError as exc:
        raise unparsable(exc, path=path, what=what) from exc


def cudf_text_chunks(path: Path, *, names: list[str] | None, block_bytes: int, what: str, **options: Any) -> Iterator:
    """The text of ``path`` as DataFrames parsed on the device, about ``block_bytes`` at a time.

    Each is parsed by ``cudf.read_csv(..., **options)``.

    A plain file without header is parsed in byte ranges (cuDF reads the rows that start
    in each); any other in blocks of whole lines decompressed on the host.

    Parameters
    ----------
    path
        A text file, compressed by one of :data:`STREAM_CODECS` or not.
    names
        The column names; ``None``: the first line holds them (separated by
        ``options["sep"]``; a byte-order mark is no part of a name), and must hold every
        column in ``options["usecols"]``.
    block_bytes
        Text parsed at a time.
    what
        What the file holds, named in errors.

    Raises
    ------
    InputError
        An empty file where a header is expected, a header without the columns, or text
        cuDF cannot parse.
    """
    if names is not None and path.suffix not in STREAM_CODECS:
        for offset in range(0, path.stat().st_size, block_bytes):
            with cudf_parse_errors(path=path, what=what):
                frame = cudf().read_csv(
                    path, header=None, names=names, compression=None, byte_range=(offset, block_bytes), **options
                )
            yield frame
        return
    for text in line_blocks(path, block_bytes):
        if names is None:
            first, _, text = text.partition(b"\n")
            names = _header_names(first, path=path, what=what, sep=options["sep"], required=options["usecols"])
        if text.strip():
            with cudf_parse_errors(path=path, what=what):
                frame = cudf().read_csv(stdio.BytesIO(text), header=None, names=names, compression=None, **options)
            yield frame
    if names is None:
        raise unparsable("empty file", path=path, what=what)


def _header_names(line: bytes, *, path: Path, what: str, sep: str, required: list[str]) -> list[str]:
    """The column names in a header ``line``, once found to hold the ``required`` ones."""
    names = next(csv.reader([line.decode("utf-8-sig").rstrip("\r")], delimiter=sep))
    missing = [column for column in required if column not in names]
    if missing:
        raise unparsable(f"the header lacks {missing}: {names}", path=path, what=what)
    return names
