"""UMI deduplication: exact to UMI-tools on its own test BAM and on generated BAMs."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from conftest import REPO

from omicsprep.errors import InputError
from omicsprep.options import METHODS, BamOptions, TableOptions, UmiOptions
from omicsprep.reads import counting
from omicsprep.reads.molecules import estimated_reads
from omicsprep.reads.umi import pack_umis
from omicsprep.testing.reads import generate_reads, umi_tools_count_command, write_bam

UMI_DATA = REPO / "tests" / "data" / "umi_tools"
UMI_TOOLS_BAM = UMI_DATA / "chr19_gene_tags.bam"


REFERENCE_BAM = BamOptions(gene_tag="XF", umi_source="umis")


def assert_same_counts(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    merged = expected.merge(got, on=["gene", "cell"], how="outer", suffixes=("_expected", "_got"))
    different = merged[merged["count_expected"] != merged["count_got"]]
    assert different.empty, different.head(10).to_string()


def test_pack_umis():
    packed, valid = pack_umis(pa.array(["ACGT", "ACGA", "TCGA", "ACNT"]))
    assert valid.tolist() == [True, True, True, False]
    assert packed[:3].tolist() == [0b00011011, 0b00011000, 0b11011000]  # A=00 C=01 G=10 T=11


# Runs under Numba's CUDA simulator (set before numba.cuda is imported, hence a subprocess).
CUDA_KERNEL_CHECK = """
import sys
from collections import Counter
import numpy as np
from omicsprep.options import BamOptions
from omicsprep.reads.molecules import encode_reads, usable_reads
from omicsprep.reads.umi import collapse_reads, count_groups, molecule_groups
from omicsprep.reads.umi_cuda import count_groups_gpu
from omicsprep.testing.reads import generate_read_codes

path = sys.argv[1]
options = dict(fmt="bam", bam=BamOptions(gene_tag="XF", umi_source="umis"), table=None,
               skip_gene_regex="^[__|Unassigned]", chunk_rows=10**6, skipped=Counter())
reference = next(usable_reads(path, **options))
inputs = {"umi_tools reference": encode_reads(reference, skipped=Counter(), path=path).reads,
          "generated, large groups": generate_read_codes(2_500, n_cells=4, n_genes=30, umi_length=8, seed=3)}
for name, reads in inputs.items():
    _, _, umis, counts, starts = molecule_groups(collapse_reads(reads), xp=np)
    for threshold in (1, 2):
        for method in range(5):
            cpu = count_groups(umis, counts, starts, method, threshold)
            gpu = count_groups_gpu(umis, counts, starts, method, threshold, xp=np)
            assert np.array_equal(cpu, gpu), (name, method, threshold, np.flatnonzero(cpu != gpu)[:10])
    print(name, len(starts) - 1, "groups, largest", int(np.diff(starts).max()))
"""


def test_cuda_kernel_counts_like_the_cpu_kernel():
    """The CUDA kernel (under Numba's simulator) gives the CPU kernel's counts, all methods."""
    result = subprocess.run(
        [sys.executable, "-c", CUDA_KERNEL_CHECK, str(UMI_TOOLS_BAM)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "largest" in result.stdout


def test_mixed_umi_lengths_are_refused():
    with pytest.raises(InputError, match="mixed lengths"):
        pack_umis(pa.array(["ACGT", "ACG"]))
    with pytest.raises(InputError, match="mixed lengths"):  # a non-ASCII base is no base
        pack_umis(pa.array(["ACGÑ", "ACGT", "ACGT"]))


@pytest.mark.parametrize("method", METHODS)
def test_exact_to_umi_tools_reference(method):
    options = UmiOptions(method=method, bam=REFERENCE_BAM, skip_gene_regex="^[__|Unassigned]")
    adata = counting.count_umis(UMI_TOOLS_BAM, fmt="bam", options=options)
    assert adata.uns["umi_dedup"]["reads_skipped"]["gene matches skip_gene_regex"] == 120
    expected = pd.read_csv(UMI_DATA / "expected" / f"count_per_cell_{method}.tsv", sep="\t")
    assert_same_counts(counting.long_table(adata), expected)


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


@pytest.fixture(scope="module")
def umi_tools() -> str:
    """UMI-tools' command, the reference of the live tests.

    Where it is missing the tests skip, except under ``CI=true``, where they fail: a CI
    without its reference is not green.
    """
    beside_python = Path(sys.executable).parent / "umi_tools"  # the venv's, when pytest runs without activating it
    found = str(beside_python) if beside_python.exists() else shutil.which("umi_tools")
    if found is None:
        problem = "umi_tools is not installed (make setup installs it: pip install --no-build-isolation umi_tools)"
        if under_ci():
            pytest.fail(f"{problem}; under CI=true the live UMI-tools tests are required", pytrace=False)
        pytest.skip(problem)
    return found


def live_umi_tools_counts(umi_tools: str, bam: Path, method: str, out: Path) -> pd.DataFrame:
    """``umi_tools count`` per cell and gene (tags CB, UB, GX), as a gene, cell, count table."""
    subprocess.run(umi_tools_count_command(umi_tools, bam, out, method=method), check=True, capture_output=True)
    return pd.read_csv(out, sep="\t")


@pytest.mark.parametrize("method", METHODS)
def test_exact_to_live_umi_tools_on_generated_reads(tmp_path_factory, umi_tools, method):
    work = tmp_path_factory.getbasetemp() / "umi_generated"
    bam = work / "reads.bam"
    if not bam.exists():
        work.mkdir(exist_ok=True)
        # Without what omicsprep skips on purpose and UMI-tools keeps: N, A;B, secondaries.
        reads = generate_reads(30_000, n_cells=20, n_genes=200, n_rate=0, multi_gene_rate=0, secondary_rate=0, seed=7)
        write_bam(reads, bam)
    counts = counting.long_table(counting.count_umis(bam, fmt="bam", options=UmiOptions(method=method)))
    counts["cell"] = counts["cell"].str.split("-").str[0]  # UMI-tools drops the '-1' of CB
    expected = live_umi_tools_counts(umi_tools, bam, method, tmp_path_factory.mktemp(method) / "counts.tsv")
    assert len(expected) > 1000
    assert_same_counts(counts, expected)


# One (cell, gene) per case: UMI -> reads, and the molecules each method counts, worked out
# by hand from UMI-tools 1.1's network.py. Edges join UMIs one mismatch apart; directional
# keeps an edge u -> v only where reads(u) >= 2 * reads(v) - 1; adjacency counts, per
# connected component, the fewest UMIs taken in read-count order whose neighbourhoods cover
# it; percentile keeps UMIs with more than 1% of the median reads of the (cell, gene).
HANDBUILT_CASES: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    # The example: 10 < 2 * 8 - 1, so directional keeps both; adjacency and cluster merge.
    "directional_not_adjacency": (
        {"AAAA": 10, "AAAT": 8},
        {"unique": 2, "percentile": 2, "cluster": 1, "adjacency": 1, "directional": 2},
    ),
    # The boundary: 15 >= 2 * 8 - 1, so directional merges too (a strict '>' would count 2).
    "directional_at_2n_minus_1": (
        {"AAAA": 15, "AAAT": 8},
        {"unique": 2, "percentile": 2, "cluster": 1, "adjacency": 1, "directional": 1},
    ),
    # UMIs 3 mismatches apart: only percentile drops, the 1-read UMI and the 2-read one
    # (2 is not above 1% of the median 200).
    "percentile_drops_at_1pct": (
        {"AAAA": 200, "CCCC": 200, "GGGG": 200, "TTTT": 2, "ACGT": 1},
        {"unique": 5, "percentile": 3, "cluster": 5, "adjacency": 5, "directional": 5},
    ),
    # Even count of UMIs: the median is the mean of the middle two, (400 + 4) / 2 = 202, so the
    # 4-read UMI stays (either middle value alone would give 2 or 4 molecules).
    "percentile_even_median": (
        {"AAAA": 400, "CCCC": 400, "GGGG": 4, "TTTT": 1},
        {"unique": 4, "percentile": 3, "cluster": 4, "adjacency": 4, "directional": 4},
    ),
    # A chain AAAA - AAAT - AATT (ends 2 apart): one component for cluster; the top UMI
    # covers only its neighbour, so adjacency needs two; no edge passes directional's rule.
    "cluster_chain": (
        {"AAAA": 10, "AAAT": 8, "AATT": 6},
        {"unique": 3, "percentile": 3, "cluster": 1, "adjacency": 2, "directional": 3},
    ),
    # The same chain with its middle UMI the smallest: adjacency takes UMIs in read order
    # (AAAA, then AATT), 2, although AAAT alone would cover the chain.
    "adjacency_top_umis_first": (
        {"AAAA": 10, "AAAT": 6, "AATT": 8},
        {"unique": 3, "percentile": 3, "cluster": 1, "adjacency": 2, "directional": 3},
    ),
    # Edges AAAA-AAAT, AAAT-AATT, AAAT-ACAT, AAAA-CAAA: one component (cluster 1); AAAA
    # and AAAT cover it (adjacency 2); directional keeps AAAA -> CAAA and AAAT -> ACAT only
    # (3); the 1-read CAAA is under 1% of the median 200 (percentile 4).
    "all_methods_differ": (
        {"AAAA": 400, "AAAT": 300, "AATT": 200, "ACAT": 100, "CAAA": 1},
        {"unique": 5, "percentile": 4, "cluster": 1, "adjacency": 2, "directional": 3},
    ),
}
HANDBUILT_CELL = "AAACCCAAGAAACACT"  # no '-1': UMI-tools would cut it off


def handbuilt_expected(method: str) -> pd.DataFrame:
    return pd.DataFrame(
        [(gene, HANDBUILT_CELL, expected[method]) for gene, (_, expected) in HANDBUILT_CASES.items()],
        columns=["gene", "cell", "count"],
    )


@pytest.fixture(scope="module")
def handbuilt_bam(tmp_path_factory) -> Path:
    """The hand-built cases as one BAM, each gene at its own position.

    Reads are in shuffled order within a gene, so no count is an artefact of file order.
    """
    rows = []
    for index, (gene, (umis, _)) in enumerate(HANDBUILT_CASES.items()):
        for umi, n_reads in umis.items():
            rows += [(index * 5000 + 100, HANDBUILT_CELL, umi, gene, False)] * n_reads
    reads = pd.DataFrame(rows, columns=["position", "cell", "umi", "gene", "secondary"])
    reads = reads.sample(frac=1.0, random_state=0).sort_values("position", kind="stable")
    path = tmp_path_factory.mktemp("umi_handbuilt") / "reads.bam"
    write_bam(reads, path)
    return path


def test_handbuilt_cases_tell_every_pair_of_methods_apart():
    for first, second in itertools.combinations(METHODS, 2):
        assert any(expected[first] != expected[second] for _, expected in HANDBUILT_CASES.values()), (first, second)


@pytest.mark.parametrize("method", METHODS)
def test_handbuilt_cases_count_as_worked_out_by_hand(handbuilt_bam, method):
    counts = counting.long_table(counting.count_umis(handbuilt_bam, fmt="bam", options=UmiOptions(method=method)))
    assert_same_counts(counts, handbuilt_expected(method))


@pytest.mark.parametrize("method", METHODS)
def test_handbuilt_cases_count_like_live_umi_tools(handbuilt_bam, umi_tools, tmp_path, method):
    """UMI-tools agrees with the hand-worked counts (so they are its semantics), and so do we."""
    reference = live_umi_tools_counts(umi_tools, handbuilt_bam, method, tmp_path / "counts.tsv")
    assert_same_counts(reference, handbuilt_expected(method))
    counts = counting.long_table(counting.count_umis(handbuilt_bam, fmt="bam", options=UmiOptions(method=method)))
    assert_same_counts(counts, reference)


def test_sam_counts_like_the_bam(tmp_path):
    """UMI-tools' test BAM written out as text SAM: the same reads used and skipped, the same counts.

    And those are UMI-tools' expected ones.
    """
    import pysam

    from omicsprep.io import detect_format

    sam = tmp_path / "chr19_gene_tags.sam"
    n_reads = 0
    with pysam.AlignmentFile(str(UMI_TOOLS_BAM), "rb") as bam, pysam.AlignmentFile(str(sam), "w", template=bam) as out:
        for read in bam.fetch(until_eof=True):
            out.write(read)
            n_reads += 1
    assert n_reads > 1000
    assert sam.read_bytes().startswith(b"@HD")  # text, with its header
    assert detect_format(sam) == "sam"
    options = UmiOptions(method="directional", bam=REFERENCE_BAM, skip_gene_regex="^[__|Unassigned]")
    from_sam = counting.count_umis(sam, fmt="sam", options=options)
    from_bam = counting.count_umis(UMI_TOOLS_BAM, fmt="bam", options=options)
    assert from_sam.uns["umi_dedup"]["reads_used"] == from_bam.uns["umi_dedup"]["reads_used"] > 0
    assert from_sam.uns["umi_dedup"]["reads_skipped"] == from_bam.uns["umi_dedup"]["reads_skipped"]
    assert_same_counts(counting.long_table(from_sam), counting.long_table(from_bam))
    expected = pd.read_csv(UMI_DATA / "expected" / "count_per_cell_directional.tsv", sep="\t")
    assert_same_counts(counting.long_table(from_sam), expected)


def test_skipped_reads_are_counted(tmp_path):
    reads = generate_reads(20_000, n_cells=10, n_genes=100, n_rate=0.01, seed=2)
    write_bam(reads, tmp_path / "reads.bam")
    adata = counting.count_umis(tmp_path / "reads.bam", fmt="bam", options=UmiOptions(chunk_rows=5_000))
    skipped = adata.uns["umi_dedup"]["reads_skipped"]
    assert skipped["unmapped, secondary or supplementary"] == reads["secondary"].sum()
    primary = reads[~reads["secondary"]]
    assert skipped["gene matches skip_gene_regex"] == primary["gene"].str.startswith("Unassigned").sum()
    assert skipped["several genes"] == primary["gene"].str.contains(";").sum()
    usable = primary[~primary["gene"].str.contains("Unassigned|;")]
    assert skipped["UMI with N"] == usable["umi"].str.contains("N").sum() > 0
    assert adata.uns["umi_dedup"]["reads_used"] + skipped["UMI with N"] == len(usable)


def count_umis_cli(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``omicsprep count-umis`` with ``args`` in a fresh process, its output captured."""
    command = [sys.executable, "-m", "omicsprep.cli", "count-umis", *args]
    return subprocess.run(command, check=check, capture_output=True, text=True)


def test_cli_writes_counts_and_the_umi_tools_table(tmp_path):
    out = tmp_path / "counts.h5ad"
    tsv = tmp_path / "counts.tsv"
    options = ["--gene-tag", "XF", "--extract-umi-method", "umis", "--skip-tags-regex", "^[__|Unassigned]"]
    count_umis_cli(str(UMI_TOOLS_BAM), "-o", str(out), "--tsv", str(tsv), *options, check=True)
    table = pd.read_csv(tsv, sep="\t")
    assert list(table.columns) == ["gene", "cell", "count"]
    assert_same_counts(table, pd.read_csv(UMI_DATA / "expected" / "count_per_cell_directional.tsv", sep="\t"))
    import anndata as ad

    adata = ad.read_h5ad(out)
    assert adata.X.sum() == table["count"].sum()
    assert adata.shape == (2, table["gene"].nunique())


def test_cli_bad_input_is_one_clear_error(tmp_path):
    bad = tmp_path / "broken.bam"
    bad.write_bytes(UMI_TOOLS_BAM.read_bytes()[:5000])  # truncated
    result = count_umis_cli(str(bad), "-o", str(tmp_path / "x.h5ad"))
    assert result.returncode == 1
    assert f"omicsprep error: file '{bad}'" in result.stderr
    assert not (tmp_path / "x.h5ad").exists()


def test_cli_gpu_without_a_gpu_is_one_clear_error(tmp_path):
    from omicsprep.backend import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    result = count_umis_cli(str(UMI_TOOLS_BAM), "-o", str(tmp_path / "x.h5ad"), "--backend", "gpu")
    assert result.returncode == 1
    assert result.stderr.startswith("omicsprep error: backend 'gpu' was requested but cannot be used")
    assert not (tmp_path / "x.h5ad").exists()


@pytest.mark.parametrize(("suffix", "chunk_rows"), [(".parquet", 2_000), (".tsv.gz", 5_000_000)])
def test_molecule_tables_count_like_the_bam(tmp_path, suffix, chunk_rows):
    reads = generate_reads(40_000, n_cells=60, n_genes=150, secondary_rate=0, seed=9)
    write_bam(reads, tmp_path / "reads.bam")
    table_path = tmp_path / f"molecules{suffix}"
    if suffix == ".parquet":
        reads[["cell", "umi", "gene"]].to_parquet(table_path)
    else:
        reads[["cell", "umi", "gene"]].to_csv(table_path, sep="\t", index=False)
    from_bam = counting.long_table(counting.count_umis(tmp_path / "reads.bam", fmt="bam"))
    from_table = counting.count_umis(table_path, fmt="molecules", options=UmiOptions(chunk_rows=chunk_rows))
    assert_same_counts(counting.long_table(from_table), from_bam)
    if chunk_rows < len(reads):
        assert from_table.uns["umi_dedup"]["partitions"] > 1  # cells split, counts unchanged


def test_aggregated_molecule_table_with_read_counts(tmp_path):
    reads = generate_reads(20_000, n_cells=30, n_genes=100, secondary_rate=0, seed=11)
    write_bam(reads, tmp_path / "reads.bam")
    aggregated = reads.groupby(["cell", "umi", "gene"]).size().rename("reads").reset_index()
    aggregated.to_parquet(tmp_path / "aggregated.parquet")
    got = counting.count_umis(
        tmp_path / "aggregated.parquet",
        fmt="molecules",
        options=UmiOptions(table=TableOptions(count_column="reads"), chunk_rows=1_000),
    )
    expected = counting.count_umis(tmp_path / "reads.bam", fmt="bam")
    assert_same_counts(counting.long_table(got), counting.long_table(expected))
    assert got.uns["umi_dedup"]["reads_used"] == expected.uns["umi_dedup"]["reads_used"]


def test_bam_without_the_tags_is_one_clear_error(tmp_path):
    write_bam(generate_reads(2_000, n_cells=5, n_genes=10, seed=1), tmp_path / "reads.bam")
    with pytest.raises(InputError, match=r"reads\.bam.*no usable read.*missing cell, UMI or gene"):
        counting.count_umis(
            tmp_path / "reads.bam", fmt="bam", options=UmiOptions(bam=BamOptions(cell_tag="XC", umi_tag="XM"))
        )


def test_unsorted_bam_counts_like_the_sorted_one(tmp_path):
    reads = generate_reads(20_000, n_cells=20, n_genes=100, seed=4)
    write_bam(reads, tmp_path / "sorted.bam")
    write_bam(reads.sample(frac=1.0, random_state=0), tmp_path / "unsorted.bam", unsorted=True)
    sorted_counts, unsorted_counts = (
        counting.long_table(counting.count_umis(tmp_path / name, fmt="bam")) for name in ("sorted.bam", "unsorted.bam")
    )
    assert len(sorted_counts) > 500
    assert_same_counts(unsorted_counts, sorted_counts)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("cell\tumi\tgene\n", "no usable read"),
        ("cell\tumi\tgene\nAAAC\tACGT\tG1\nAAAC\tACG\tG1\n", "UMIs of mixed lengths"),
        ("cell\tumi\tgene\nAAAC\tACGT\tG1;G2\n", r"no usable read \(skipped: \{'several genes': 1\}\)"),
        ("barcode\tumi\tgene\nAAAC\tACGT\tG1\n", "cannot be read as a molecule table"),
    ],
)
def test_bad_molecule_table_is_one_clear_error(tmp_path, text, problem):
    path = tmp_path / "molecules.tsv"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"^file '{path}': {problem}"):
        counting.count_umis(path, fmt="molecules")


@pytest.mark.parametrize(
    ("name", "content", "fmt", "problem"),
    [
        ("missing.tsv.gz", None, "molecules", "does not exist"),
        ("missing.bam", None, "bam", "does not exist"),
        ("molecules.tsv.gz", b"cell\tumi\tgene\n", "molecules", r"cannot be read as molecules \(OSError"),
    ],
)
def test_missing_or_undecodable_input_is_one_clear_error(tmp_path, name, content, fmt, problem):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)  # not gzip
    with pytest.raises(InputError, match=rf"^file '{path}': {problem}"):
        counting.count_umis(path, fmt=fmt)


def test_chunks_without_a_usable_read_are_passed_over(tmp_path):
    """A chunk of only skipped reads between partitioned chunks.

    As the unmapped reads that end a sorted BAM, or a block of unassigned rows.
    """
    reads = generate_reads(40_000, n_cells=50, n_genes=500, seed=7)[["cell", "umi", "gene"]]
    unassigned = reads.assign(gene="__no_feature")
    path = tmp_path / "molecules.parquet"
    pd.concat([reads, unassigned]).to_parquet(path, row_group_size=10_000)
    whole = counting.count_umis(path, fmt="molecules", options=UmiOptions(skip_gene_regex="^__"))
    chunked = counting.count_umis(path, fmt="molecules", options=UmiOptions(skip_gene_regex="^__", chunk_rows=20_000))
    assert chunked.uns["umi_dedup"]["partitions"] > 1
    assert chunked.uns["umi_dedup"]["reads_skipped"]["gene matches skip_gene_regex"] == len(unassigned)
    assert_same_counts(counting.long_table(chunked), counting.long_table(whole))


def test_row_estimate_of_a_compressed_table_is_close(tmp_path):
    """Partitions are sized from the rows in a table's first 16 MB of text, not a full pass."""
    reads = generate_reads(600_000, n_cells=50, n_genes=2_000, seed=6)[["cell", "umi", "gene"]]
    path = tmp_path / "molecules.tsv.gz"
    reads.to_csv(path, sep="\t", index=False, compression={"method": "gzip", "compresslevel": 1})
    assert abs(estimated_reads(path, fmt="molecules") / len(reads) - 1) < 0.15
    small = tmp_path / "small.tsv"
    reads[:1000].to_csv(small, sep="\t", index=False)
    assert estimated_reads(small, fmt="molecules") == 1000


def test_names_in_a_text_table_stay_as_written(tmp_path):
    path = tmp_path / "molecules.csv"
    path.write_text("cell,umi,gene\n0001,ACGT,00123\n0001,ACGA,00123\n0002,ACGT,7\n")
    adata = counting.count_umis(path, fmt="molecules", options=UmiOptions(method="unique"))
    assert list(adata.obs_names) == ["0001", "0002"]
    assert sorted(adata.var_names) == ["00123", "7"]
    assert adata.X.sum() == 3
