"""STARsolo on a synthetic genome and droplet FASTQs: our commands, our UMI counts, our input checks.

One module-scoped run of STAR 2.7.10b (index ~0.5 s, each alignment ~2 s) on 50 cells x 1,500
read pairs over 200 genes (omicsprep/testing/generate_fastq.py), in two lanes, with read 1 two bases
longer than barcode+UMI.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from omicsprep.align import checks
from omicsprep.align.chemistry import Chemistry, chemistry
from omicsprep.align.run import align_sample, build_index
from omicsprep.align.star import genome_generate_command, sa_index_bases, solo_command
from omicsprep.errors import InputError
from omicsprep.io.counts import read_counts
from omicsprep.io.multiqc import write_multiqc_report
from omicsprep.io.star import read_barcode_stats, read_solo_matrix, read_solo_summary
from omicsprep.options import AlignOptions, BamOptions, UmiOptions
from omicsprep.reads.counting import count_umis
from omicsprep.summary import HEADLINE, multiqc_sections
from omicsprep.testing import generate_fastq

pytestmark = pytest.mark.skipif(shutil.which("STAR") is None, reason="STAR is not on PATH (Debian: rna-star)")

V3 = chemistry("10xv3")
EXTRA_BASES = 2
N_TWINS = 5  # genes annotated twice: their reads are multi-gene, counted by neither feature


@dataclass(frozen=True)
class Run:
    """A STARsolo run of the fixture: ``out`` is its output folder, ``gene_feature`` listed first."""

    out: Path
    gene_feature: str

    @property
    def bam(self) -> Path:
        return self.out / "Aligned.sortedByCoord.out.bam"

    def matrix(self, feature: str | None = None) -> Path:
        return self.out / "Solo.out" / (feature or self.gene_feature) / "raw"


@dataclass(frozen=True)
class Fixture:
    root: Path
    genome: generate_fastq.Genome
    fasta: Path
    gtf: Path
    index: Path
    planted: generate_fastq.Planted
    runs: dict[str, Run]


def _star(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _solo(fixture_root: Path, index: Path, planted: generate_fastq.Planted, *, name: str, **options) -> Run:
    out = fixture_root / name
    out.mkdir()
    command = solo_command(
        index_dir=index,
        fastq_1=list(options.pop("fastq_1", planted.fastq_1)),
        fastq_2=list(options.pop("fastq_2", planted.fastq_2)),
        chemistry=V3,
        whitelist=planted.whitelist,
        out_prefix=f"{out}/",
        threads=2,
        tmp_dir=out / "tmp",
        **options,
    )
    result = _star(command)
    assert result.returncode == 0, (out / "Log.out").read_text()[-2000:]
    return Run(out, options.get("gene_feature", "Gene"))


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    root = tmp_path_factory.mktemp("star")
    genome = generate_fastq.generate_genome(n_chromosomes=3, n_genes=200, seed=0, n_twins=N_TWINS)
    fasta, gtf, index = root / "genome.fa", root / "genes.gtf", root / "index"
    generate_fastq.write_reference(genome, fasta=fasta, gtf=gtf)
    planted = generate_fastq.generate_fastqs(
        genome,
        out_dir=root / "fastq",
        n_cells=50,
        reads_per_cell=1500,
        seed=1,
        extra_bases=EXTRA_BASES,
        n_lanes=2,
        n_unusable_umi_reads=200,
    )
    index.mkdir()
    genome_length = checks.check_reference(fasta, gtf)
    command = genome_generate_command(
        fasta=fasta, gtf=gtf, index_dir=index, threads=2, genome_length=genome_length, read_length=90
    )
    assert _star(command).returncode == 0, (index / "Log.out").read_text()[-2000:]
    runs = {
        feature: _solo(root, index, planted, name=f"solo_{feature}", gene_feature=feature)
        for feature in ("Gene", "GeneFull")
    }
    return Fixture(root, genome, fasta, gtf, index, planted, runs)


def _entries(adata, *, gene_ids: bool) -> pd.Series:
    """Non-zero (cell, gene) -> count."""
    genes = adata.var["gene_ids"] if gene_ids else adata.var_names
    coo = adata.X.tocoo()
    index = pd.MultiIndex.from_arrays([adata.obs_names[coo.row], np.asarray(genes)[coo.col]])
    series = pd.Series(coo.data, index=index)
    return series[series > 0]


def _umis_by_cell_gene(bam: Path) -> dict[tuple[str, str], collections.Counter]:
    """Raw UMIs (UR) and their reads per (corrected cell, gene) of the reads STARsolo counted."""
    pysam = pytest.importorskip("pysam")
    groups: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    with pysam.AlignmentFile(str(bam)) as reads:
        for read in reads:
            if read.flag & 0x904 or "-" in (read.get_tag("CB"), read.get_tag("GX")):
                continue
            groups[(read.get_tag("CB"), read.get_tag("GX"))][read.get_tag("UR")] += 1
    return groups


def _star_directional(umis: collections.Counter) -> int:
    """STAR 2.7.10b's 1MM_Directional_UMItools (SoloFeature_collapseUMIall.cpp): one greedy pass.

    UMIs in order of reads (then sequence); each joins the first earlier UMI one mismatch away
    with at least 2n-1 reads. UMI-tools instead grows each cluster breadth-first, also through
    later UMIs: a chain a-b-c of single-read UMIs with a, c two apart is one molecule there and
    two here.
    """
    order = sorted(umis, key=lambda umi: (-umis[umi], umi))
    root: dict[str, str] = {}
    for position, umi in enumerate(order):
        root[umi] = next(
            (
                root[earlier]
                for earlier in order[:position]
                if sum(a != b for a, b in zip(umi, earlier, strict=True)) == 1 and umis[earlier] >= 2 * umis[umi] - 1
            ),
            umi,
        )
    return len(set(root.values()))


@pytest.mark.parametrize("feature", ["Gene", "GeneFull"])
def test_count_umis_on_starsolo_bam_matches_starsolo(fixture: Fixture, feature: str) -> None:
    """Our directional counts of STARsolo's BAM (CB, raw UMI UR, GX) against STARsolo's own matrix.

    UR, not UB: UB is the UMI after STARsolo's own correction, so counting distinct UBs would
    only repeat STARsolo. STARsolo writes '-' for a missing CB or GX; today's reader keeps
    '-' as a value, so reads with GX '-' (not one gene of the feature) are skipped by
    skip_gene_regex and the cell '-' is dropped here. STARsolo gives CB '-' (and UB '-') to
    reads whose barcode matches no whitelist entry and to reads whose UMI is a homopolymer or
    holds an N (the fixture plants 100 of each), keeping their GX. The counts agree exactly except
    where STAR's greedy directional pass and UMI-tools' breadth-first clustering differ; each
    such entry is checked to be exactly that difference.
    """
    umi_tools = pytest.importorskip("umi_tools.network")
    run = fixture.runs[feature]
    ours = count_umis(
        run.bam,
        fmt="bam",
        options=UmiOptions(
            method="directional",
            skip_gene_regex="^-$",
            bam=BamOptions(cell_tag="CB", umi_tag="UR", gene_tag="GX"),
        ),
    )
    ours_entries = _entries(ours, gene_ids=False).drop("-", level=0, errors="ignore")
    star_entries = _entries(read_solo_matrix(run.matrix()), gene_ids=True)

    groups = _umis_by_cell_gene(run.bam)
    clusterer = umi_tools.UMIClusterer(cluster_method="directional")
    by_umi_tools = pd.Series(
        {key: len(clusterer({umi.encode(): n for umi, n in umis.items()}, threshold=1)) for key, umis in groups.items()}
    )
    by_star_rule = pd.Series({key: _star_directional(umis) for key, umis in groups.items()})
    table = (
        pd.concat(
            {"ours": ours_entries, "star": star_entries, "umi_tools": by_umi_tools, "star_rule": by_star_rule}, axis=1
        )
        .fillna(0)
        .astype(np.int64)
    )
    assert len(table) > 5000
    pd.testing.assert_series_equal(table["ours"], table["umi_tools"], check_names=False)
    pd.testing.assert_series_equal(table["star"], table["star_rule"], check_names=False)
    differing = table.index[table["ours"] != table["star"]]
    assert differing.equals(table.index[table["umi_tools"] != table["star_rule"]])
    assert len(differing) <= 0.002 * len(table)  # chains of single-read UMIs: rare at 0.2% UMI errors
    assert ((table.loc[differing, "star"] - table.loc[differing, "ours"]) == 1).all()


@pytest.mark.parametrize("feature", ["Gene", "GeneFull"])
def test_planted_molecules_recovered(fixture: Fixture, feature: str) -> None:
    """STARsolo's counts against the planted molecules (Gene: exonic ones; GeneFull: all).

    Errors put in: 0.5% per barcode base (a read with two errors in 16 bases, 0.3%, is lost;
    one error is corrected against the whitelist), 0.2% per UMI base (2.4% of reads; an erroneous
    copy absorbed by directional merging unless two copies of one molecule err apart), 0.2% per
    cDNA base. So a cell x gene entry may be one molecule off, rarely; cell totals within 1%.
    """
    truth = fixture.planted.truth
    twinned = {twin.gene_id.removesuffix("T") for twin in fixture.genome.twins}
    planted = truth[~truth["gene"].isin(twinned) & (~truth["intronic"] | (feature == "GeneFull"))]
    expected = planted.groupby(["cell", "gene"]).size()
    found = _entries(read_solo_matrix(fixture.runs["Gene"].matrix(feature)), gene_ids=True)
    assert not set(found.index.get_level_values(1)) & (twinned | {twin.gene_id for twin in fixture.genome.twins})
    table = pd.concat({"found": found, "planted": expected}, axis=1).fillna(0)
    difference = table["found"] - table["planted"]
    assert set(found.index.get_level_values(0)) <= set(fixture.planted.barcodes)
    assert difference.abs().max() <= 1
    assert (difference == 0).mean() >= 0.99
    per_cell = table.groupby(level=0).sum()
    np.testing.assert_allclose(per_cell["found"], per_cell["planted"], rtol=0.01)


def test_gx_carries_the_first_listed_feature(fixture: Fixture) -> None:
    """GX/GN follow the first of --soloFeatures (ParametersSolo.cpp: samAttrFeature = featureFirst).

    Listed first, Gene leaves GX '-' on intronic reads; GeneFull tags them with their gene.
    Both leave '-' on multi-gene reads (never a list of genes).
    """
    pysam = pytest.importorskip("pysam")
    truth = fixture.planted.truth
    multi_gene = truth["gene"].isin({twin.gene_id.removesuffix("T") for twin in fixture.genome.twins})
    untagged_share = {
        "Gene": truth.loc[truth["intronic"] | multi_gene, "reads"].sum() / truth["reads"].sum(),
        "GeneFull": truth.loc[multi_gene, "reads"].sum() / truth["reads"].sum(),
    }
    names = {gene.gene_id: gene.name for gene in fixture.genome.genes}
    untagged = {}
    for feature, run in fixture.runs.items():
        command = solo_command(
            index_dir=fixture.index,
            fastq_1=[Path("r1.fq")],
            fastq_2=[Path("r2.fq")],
            chemistry=V3,
            whitelist=None,
            out_prefix="x/",
            threads=1,
            tmp_dir=Path("t"),
            gene_feature=feature,
        )
        features = command[command.index("--soloFeatures") + 1 :][:2]
        assert features[0] == feature
        with pysam.AlignmentFile(str(run.bam)) as reads:
            tags = [(read.get_tag("GX"), read.get_tag("GN")) for read in reads if not read.flag & 0x904]
        untagged[feature] = sum(gx == "-" for gx, _ in tags) / len(tags)
        assert all(names[gx] == gn for gx, gn in tags if gx != "-")
    assert untagged == pytest.approx(untagged_share, abs=0.01)


def test_summaries(fixture: Fixture) -> None:
    """STARsolo's statistics; the reads with a homopolymer UMI or an N in it are refused by STARsolo."""
    unusable = fixture.planted.unusable_umi_reads
    n_reads = fixture.planted.truth["reads"].sum() + sum(unusable.values())
    summary = read_solo_summary(fixture.runs["Gene"].out / "Solo.out" / "Gene" / "Summary.csv")
    assert summary["Number of Reads"] == n_reads
    assert summary["Reads With Valid Barcodes"] > 0.99
    assert np.isnan(summary["Reads Mapped to Gene: Unique+Multiple Gene"])  # STAR writes NoMulti
    stats = read_barcode_stats(fixture.runs["Gene"].out / "Solo.out" / "Barcodes.stats")
    assert stats.sum() == n_reads
    assert (stats["noUMIhomopolymer"], stats["noNinUMI"]) == (unusable["homopolymer"], unusable["N"])
    assert stats["yesOneWLmatchWithMM"] > 0.05 * n_reads  # 1 - 0.995**16 of barcodes carry an error


def test_multiqc_reads_star_and_starsolo(fixture: Fixture, tmp_path: Path) -> None:
    """MultiQC's STAR module parses the run's Log.final.out under the sample's name, and
    STARsolo's statistics come through as a table of their own."""
    out = fixture.runs["Gene"].out
    starsolo = read_solo_summary(out / "Solo.out" / "Gene" / "Summary.csv")
    summary = pd.DataFrame({column: [1.0] for column in HEADLINE}, index=pd.Index(["f"], name="sample"))
    write_multiqc_report(
        multiqc_sections(summary, starsolo={"f": starsolo}),
        star_logs={"f": out / "Log.final.out"},
        report=tmp_path / "multiqc" / "multiqc_report.html",
        data=tmp_path / "multiqc" / "multiqc_data",
    )
    star = pd.read_csv(tmp_path / "multiqc" / "multiqc_data" / "multiqc_star.txt", sep="\t", index_col="Sample")
    lines = [line.split(" |\t") for line in (out / "Log.final.out").read_text().splitlines() if " |\t" in line]
    log = {name.strip(): value.strip() for name, value in lines}
    assert list(star.index) == ["f"]
    assert star.loc["f", "uniquely_mapped_percent"] == float(log["Uniquely mapped reads %"].rstrip("%"))
    assert star.loc["f", "total_reads"] == starsolo["Number of Reads"] // 1
    table = pd.read_csv(
        tmp_path / "multiqc" / "multiqc_data" / "multiqc_starsolo_summary_table.txt", sep="\t", index_col="Sample"
    )
    assert table.loc["f", "Reads With Valid Barcodes"] == pytest.approx(starsolo["Reads With Valid Barcodes"])
    assert {path.name for path in (tmp_path / "multiqc").iterdir()} == {"multiqc_report.html", "multiqc_data"}


def test_read_solo_matrix(fixture: Fixture) -> None:
    """read_counts refuses STARsolo's folder (uncompressed features.tsv); read_solo_matrix reads it."""
    with pytest.raises(InputError, match=r"matrix\.mtx\.gz"):
        read_counts(fixture.runs["Gene"].matrix())
    adata = read_solo_matrix(fixture.runs["Gene"].matrix())
    genes = [*fixture.genome.genes, *fixture.genome.twins]
    assert adata.var["gene_ids"].tolist() == [gene.gene_id for gene in genes]
    assert adata.var_names.tolist() == [gene.name for gene in genes]
    assert adata.X.dtype == np.float32


def test_commands() -> None:
    assert sa_index_bases(455_000) == 8
    assert sa_index_bases(3_100_000_000) == 14
    genome = genome_generate_command(
        fasta=Path("g.fa"), gtf=Path("g.gtf"), index_dir=Path("idx"), threads=4, genome_length=10**6
    )
    assert "--sjdbOverhang" not in genome
    assert genome[genome.index("--genomeSAindexNbases") + 1] == "8"  # log2(1e6)/2 - 1 = 8.97
    common = {"index_dir": Path("idx"), "out_prefix": "o/", "threads": 1, "tmp_dir": Path("t"), "whitelist": None}
    five = solo_command(fastq_1=[Path("a_R1.fq")], fastq_2=[Path("a_R2.fq")], chemistry=chemistry("10x5p"), **common)
    assert five[five.index("--soloStrand") + 1] == "Reverse"
    assert "--readFilesCommand" not in five
    assert five[five.index("--soloCBwhitelist") + 1] == "None"
    assert five[five.index("--soloUMIlen") + 1] == "10"
    lanes = solo_command(
        fastq_1=[Path("L1_R1.fq.gz"), Path("L2_R1.fq.gz")],
        fastq_2=[Path("L1_R2.fq.gz"), Path("L2_R2.fq.gz")],
        chemistry=chemistry("dropseq"),
        **common,
    )
    reads_in = lanes.index("--readFilesIn")
    assert lanes[reads_in + 1 : reads_in + 3] == ["L1_R2.fq.gz,L2_R2.fq.gz", "L1_R1.fq.gz,L2_R1.fq.gz"]
    assert lanes[lanes.index("--readFilesCommand") + 1 : lanes.index("--readFilesCommand") + 3] == ["gzip", "-cdf"]
    complex_layout = chemistry("custom", custom={"cb_position": ["0_0_0_7", "0_26_0_33"], "umi_position": "0_34_0_41"})
    assert complex_layout == Chemistry(
        "custom",
        "CB_UMI_Complex",
        cb_start=0,
        cb_length=16,
        umi_start=0,
        umi_length=8,
        cb_positions=("0_0_0_7", "0_26_0_33"),
        umi_position="0_34_0_41",
    )
    assert complex_layout.barcode_read_length == 42
    indrop = solo_command(
        fastq_1=[Path("r1.fq")],
        fastq_2=[Path("r2.fq")],
        chemistry=complex_layout,
        **{**common, "whitelist": [Path("w1.txt"), Path("w2.txt")]},
    )
    assert indrop[indrop.index("--soloCBposition") + 1 : indrop.index("--soloCBposition") + 3] == list(
        complex_layout.cb_positions
    )
    assert indrop[indrop.index("--soloCBwhitelist") + 1 : indrop.index("--soloCBwhitelist") + 3] == ["w1.txt", "w2.txt"]
    simple = chemistry("custom", custom={"cb_start": 1, "cb_length": 12, "umi_start": 13, "umi_length": 9})
    assert (simple.solo_type, simple.barcode_read_length) == ("CB_UMI_Simple", 21)


def _fastq_records(path: Path) -> list[list[bytes]]:
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    return [lines[i : i + 4] for i in range(0, len(lines), 4)]


def _write_records(path: Path, records: list[list[bytes]]) -> Path:
    path.write_bytes(gzip.compress(b"".join(b"".join(record) for record in records), compresslevel=1))
    return path


@pytest.fixture(scope="module")
def small_pair(fixture: Fixture) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """The first 2,000 read pairs of lane 1."""
    return (
        _fastq_records(fixture.planted.fastq_1[0])[:2000],
        _fastq_records(fixture.planted.fastq_2[0])[:2000],
    )


def test_good_inputs_pass(fixture: Fixture) -> None:
    planted = fixture.planted
    checks.check_fastq_pairs(list(planted.fastq_1), list(planted.fastq_2), chemistry=V3)
    counts = checks.check_read_counts(list(planted.fastq_1), list(planted.fastq_2))
    assert sum(counts) == planted.truth["reads"].sum() + sum(planted.unusable_umi_reads.values())
    for path in planted.fastq_1:
        checks.gzip_intact(path)
    # 1 - 0.995**16 of barcodes carry an error: about 92% match exactly
    assert checks.check_whitelist(list(planted.fastq_1), planted.whitelist, chemistry=V3) > 0.9
    fasta_gz = fixture.root / "genome.fa.gz"
    fasta_gz.write_bytes(gzip.compress(fixture.fasta.read_bytes()))
    assert checks.check_reference(fasta_gz, fixture.gtf) == fixture.genome.length
    assert checks.star_failure((fixture.runs["Gene"].out / "Log.out").read_text()) is None


def test_read_names_differ(fixture: Fixture, small_pair, tmp_path: Path) -> None:
    reads_1, reads_2 = small_pair
    renamed = [*reads_1[:10], [b"@OTHER:1 1:N:0\n", *reads_1[10][1:]], *reads_1[11:]]
    fastq_1 = _write_records(tmp_path / "R1.fastq.gz", renamed)
    fastq_2 = _write_records(tmp_path / "R2.fastq.gz", reads_2)
    with pytest.raises(InputError, match=r"read 11 is named 'OTHER:1' but read 11 of .* are not mates") as error:
        checks.check_fastq_pairs([fastq_1], [fastq_2], chemistry=V3)
    assert error.value.path == str(fastq_1)


def test_lanes_must_pair_up(fixture: Fixture) -> None:
    with pytest.raises(InputError, match=r"2 read-1 file.* but 1 read-2 file"):
        checks.check_fastq_pairs(list(fixture.planted.fastq_1), list(fixture.planted.fastq_2[:1]), chemistry=V3)


def test_different_read_counts(fixture: Fixture, small_pair, tmp_path: Path) -> None:
    """Fewer barcode reads: our checks say so, and so does STAR, whose message we translate.

    (More barcode reads than cDNA reads, STAR ignores silently: only the checks catch it.)
    """
    reads_1, reads_2 = small_pair
    fastq_1 = _write_records(tmp_path / "R1.fastq.gz", reads_1[:1500])
    fastq_2 = _write_records(tmp_path / "R2.fastq.gz", reads_2)
    with pytest.raises(InputError, match="ends after 1500 reads, before its mate file") as error:
        checks.check_fastq_pairs([fastq_1], [fastq_2], chemistry=V3)
    assert error.value.path == str(fastq_1)
    with pytest.raises(InputError, match=r"holds 1500 reads but its read-2 file .* holds 2000") as error:
        checks.check_read_counts([fastq_1], [fastq_2])
    assert error.value.path == str(fastq_1)
    shorter_2 = _write_records(tmp_path / "R2_short.fastq.gz", reads_2[:1500])
    full_1 = _write_records(tmp_path / "R1_full.fastq.gz", reads_1)
    with pytest.raises(InputError, match=r"holds 2000 reads but its read-2 file .* holds 1500"):
        checks.check_read_counts([full_1], [shorter_2])  # STAR would stop at 1500 reads without a word
    out = tmp_path / "solo"
    out.mkdir()
    command = solo_command(
        index_dir=fixture.index,
        fastq_1=[fastq_1],
        fastq_2=[fastq_2],
        chemistry=V3,
        whitelist=fixture.planted.whitelist,
        out_prefix=f"{out}/",
        threads=1,
        tmp_dir=out / "tmp",
    )
    result = _star(command)
    assert result.returncode != 0
    first_unpaired = reads_2[1500][0].split()[0][1:].decode()
    assert checks.star_failure((out / "Log.out").read_text()) == (
        f"STAR stopped at read {first_unpaired!r}: the read-1 (barcode) files hold fewer reads than the read-2 "
        "(cDNA) files, or a read-1 file is truncated"
    )


def test_truncated_gzip(fixture: Fixture, tmp_path: Path) -> None:
    data = fixture.planted.fastq_2[0].read_bytes()
    truncated = tmp_path / "R2.fastq.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated gzip") as error:
        checks.gzip_intact(truncated)
    assert error.value.path == str(truncated)
    with pytest.raises(InputError, match="truncated gzip"):
        checks.fastq_read_count(truncated)


def test_read_1_shorter_than_barcode_and_umi(small_pair, tmp_path: Path) -> None:
    reads_1, reads_2 = small_pair
    cut = [[name, sequence[:20] + b"\n", plus, quality[:20] + b"\n"] for name, sequence, plus, quality in reads_1]
    fastq_1 = _write_records(tmp_path / "R1.fastq.gz", cut)
    fastq_2 = _write_records(tmp_path / "R2.fastq.gz", reads_2)
    with pytest.raises(InputError, match="has 20 bases, fewer than the 28 of chemistry '10xv3'") as error:
        checks.check_fastq_pairs([fastq_1], [fastq_2], chemistry=V3)
    assert error.value.path == str(fastq_1)


def test_unknown_chemistry() -> None:
    with pytest.raises(
        InputError, match="unknown chemistry '10xv9'; known: 10xv2, 10xv3, 10xv4, 10x5p, dropseq, custom"
    ):
        chemistry("10xv9")
    with pytest.raises(InputError, match="missing cb_length"):
        chemistry("custom", custom={"cb_start": 1, "umi_start": 17, "umi_length": 12})
    with pytest.raises(InputError, match="not STAR's"):
        chemistry("custom", custom={"cb_position": ["0_0_7"], "umi_position": "0_8_0_15"})


def test_whitelist_of_another_chemistry(fixture: Fixture, tmp_path: Path) -> None:
    decoys = sorted(set(fixture.planted.whitelist.read_text().split()) - set(fixture.planted.barcodes))
    other = tmp_path / "other_whitelist.txt.gz"
    other.write_bytes(gzip.compress("\n".join(decoys).encode()))
    fastq_1 = list(fixture.planted.fastq_1)
    assert checks.whitelist_match_rate(fastq_1, other, chemistry=V3, n_reads=5000) == 0
    with pytest.raises(InputError, match=r"matches 0.0% of barcodes .*wrong chemistry or whitelist\?") as error:
        checks.check_whitelist(fastq_1, other, chemistry=V3, n_reads=5000)
    assert error.value.path == str(fastq_1[0])


def test_gtf_chromosome_not_in_fasta(fixture: Fixture, tmp_path: Path) -> None:
    gtf = tmp_path / "genes.gtf"
    gtf.write_text(fixture.gtf.read_text().replace("chr3\t", "3\t").replace("chr2\t", "2\t"))
    with pytest.raises(InputError, match=r"2 of the GTF's 3 chromosomes are not in the FASTA .*\('2', '3'") as error:
        checks.check_reference(fixture.fasta, gtf)
    assert error.value.path == str(gtf)


def test_star_failure_other_errors() -> None:
    """Messages as STAR 2.7.10b writes them to Log.out."""
    missing = (
        "EXITING: because of fatal INPUT file error: could not open read file: missing.fq\n"
        "SOLUTION: check that this file exists and has read permision.\n\n"
        "Dec 01 06:19:45 ...... FATAL ERROR, exiting\n"
    )
    assert checks.star_failure(missing) == (
        "STAR failed: fatal INPUT file error: could not open read file: missing.fq; "
        "STAR suggests: check that this file exists and has read permision."
    )
    cut = "EXITING because of FATAL ERROR in reads input: quality string length is not equal to sequence length\n"
    assert checks.star_failure(cut + "@SYN:7 2:N:0\nACGT\n\nSOLUTION: fix your fastq file\n") == (
        "STAR stopped at read 'SYN:7': a FASTQ record is cut short (a truncated or malformed file?)"
    )


@pytest.mark.parametrize("strand", ["Reverse", "Forward"])
def test_10x5p_read_2_is_antisense(fixture: Fixture, tmp_path: Path, strand: str) -> None:
    """10x 5' read 2 (antisense) is counted with --soloStrand Reverse, as chemistry('10x5p') sets; Forward loses it."""
    planted = generate_fastq.generate_fastqs(
        fixture.genome, out_dir=tmp_path / "fastq", n_cells=10, chemistry="10x5p", reads_per_cell=600, seed=5
    )
    five_prime = chemistry("10x5p")
    assert five_prime.strand == "Reverse"
    used = five_prime if strand == "Reverse" else dataclasses.replace(five_prime, strand="Forward")
    out = tmp_path / "solo"
    out.mkdir()
    command = solo_command(
        index_dir=fixture.index,
        fastq_1=list(planted.fastq_1),
        fastq_2=list(planted.fastq_2),
        chemistry=used,
        whitelist=planted.whitelist,
        out_prefix=f"{out}/",
        threads=2,
        tmp_dir=out / "tmp",
    )
    assert _star(command).returncode == 0
    counted = read_solo_matrix(out / "Solo.out" / "Gene" / "raw").X.sum()
    twinned = {twin.gene_id.removesuffix("T") for twin in fixture.genome.twins}
    truth = planted.truth
    exonic = (~truth["intronic"] & ~truth["gene"].isin(twinned)).sum()
    if strand == "Reverse":
        assert counted == pytest.approx(exonic, rel=0.02)
    else:
        assert counted < 0.01 * exonic


def test_gzip_members_and_corruption(small_pair, tmp_path: Path) -> None:
    """Concatenated gzip members (bgzip, cat of lanes) are read whole; a flipped byte is corrupt."""
    reads_1, _ = small_pair
    members = tmp_path / "members.fastq.gz"
    members.write_bytes(
        b"".join(gzip.compress(b"".join(b"".join(r) for r in part)) for part in (reads_1[:700], reads_1[700:]))
    )
    assert checks.fastq_read_count(members) == len(reads_1)
    plain = tmp_path / "plain.fastq"
    plain.write_bytes(gzip.decompress(members.read_bytes()))
    assert checks.fastq_read_count(plain) == len(reads_1)
    checks.gzip_intact(plain)
    corrupt = bytearray(members.read_bytes())
    corrupt[len(corrupt) // 3] ^= 0xFF
    (tmp_path / "corrupt.fastq.gz").write_bytes(bytes(corrupt))
    with pytest.raises(InputError, match="corrupt gzip"):
        checks.gzip_intact(tmp_path / "corrupt.fastq.gz")


def test_check_reference_reads_fasta_layouts(tmp_path: Path) -> None:
    """Windows line ends, a last line without newline, descriptions after the name; headers only -> error."""
    fasta, gtf = tmp_path / "g.fa", tmp_path / "g.gtf"
    fasta.write_bytes(b">1 dna:chromosome\r\nACGTACGTAC\r\nGT\r\n>MT\nACG")
    gtf.write_text('1\tx\texon\t1\t5\t.\t+\t.\tgene_id "A";\nMT\tx\texon\t1\t3\t.\t+\t.\tgene_id "B";\n')
    assert checks.check_reference(fasta, gtf) == 15
    fasta.write_bytes(b"ACGT\n>1\nACGT\n")
    with pytest.raises(InputError, match="not a FASTA file"):
        checks.check_reference(fasta, gtf)
    fasta.write_bytes(b">1\nACGT\n>MT\nA\n")
    gtf.write_text('1\tx\tgene\t1\t5\t.\t+\t.\tgene_id "A";\n')
    with pytest.raises(InputError, match="no 'exon' lines"):
        checks.check_reference(fasta, gtf)


def _align(fixture: Fixture, out_dir: Path, fastq_2: list[Path] | None = None) -> None:
    planted = fixture.planted
    align_sample(
        index_dir=fixture.index,
        fastq_1=list(planted.fastq_1),
        fastq_2=fastq_2 or list(planted.fastq_2),
        chemistry=V3,
        whitelist=planted.whitelist,
        out_dir=out_dir,
        threads=2,
        options=AlignOptions(),
    )


def test_align_sample_moves_a_finished_run_into_place(fixture: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "star"
    _align(fixture, out)
    assert {"Aligned.sortedByCoord.out.bam", "Log.final.out", "Solo.out"} <= {path.name for path in out.iterdir()}
    assert (out / "Solo.out" / "Gene" / "raw" / "features.tsv").is_file()
    assert not (out / "_STARtmp").exists()
    assert [path.name for path in tmp_path.iterdir()] == ["star"]


def test_align_sample_leaves_nothing_when_a_cdna_file_is_short(fixture: Fixture, tmp_path: Path) -> None:
    """STAR reads a cDNA lane with fewer reads (or a gzip cut between records) without a word:
    the read counts, checked beside it, fail the run, and no output is left."""
    reads = _fastq_records(fixture.planted.fastq_2[1])
    short = _write_records(tmp_path / "L002_R2.fastq.gz", reads[: len(reads) - 100])
    out = tmp_path / "star"
    with pytest.raises(InputError, match=r"holds \d+ reads but its read-2 file .* holds \d+"):
        _align(fixture, out, fastq_2=[fixture.planted.fastq_2[0], short])
    assert not out.exists()
    assert [path.name for path in tmp_path.iterdir()] == ["L002_R2.fastq.gz"]


def test_star_missing_is_one_clear_error(fixture: Fixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError, match="STAR is not installed: run with --sdm conda"):
        _align(fixture, tmp_path / "star")
    with pytest.raises(InputError, match="STAR is not installed"):
        build_index(fasta=fixture.fasta, gtf=fixture.gtf, index_dir=tmp_path / "index", threads=1)
    assert list(tmp_path.iterdir()) == []


def test_build_index_from_gzipped_reference(fixture: Fixture, tmp_path: Path) -> None:
    fasta, gtf = tmp_path / "genome.fa.gz", tmp_path / "genes.gtf.gz"
    fasta.write_bytes(gzip.compress(fixture.fasta.read_bytes()))
    gtf.write_bytes(gzip.compress(fixture.gtf.read_bytes()))
    index = tmp_path / "index"
    build_index(fasta=fasta, gtf=gtf, index_dir=index, threads=2)
    assert (index / "SA").is_file() and (index / "exonInfo.tab").is_file()
    assert not (index / "_STARtmp").exists() and not (index / "input").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["genes.gtf.gz", "genome.fa.gz", "index"]
