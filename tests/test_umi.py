"""UMI deduplication: exact to UMI-tools on its own test BAM and on generated BAMs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from conftest import REPO

from omicsprep import counting
from omicsprep.errors import InputError
from omicsprep.molecules import BamOptions, estimated_reads
from omicsprep.umi import METHODS, pack_umis

sys.path.insert(0, str(REPO / "benchmarks"))
import generate  # noqa: E402

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
from omicsprep.counting import BamOptions
from omicsprep.molecules import encode_reads, usable_reads
from omicsprep.umi import collapse_reads, count_groups, molecule_groups
from omicsprep.umi_cuda import count_groups_gpu
sys.path.insert(0, "benchmarks")
from generate import generate_read_codes

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
        [sys.executable, "-c", CUDA_KERNEL_CHECK, str(UMI_TOOLS_BAM)], cwd=REPO, capture_output=True, text=True,
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
    adata = counting.count_umis(UMI_TOOLS_BAM, fmt="bam", method=method, bam=REFERENCE_BAM,
                                skip_gene_regex="^[__|Unassigned]")
    assert adata.uns["umi_dedup"]["reads_skipped"]["gene matches skip_gene_regex"] == 120
    expected = pd.read_csv(UMI_DATA / "expected" / f"count_per_cell_{method}.tsv", sep="\t")
    assert_same_counts(counting.long_table(adata), expected)


@pytest.mark.skipif(shutil.which("umi_tools") is None and not (Path(sys.executable).parent / "umi_tools").exists(),
                    reason="umi_tools is not installed")
@pytest.mark.parametrize("method", METHODS)
def test_exact_to_live_umi_tools_on_generated_reads(tmp_path_factory, method):
    work = tmp_path_factory.getbasetemp() / "umi_generated"
    bam = work / "reads.bam"
    if not bam.exists():
        work.mkdir(exist_ok=True)
        # Without what omicsprep skips on purpose and UMI-tools keeps: N, A;B, secondaries.
        reads = generate.generate_reads(30_000, n_cells=20, n_genes=200, n_rate=0, multi_gene_rate=0,
                                        secondary_rate=0, seed=7)
        generate.write_bam(reads, bam)
    umi_tools = shutil.which("umi_tools") or str(Path(sys.executable).parent / "umi_tools")
    out = tmp_path_factory.mktemp(method) / "counts.tsv"
    subprocess.run(
        [umi_tools, "count", "--per-gene", "--per-cell", "--gene-tag=GX", "--extract-umi-method=tag",
         "--umi-tag=UB", "--cell-tag=CB", f"--method={method}", "-I", str(bam), "-S", str(out)],
        check=True, capture_output=True,
    )
    counts = counting.long_table(counting.count_umis(bam, fmt="bam", method=method))
    counts["cell"] = counts["cell"].str.split("-").str[0]  # UMI-tools drops the '-1' of CB
    expected = pd.read_csv(out, sep="\t")
    assert len(expected) > 1000
    assert_same_counts(counts, expected)


def test_skipped_reads_are_counted(tmp_path):
    reads = generate.generate_reads(20_000, n_cells=10, n_genes=100, n_rate=0.01, seed=2)
    generate.write_bam(reads, tmp_path / "reads.bam")
    adata = counting.count_umis(tmp_path / "reads.bam", fmt="bam", chunk_rows=5_000)
    skipped = adata.uns["umi_dedup"]["reads_skipped"]
    assert skipped["unmapped, secondary or supplementary"] == reads["secondary"].sum()
    primary = reads[~reads["secondary"]]
    assert skipped["gene matches skip_gene_regex"] == primary["gene"].str.startswith("Unassigned").sum()
    assert skipped["several genes"] == primary["gene"].str.contains(";").sum()
    usable = primary[~primary["gene"].str.contains("Unassigned|;")]
    assert skipped["UMI with N"] == usable["umi"].str.contains("N").sum() > 0
    assert adata.uns["umi_dedup"]["reads_used"] + skipped["UMI with N"] == len(usable)


def test_cli_writes_counts_and_the_umi_tools_table(tmp_path):
    out = tmp_path / "counts.h5ad"
    tsv = tmp_path / "counts.tsv"
    subprocess.run(
        [sys.executable, "-m", "omicsprep.cli", "count-umis", str(UMI_TOOLS_BAM), "-o", str(out), "--tsv", str(tsv),
         "--gene-tag", "XF", "--extract-umi-method", "umis", "--skip-tags-regex", "^[__|Unassigned]"],
        check=True, capture_output=True,
    )
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
    result = subprocess.run(
        [sys.executable, "-m", "omicsprep.cli", "count-umis", str(bad), "-o", str(tmp_path / "x.h5ad")],
        capture_output=True, text=True,
    )
    assert result.returncode == 1
    assert f"omicsprep error: file '{bad}'" in result.stderr
    assert not (tmp_path / "x.h5ad").exists()


def test_cli_gpu_without_a_gpu_is_one_clear_error(tmp_path):
    from omicsprep.backend import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    result = subprocess.run(
        [sys.executable, "-m", "omicsprep.cli", "count-umis", str(UMI_TOOLS_BAM), "-o", str(tmp_path / "x.h5ad"),
         "--backend", "gpu"], capture_output=True, text=True,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("omicsprep error: backend 'gpu' was requested but cannot be used")
    assert not (tmp_path / "x.h5ad").exists()


@pytest.mark.parametrize(("suffix", "chunk_rows"), [(".parquet", 2_000), (".tsv.gz", 5_000_000)])
def test_molecule_tables_count_like_the_bam(tmp_path, suffix, chunk_rows):
    reads = generate.generate_reads(40_000, n_cells=60, n_genes=150, secondary_rate=0, seed=9)
    generate.write_bam(reads, tmp_path / "reads.bam")
    table_path = tmp_path / f"molecules{suffix}"
    if suffix == ".parquet":
        reads[["cell", "umi", "gene"]].to_parquet(table_path)
    else:
        reads[["cell", "umi", "gene"]].to_csv(table_path, sep="\t", index=False)
    from_bam = counting.long_table(counting.count_umis(tmp_path / "reads.bam", fmt="bam"))
    from_table = counting.count_umis(table_path, fmt="molecules", chunk_rows=chunk_rows)
    assert_same_counts(counting.long_table(from_table), from_bam)
    if chunk_rows < len(reads):
        assert from_table.uns["umi_dedup"]["partitions"] > 1  # cells split, counts unchanged


def test_aggregated_molecule_table_with_read_counts(tmp_path):
    reads = generate.generate_reads(20_000, n_cells=30, n_genes=100, secondary_rate=0, seed=11)
    generate.write_bam(reads, tmp_path / "reads.bam")
    aggregated = reads.groupby(["cell", "umi", "gene"]).size().rename("reads").reset_index()
    aggregated.to_parquet(tmp_path / "aggregated.parquet")
    got = counting.count_umis(tmp_path / "aggregated.parquet", fmt="molecules",
                              table=counting.TableOptions(count_column="reads"), chunk_rows=1_000)
    expected = counting.count_umis(tmp_path / "reads.bam", fmt="bam")
    assert_same_counts(counting.long_table(got), counting.long_table(expected))
    assert got.uns["umi_dedup"]["reads_used"] == expected.uns["umi_dedup"]["reads_used"]


def test_bam_without_the_tags_is_one_clear_error(tmp_path):
    generate.write_bam(generate.generate_reads(2_000, n_cells=5, n_genes=10, seed=1), tmp_path / "reads.bam")
    with pytest.raises(InputError, match=r"reads\.bam.*no usable read.*missing cell, UMI or gene"):
        counting.count_umis(tmp_path / "reads.bam", fmt="bam", bam=BamOptions(cell_tag="XC", umi_tag="XM"))


def test_unsorted_bam_counts_like_the_sorted_one(tmp_path):
    reads = generate.generate_reads(20_000, n_cells=20, n_genes=100, seed=4)
    generate.write_bam(reads, tmp_path / "sorted.bam")
    generate.write_bam(reads.sample(frac=1.0, random_state=0), tmp_path / "unsorted.bam", unsorted=True)
    sorted_counts, unsorted_counts = (counting.long_table(counting.count_umis(tmp_path / name, fmt="bam"))
                                      for name in ("sorted.bam", "unsorted.bam"))
    assert len(sorted_counts) > 500
    assert_same_counts(unsorted_counts, sorted_counts)


@pytest.mark.parametrize(("text", "problem"), [
    ("cell\tumi\tgene\n", "no usable read"),
    ("cell\tumi\tgene\nAAAC\tACGT\tG1\nAAAC\tACG\tG1\n", "UMIs of mixed lengths"),
    ("cell\tumi\tgene\nAAAC\tACGT\tG1;G2\n", r"no usable read \(skipped: \{'several genes': 1\}\)"),
    ("barcode\tumi\tgene\nAAAC\tACGT\tG1\n", "cannot be read as a molecule table"),
])
def test_bad_molecule_table_is_one_clear_error(tmp_path, text, problem):
    path = tmp_path / "molecules.tsv"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"^file '{path}': {problem}"):
        counting.count_umis(path, fmt="molecules")


@pytest.mark.parametrize(("name", "content", "fmt", "problem"), [
    ("missing.tsv.gz", None, "molecules", "does not exist"),
    ("missing.bam", None, "bam", "does not exist"),
    ("molecules.tsv.gz", b"cell\tumi\tgene\n", "molecules", r"cannot be read as molecules \(OSError"),
])
def test_missing_or_undecodable_input_is_one_clear_error(tmp_path, name, content, fmt, problem):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)  # not gzip
    with pytest.raises(InputError, match=rf"^file '{path}': {problem}"):
        counting.count_umis(path, fmt=fmt)


def test_chunks_without_a_usable_read_are_passed_over(tmp_path):
    """A chunk of only skipped reads (the unmapped reads that end a sorted BAM, a block of
    unassigned rows) between partitioned chunks."""
    reads = generate.generate_reads(40_000, n_cells=50, n_genes=500, seed=7)[["cell", "umi", "gene"]]
    unassigned = reads.assign(gene="__no_feature")
    path = tmp_path / "molecules.parquet"
    pd.concat([reads, unassigned]).to_parquet(path, row_group_size=10_000)
    whole = counting.count_umis(path, fmt="molecules", skip_gene_regex="^__")
    chunked = counting.count_umis(path, fmt="molecules", skip_gene_regex="^__", chunk_rows=20_000)
    assert chunked.uns["umi_dedup"]["partitions"] > 1
    assert chunked.uns["umi_dedup"]["reads_skipped"]["gene matches skip_gene_regex"] == len(unassigned)
    assert_same_counts(counting.long_table(chunked), counting.long_table(whole))


def test_row_estimate_of_a_compressed_table_is_close(tmp_path):
    """Partitions are sized from the rows in a table's first 16 MB of text, not a full pass."""
    reads = generate.generate_reads(600_000, n_cells=50, n_genes=2_000, seed=6)[["cell", "umi", "gene"]]
    path = tmp_path / "molecules.tsv.gz"
    reads.to_csv(path, sep="\t", index=False, compression={"method": "gzip", "compresslevel": 1})
    assert abs(estimated_reads(path, fmt="molecules") / len(reads) - 1) < 0.15
    small = tmp_path / "small.tsv"
    reads[:1000].to_csv(small, sep="\t", index=False)
    assert estimated_reads(small, fmt="molecules") == 1000


def test_names_in_a_text_table_stay_as_written(tmp_path):
    path = tmp_path / "molecules.csv"
    path.write_text("cell,umi,gene\n0001,ACGT,00123\n0001,ACGA,00123\n0002,ACGT,7\n")
    adata = counting.count_umis(path, fmt="molecules", method="unique")
    assert list(adata.obs_names) == ["0001", "0002"] and sorted(adata.var_names) == ["00123", "7"]
    assert adata.X.sum() == 3
