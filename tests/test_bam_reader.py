"""The BAM reader (omicsprep.reads.bam) against pysam, and counting through it against oxbow's path."""

from __future__ import annotations

import array
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from omicsprep.errors import InputError
from omicsprep.options import UmiOptions
from omicsprep.reads import bam as bam_reader
from omicsprep.reads import bgzf, counting
from omicsprep.reads.molecules import READ_NAME_PATTERNS
from omicsprep.reads.umi import collapse_codes, collapse_reads, molecule_groups
from omicsprep.testing.reads import generate_reads, write_bam

pysam = pytest.importorskip("pysam")

BASES = "ACGT"
# Every tag type but the three read, with values at their types' edges.
OTHER_TAGS = [
    ("XA", "q", "A"),
    ("Xc", -128, "c"),
    ("XC", 255, "C"),
    ("Xs", -32768, "s"),
    ("XS", 65535, "S"),
    ("Xi", -(2**31), "i"),
    ("XI", 2**32 - 1, "I"),
    ("Xf", 1.5, "f"),
    ("XZ", "some text", "Z"),
    ("XH", "1AE301", "H"),
    ("Bc", array.array("b", [-1, 2, 3]), None),
    ("BC", array.array("B", [1, 2, 250]), None),
    ("Bs", array.array("h", [-300, 300]), None),
    ("BS", array.array("H", [60000]), None),
    ("Bi", array.array("i", [-(2**30), 7]), None),
    ("BI", array.array("I", [2**31 + 5]), None),
    ("Bf", array.array("f", [0.25, -2.0, 3.0]), None),
    ("BE", array.array("i", []), None),  # an empty array
]


def random_records(n: int, seed: int) -> list[dict]:
    """Reads with every kind of record the reader must walk past or read."""
    rng = np.random.default_rng(seed)
    cells = ["".join(rng.choice(list(BASES), 16)) + "-1" for _ in range(40)] + ["-"]
    genes = [f"ENSG{g:011d}" for g in range(60)] + ["-", "Unassigned_NoFeatures", "G1;G2"]
    records = []
    for i in range(n):
        kind = rng.random()
        umi = "".join(rng.choice(list(BASES), 10))
        if rng.random() < 0.03:
            umi = umi[:4] + "N" + umi[5:]
        if rng.random() < 0.02:
            umi = "-"
        tags = [("CB", str(rng.choice(cells)), "Z"), ("UB", umi, "Z"), ("GX", str(rng.choice(genes)), "Z")]
        tags = [tag for tag in tags if rng.random() > 0.03]  # some tags missing
        others = [OTHER_TAGS[k] for k in rng.choice(len(OTHER_TAGS), size=rng.integers(0, 6), replace=False)]
        mixed = others + tags
        order = rng.permutation(len(mixed))
        record = {
            "name": f"read{i}" + ("x" * int(rng.integers(100, 240)) if rng.random() < 0.05 else ""),
            "flag": int(rng.choice([0, 0, 0, 16, 4, 0x100, 0x800])),
            "mapq": int(rng.integers(0, 256)),
            "tags": [] if kind < 0.05 else [mixed[k] for k in order],
            "cigar": [(0, 50)],
        }
        if kind > 0.998:  # a CIGAR too long for the record: htslib moves it to a CG:B,I tag
            record["cigar"] = [(0, 1), (1, 1)] * 35_000
        records.append(record)
    return records


def write_records(records: list[dict], path: Path) -> None:
    header = {"HD": {"VN": "1.6", "SO": "unsorted"}, "SQ": [{"SN": "chr1", "LN": 10_000_000}]}
    with pysam.AlignmentFile(str(path), "wb", header=header) as out:
        for record in records:
            read = pysam.AlignedSegment(out.header)
            read.query_name = record["name"]
            read.flag = record["flag"]
            read.reference_id = 0
            read.reference_start = 100
            read.mapping_quality = record["mapq"]
            read.cigartuples = record["cigar"]
            length = sum(n for op, n in record["cigar"] if op in (0, 1, 4, 7, 8))
            read.query_sequence = "A" * length
            read.query_qualities = pysam.qualitystring_to_array("I" * length)
            for tag, value, value_type in record["tags"]:
                read.set_tag(tag, value, value_type=value_type)
            out.write(read)


@pytest.fixture(scope="module")
def records_bam(tmp_path_factory) -> tuple[Path, list[dict]]:
    records = random_records(6_000, seed=1)
    path = tmp_path_factory.mktemp("bam_reader") / "records.bam"
    write_records(records, path)
    return path, records


def expected_fields(path: Path, *, umi_source: str = "tag") -> pd.DataFrame:
    """What the reader should find, per record, read by pysam (names by Python's regular expressions)."""
    rows = []
    with pysam.AlignmentFile(str(path), "rb", check_sq=False) as reads:
        for read in reads.fetch(until_eof=True):
            values = {}
            for tag, what in (("CB", "cell"), ("UB", "umi"), ("GX", "gene")):
                value = None
                if read.has_tag(tag):
                    value, value_type = read.get_tag(tag, with_value_type=True)
                    value = value if value_type == "Z" and value != "-" else None
                values[what] = value
            if umi_source != "tag":
                cell_pattern, umi_pattern = READ_NAME_PATTERNS[umi_source]
                found = re.search(cell_pattern, read.query_name), re.search(umi_pattern, read.query_name)
                values["cell"], values["umi"] = (match.group(1) if match else None for match in found)
            rows.append({"flag": read.flag, "mapq": read.mapping_quality, **values})
    return pd.DataFrame(rows)


def read_fields(path: Path, **options) -> pd.DataFrame:
    """The reader's codes turned back into names and UMI strings."""
    reader = bam_reader.BamRecords(path, **options)
    chunks = list(reader)
    cells, genes = np.array(reader.cells.names(), dtype=object), np.array(reader.genes.names(), dtype=object)
    frames = []
    for chunk in chunks:
        umis = [
            None if length < 0 else "".join(BASES[(int(packed) >> (2 * (length - 1 - k))) & 3] for k in range(length))
            for packed, length in zip(chunk.umi.tolist(), chunk.umi_length.tolist(), strict=True)
        ]
        frames.append(
            pd.DataFrame(
                {
                    "flag": chunk.flag.astype(int),
                    "mapq": chunk.mapq.astype(int),
                    "cell": np.where(chunk.cell >= 0, cells[np.maximum(chunk.cell, 0)], None),
                    "umi": umis,
                    "gene": np.where(chunk.gene >= 0, genes[np.maximum(chunk.gene, 0)], None),
                    "umi_acgt": chunk.umi_acgt,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def assert_fields_match(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert len(got) == len(expected)
    for column in ("flag", "mapq", "cell", "gene"):
        assert got[column].tolist() == expected[column].tolist(), column
    has_n = expected["umi"].map(lambda umi: umi is not None and re.search("[^ACGT]", umi) is not None)
    assert (~got["umi_acgt"]).tolist() == has_n.tolist()
    # A UMI with N is flagged, and packed with N as T: compare the rest.
    umi = expected["umi"].where(~has_n, expected["umi"].str.replace("[^ACGT]", "T", regex=True))
    assert got["umi"].tolist() == umi.tolist()


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few blocks: records cut by chunk ends and partial reads of the file, often."""
    monkeypatch.setattr(bam_reader, "CHUNK_BYTES", 150_000)
    monkeypatch.setattr(bam_reader, "RAW_READ_BYTES", 20_000)


@pytest.mark.parametrize("threads", [1, 2])
def test_every_field_as_pysam_reads_it(records_bam, small_chunks, threads):
    path, records = records_bam
    expected = expected_fields(path)
    assert expected["cell"].isna().any() and expected["umi"].isna().any() and expected["gene"].isna().any()
    assert any(len(r["cigar"]) > 65_535 for r in records) and any(len(r["name"]) > 200 for r in records)
    assert any(not r["tags"] for r in records)
    assert_fields_match(read_fields(path, threads=threads), expected)


def test_default_chunks_read_the_same(records_bam):
    path, _ = records_bam
    assert_fields_match(read_fields(path), expected_fields(path))


def test_bgzf_blocks_are_many(records_bam):
    """Records span block boundaries: the file holds many blocks, and chunks of them."""
    path, _ = records_bam
    _, _, sizes, used, malformed = bgzf.bgzf_blocks(np.frombuffer(path.read_bytes(), np.uint8))
    assert malformed == -1 and used == path.stat().st_size
    assert len(sizes) > 20


def test_a_header_longer_than_a_chunk_and_a_bam_without_records(tmp_path, small_chunks):
    header = {"HD": {"VN": "1.6", "SO": "unsorted"}, "SQ": [{"SN": f"contig{i}", "LN": 1000} for i in range(20_000)]}
    path = tmp_path / "long_header.bam"
    with pysam.AlignmentFile(str(path), "wb", header=header) as out:
        read = pysam.AlignedSegment(out.header)
        read.query_name, read.flag, read.reference_id, read.reference_start = "r1", 0, 19_999, 10
        read.query_sequence, read.cigartuples = "ACGT", [(0, 4)]
        read.set_tags([("CB", "AAAC", "Z"), ("UB", "ACGT", "Z"), ("GX", "G1", "Z")])
        out.write(read)
    with pysam.AlignmentFile(str(path), "rb") as written:
        assert len(str(written.header)) > 3 * bam_reader.CHUNK_BYTES  # the header spans chunks
    assert_fields_match(read_fields(path), expected_fields(path))
    empty = tmp_path / "empty.bam"
    with pysam.AlignmentFile(str(empty), "wb", header=header):
        pass
    assert sum(len(chunk.flag) for chunk in bam_reader.BamRecords(empty)) == 0
    with pytest.raises(InputError, match="no usable read"):
        counting.count_umis(empty, fmt="bam")


@pytest.mark.parametrize("umi_source", ["read_id", "umis"])
def test_cell_and_umi_from_read_names(tmp_path, small_chunks, umi_source):
    rng = np.random.default_rng(3)
    records = []
    for i in range(3_000):
        cell, umi = "".join(rng.choice(list(BASES), 12)), "".join(rng.choice(list(BASES), 8))
        if umi_source == "read_id":
            name = f"read:{i}_{cell}_{umi}" if rng.random() > 0.05 else f"read{i}_{umi}"
        else:
            name = f"read:{i}:CELL_{cell}:UMI_{umi}:extra" if rng.random() > 0.05 else f"read:{i}:UMI_{umi}"
        records.append({"name": name, "flag": 0, "mapq": 60, "tags": [("GX", "G1", "Z")], "cigar": [(0, 20)]})
    path = tmp_path / "names.bam"
    write_records(records, path)
    expected = expected_fields(path, umi_source=umi_source)
    assert expected["cell"].isna().sum() > 50
    assert_fields_match(read_fields(path, umi_source=umi_source), expected)


def test_truncated_or_corrupt_bam_is_one_clear_error(records_bam, tmp_path):
    path, _ = records_bam
    data = path.read_bytes()
    truncated = tmp_path / "truncated.bam"
    truncated.write_bytes(data[: len(data) // 2])
    without_eof = tmp_path / "without_eof.bam"
    without_eof.write_bytes(data[: -len(bgzf.BGZF_EOF)])
    cut_mid_block = tmp_path / "cut.bam"
    cut_mid_block.write_bytes(data[: len(data) // 2] + bgzf.BGZF_EOF)
    corrupt = tmp_path / "corrupt.bam"
    middle = bytearray(data)
    middle[len(data) // 2 : len(data) // 2 + 200] = bytes(200)
    corrupt.write_bytes(bytes(middle))
    for bad, problem in [
        (truncated, "truncated"),
        (without_eof, "truncated"),
        (cut_mid_block, "BGZF"),
        (corrupt, "BGZF"),
    ]:
        with pytest.raises(InputError, match=rf"^file '{re.escape(str(bad))}': .*{problem}"):
            list(bam_reader.BamRecords(bad))
        with pytest.raises(InputError, match=re.escape(str(bad))):
            counting.count_umis(bad, fmt="bam")


def starsolo_reads(n: int, seed: int) -> pd.DataFrame:
    """Generated reads where STARsolo would write '-' for a missing cell, UMI or gene."""
    reads = generate_reads(n, n_cells=40, n_genes=300, seed=seed)
    rng = np.random.default_rng(seed)
    for column in ("cell", "umi", "gene"):
        reads.loc[rng.random(len(reads)) < 0.02, column] = "-"
    return reads


@pytest.mark.parametrize("chunk_rows", [5_000_000, 7_000])
def test_counts_and_skipped_reads_as_oxbow_reads_them(tmp_path, chunk_rows):
    """The new reader and oxbow (which reads the same records as SAM) use, skip and count alike."""
    reads = starsolo_reads(40_000, seed=5)
    bam = tmp_path / "reads.bam"
    write_bam(reads, bam, unsorted=True)
    sam = tmp_path / "reads.sam"
    with pysam.AlignmentFile(str(bam), "rb") as source, pysam.AlignmentFile(str(sam), "w", template=source) as out:
        for read in source.fetch(until_eof=True):
            out.write(read)
    options = UmiOptions(chunk_rows=chunk_rows)
    from_bam = counting.count_umis(bam, fmt="bam", options=options)
    from_sam = counting.count_umis(sam, fmt="sam", options=options)
    for key in ("reads_used", "reads_skipped"):
        assert from_bam.uns["umi_dedup"][key] == from_sam.uns["umi_dedup"][key], key
    assert from_bam.uns["umi_dedup"]["reads_skipped"]["missing cell, UMI or gene"] > 1000
    if chunk_rows < len(reads):
        assert from_bam.uns["umi_dedup"]["partitions"] > 1
    pd.testing.assert_frame_equal(counting.long_table(from_bam), counting.long_table(from_sam))


def test_threads_do_not_change_counts(tmp_path):
    reads = generate_reads(20_000, n_cells=30, n_genes=200, seed=8)
    write_bam(reads, tmp_path / "reads.bam")
    one, every = (
        counting.long_table(counting.count_umis(tmp_path / "reads.bam", fmt="bam", threads=threads))
        for threads in (1, None)
    )
    pd.testing.assert_frame_equal(one, every)


@pytest.mark.parametrize("weighted", [False, True])
def test_numba_collapse_is_the_pandas_collapse(weighted):
    rng = np.random.default_rng(4)
    n = 50_000
    reads = pd.DataFrame(
        {
            "cell": rng.integers(0, 30, n),
            "gene": rng.integers(0, 40, n),
            "umi": rng.integers(0, 64, n).astype(np.uint64),  # few UMIs: many duplicates and ties
        }
    )
    reads.loc[reads.index[:3000], ["cell", "gene"]] = [7, 3]  # a large group (sorted by argsort)
    weight = rng.integers(1, 5, n) if weighted else np.empty(0, np.int64)
    if weighted:
        reads["reads"] = weight
    expected = molecule_groups(collapse_reads(reads), xp=np)
    got = collapse_codes(
        reads["cell"].to_numpy(np.int64), reads["gene"].to_numpy(np.int64), reads["umi"].to_numpy(np.uint64), weight
    )
    for name, a, b in zip(["cell", "gene", "umi", "count", "starts"], got, expected, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.gpu
def test_bam_counts_are_identical_on_cpu_and_gpu(tmp_path):
    reads = starsolo_reads(200_000, seed=6)
    write_bam(reads, tmp_path / "reads.bam", unsorted=True)
    options = UmiOptions(chunk_rows=60_000)
    counts = {
        backend: counting.count_umis(tmp_path / "reads.bam", fmt="bam", options=options, backend=backend)
        for backend in ("cpu", "gpu")
    }
    pd.testing.assert_frame_equal(counting.long_table(counts["gpu"]), counting.long_table(counts["cpu"]))
    for key in ("reads_used", "partitions", "reads_skipped"):
        assert counts["gpu"].uns["umi_dedup"][key] == counts["cpu"].uns["umi_dedup"][key]
