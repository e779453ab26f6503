"""The text reader that fragment files and molecule tables share (``omicsprep.io.text``).

Blocks of whole lines, and cuDF's parsing of them with one translation of its parse errors.
cuDF needs a GPU, so here pandas stands in for ``cudf.read_csv``, byte ranges included (as
cuDF reads them: the rows that start in the range); the blocks, the header, the ranges and
the errors are this package's own, and they are what is checked.
"""

from __future__ import annotations

import gzip
import io as stdio
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from omicsprep.errors import InputError
from omicsprep.io import text

LINES = [f"chr1\t{100 * i}\t{100 * i + 50}\tCELL{i % 7}\t{i % 3 + 1}\n" for i in range(500)]
NAMES = ["chrom", "start", "end", "barcode", "count"]


def _rows_starting_in(data: bytes, offset: int, size: int) -> bytes:
    """The rows whose first byte lies in ``[offset, offset + size)``, as cuDF's byte ranges take them."""

    def row_start(position: int) -> int:
        if position == 0:
            return 0
        newline = data.find(b"\n", position - 1)
        return len(data) if newline < 0 else newline + 1

    return data[row_start(offset) : row_start(min(offset + size, len(data)))]


class Frame(pd.DataFrame):
    """A pandas DataFrame with cuDF's ``to_arrow``."""

    @property
    def _constructor(self) -> type:
        return Frame

    def to_arrow(self, *, preserve_index: bool) -> pa.Table:
        return pa.Table.from_pandas(pd.DataFrame(self), preserve_index=preserve_index)


class PandasCudf:
    """``cudf.read_csv`` played by pandas; records each call's source and byte range."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, int] | None]] = []

    def read_csv(self, source, *, byte_range=None, compression=None, **options):
        assert compression is None  # the reader hands cuDF plain text
        self.calls.append(("file" if isinstance(source, Path) else "block", byte_range))
        if byte_range is not None:
            source = stdio.BytesIO(_rows_starting_in(source.read_bytes(), *byte_range))
        try:
            return Frame(pd.read_csv(source, **options))
        except ValueError as exc:  # cuDF's readers report text they cannot parse as RuntimeError
            raise RuntimeError(str(exc)) from exc


@pytest.fixture
def cudf_stand_in(monkeypatch) -> PandasCudf:
    stand_in = PandasCudf()
    monkeypatch.setattr(text, "cudf", lambda: stand_in)
    return stand_in


def _read(path: Path, *, names: list[str] | None, block_bytes: int, **options) -> pd.DataFrame:
    frames = list(
        text.cudf_text_chunks(path, names=names, block_bytes=block_bytes, what="test rows", sep="\t", **options)
    )
    return pd.concat(frames, ignore_index=True)


def test_line_blocks_end_with_a_line_and_join_to_the_text(tmp_path):
    body = "".join(LINES) + "chr2\t5\t9\tLAST\t1"  # the last line unterminated
    path = tmp_path / "rows.tsv.gz"
    path.write_bytes(gzip.compress(body.encode()))
    blocks = list(text.line_blocks(path, 1000))
    assert len(blocks) > 10
    assert all(block.endswith(b"\n") for block in blocks[:-1])
    assert b"".join(blocks).decode() == body


def test_plain_text_without_header_is_read_in_byte_ranges(tmp_path, cudf_stand_in):
    path = tmp_path / "rows.tsv"
    path.write_text("".join(LINES))
    frame = _read(path, names=NAMES, block_bytes=1000)
    expected = pd.read_csv(path, sep="\t", header=None, names=NAMES)
    pd.testing.assert_frame_equal(pd.DataFrame(frame), expected)  # each row once, whichever range it straddles
    size = path.stat().st_size
    assert cudf_stand_in.calls == [("file", (offset, 1000)) for offset in range(0, size, 1000)]


def test_compressed_text_with_a_header_is_read_in_blocks_of_lines(tmp_path, cudf_stand_in):
    path = tmp_path / "rows.tsv.gz"
    header = "\ufeff" + "\t".join(NAMES) + "\r\n"  # a byte-order mark and a Windows line end
    path.write_bytes(gzip.compress((header + "".join(LINES)).encode()))
    frame = _read(path, names=None, block_bytes=1000, usecols=["chrom", "count"])  # the first and last names
    expected = pd.DataFrame({"chrom": ["chr1"] * 500, "count": [i % 3 + 1 for i in range(500)]})
    pd.testing.assert_frame_equal(pd.DataFrame(frame), expected)
    assert len(cudf_stand_in.calls) > 10
    assert set(cudf_stand_in.calls) == {("block", None)}


def test_header_and_parse_problems_are_one_clear_error(tmp_path, cudf_stand_in):
    path = tmp_path / "rows.tsv"
    path.write_text("chrom\tbegin\n" + "".join(LINES))
    lacks = r"cannot be read as test rows \(the header lacks \['start'\]: \['chrom', 'begin'\]\)$"
    with pytest.raises(InputError, match=lacks):
        _read(path, names=None, block_bytes=1000, usecols=["chrom", "start"])
    path.write_text("")
    with pytest.raises(InputError, match=rf"^file '{path}': cannot be read as test rows \(empty file\)$"):
        _read(path, names=None, block_bytes=1000, usecols=["chrom"])
    path.write_text("chr1\tten\t20\tCELL\t1\n")
    with pytest.raises(InputError, match=rf"^file '{path}': cannot be read as test rows \(.*'ten'"):
        _read(path, names=NAMES, block_bytes=1000, dtype={"start": "int64"})


def test_only_parse_errors_become_input_errors(tmp_path):
    path = tmp_path / "rows.tsv"
    unparsable = rf"^file '{path}': cannot be read as test rows \(unparsable\)$"
    with pytest.raises(InputError, match=unparsable), text.cudf_parse_errors(path=path, what="test rows"):
        raise RuntimeError("unparsable")
    with pytest.raises(MemoryError), text.cudf_parse_errors(path=path, what="test rows"):  # the GPU's, not the file's
        raise MemoryError("out of device memory")


def test_fragment_and_molecule_readers_on_the_gpu_share_the_reader(tmp_path, cudf_stand_in):
    """Both GPU readers go through it: their cuDF calls are its calls."""
    from collections import Counter

    from omicsprep import io
    from omicsprep.options import BamOptions, TableOptions
    from omicsprep.reads.molecules import usable_reads

    fragments = tmp_path / "fragments.tsv"
    fragments.write_text("#comment\n" + "".join(LINES))
    chunks = list(io.fragment_chunks(fragments, chunk_rows=1, backend="gpu"))
    assert sum(map(len, chunks)) == len(LINES)
    assert {call[0] for call in cudf_stand_in.calls} == {"file"}
    cudf_stand_in.calls.clear()
    table = tmp_path / "molecules.tsv"
    table.write_text("cell\tumi\tgene\n" + "".join(f"CELL{i}\tACGT\tG{i % 4}\n" for i in range(30)))
    where = {"bam": BamOptions(), "table": TableOptions(), "skip_gene_regex": "", "chunk_rows": 10}
    reads = list(usable_reads(table, fmt="molecules", skipped=Counter(), backend="gpu", **where))
    assert sum(batch.num_rows for batch in reads) == 30
    assert cudf_stand_in.calls == [("block", None)]
