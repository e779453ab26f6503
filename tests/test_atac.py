"""scATAC on the 10x Multiome subset: fragments counted into peaks and tiles (checked against
a plain count), QC, and TF-IDF and LSI against muon.
"""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest
from conftest import MULTIOME
from scipy import sparse

from omicsprep import io
from omicsprep.atac.fragments import count_fragments
from omicsprep.atac.lsi import lsi, tfidf
from omicsprep.errors import InputError

FRAGMENTS = MULTIOME / "fragments.tsv.gz"


@pytest.fixture(scope="module")
def barcodes():
    return pd.Index(pd.read_csv(MULTIOME / "barcodes.tsv.gz", header=None)[0])


@pytest.fixture(scope="module")
def fragments(barcodes):
    with gzip.open(FRAGMENTS, "rt") as handle:
        rows = [line.split("\t")[:4] for line in handle if not line.startswith("#")]
    table = pd.DataFrame(rows, columns=["chrom", "start", "end", "barcode"]).astype({"start": int, "end": int})
    return table[table["barcode"].isin(barcodes)]


@pytest.fixture(scope="module")
def peak_counts(barcodes):
    return count_fragments(
        io.fragment_chunks(FRAGMENTS, chunk_rows=20_000), barcodes=barcodes, peaks=io.read_peaks(MULTIOME / "peaks.bed")
    )


def plain_count(fragments: pd.DataFrame, barcodes: pd.Index, intervals: list[tuple[str, int, int]]) -> np.ndarray:
    """Fragments of each cell overlapping each interval, one interval at a time."""
    counts = np.zeros((len(barcodes), len(intervals)))
    for j, (chrom, start, end) in enumerate(intervals):
        hits = fragments[(fragments["chrom"] == chrom) & (fragments["start"] < end) & (fragments["end"] > start)]
        cells, n = np.unique(barcodes.get_indexer(hits["barcode"]), return_counts=True)
        counts[cells, j] = n
    return counts


def intervals(adata) -> list[tuple[str, int, int]]:
    """The features' (chrom, start, end), from their names."""
    names = adata.var_names.str.extract(r"(.+):(\d+)-(\d+)").astype({1: int, 2: int})
    return list(names.itertuples(index=False, name=None))


def test_peak_counts_equal_a_plain_count(peak_counts, fragments, barcodes):
    peaks = io.read_peaks(MULTIOME / "peaks.bed")
    assert set(intervals(peak_counts)) == set(peaks.itertuples(index=False, name=None))
    expected = plain_count(fragments, barcodes, intervals(peak_counts))
    assert peak_counts.shape == (1000, 174)
    assert peak_counts.X.sum() > 4000
    np.testing.assert_array_equal(peak_counts.X.toarray(), expected)


def test_tile_counts_equal_a_plain_count(fragments, barcodes):
    tiles = count_fragments(io.fragment_chunks(FRAGMENTS, chunk_rows=30_000), barcodes=barcodes)  # 5 kb tiles
    assert tiles.uns["fragments"]["features"] == "tiles of 5000 bp"
    names = tiles.var_names.str.extract(r"(.+):(\d+)-(\d+)").astype({1: int, 2: int})
    assert (names[2] - names[1] == 5000).all()
    assert (names[1] % 5000 == 0).all()
    expected = plain_count(fragments, barcodes, list(names.itertuples(index=False, name=None)))
    np.testing.assert_array_equal(tiles.X.toarray(), expected)
    # Every fragment lies in one tile or spans two: tile counts sum to at least the fragments.
    assert fragments.shape[0] <= tiles.X.sum() <= 2 * fragments.shape[0]


def test_qc_metrics(peak_counts, fragments, barcodes):
    per_cell = fragments["barcode"].value_counts().reindex(barcodes, fill_value=0)
    np.testing.assert_array_equal(peak_counts.obs["n_fragments"], per_cell.to_numpy())
    length = fragments["end"] - fragments["start"]
    free = fragments[length < 147]["barcode"].value_counts().reindex(barcodes, fill_value=0)
    mono = fragments[(length >= 147) & (length <= 294)]["barcode"].value_counts().reindex(barcodes, fill_value=0)
    np.testing.assert_allclose(peak_counts.obs["nucleosome_signal"], mono / np.maximum(free, 1))
    # FRiP: a cell's fragments that overlap any peak (once, even if they touch two), over all its fragments.
    peaks = pd.read_csv(
        MULTIOME / "peaks.bed", sep="\t", header=None, usecols=[0, 1, 2], names=["chrom", "start", "end"]
    )
    in_peaks = np.zeros(len(fragments), dtype=bool)
    for chrom, start, end in peaks.itertuples(index=False, name=None):
        in_peaks |= ((fragments["chrom"] == chrom) & (fragments["start"] < end) & (fragments["end"] > start)).to_numpy()
    in_features = fragments[in_peaks]["barcode"].value_counts().reindex(barcodes, fill_value=0)
    assert 0 < in_features.sum() < len(fragments)
    np.testing.assert_allclose(peak_counts.obs["frac_in_features"], in_features / np.maximum(per_cell, 1), rtol=1e-12)
    assert peak_counts.uns["fragments"]["outside_cells"] > 0  # non-cell barcodes are counted apart
    assert peak_counts.uns["fragments"] == {"outside_cells": 120_000 - 8_140, "features": "peaks"}  # over 6 chunks
    assert "tss_enrichment" not in peak_counts.obs  # no TSS given
    assert peak_counts.obs["n_fragments"].dtype == np.int64 and peak_counts.X.dtype == np.float32


def test_a_fragment_at_a_chromosomes_first_base_is_in_order(fragments, barcodes):
    """Start 0 of the first chromosome is the earliest position there is, not one before the start."""
    rows = fragments.iloc[:100].assign(count=1)
    rows.iloc[0, rows.columns.get_loc("start")] = 0
    tiles = count_fragments([rows], barcodes=barcodes, tile_width=5000)
    assert tiles.X.sum() >= 100 and tiles.var_names[0] == f"{rows['chrom'].iloc[0]}:0-5000"
    one = count_fragments([fragments.iloc[:1].assign(count=1)], barcodes=barcodes, tile_width=5000)  # one fragment
    assert one.obs["n_fragments"].sum() == 1 and (one.X.sum(axis=0) == 1).all()  # in each tile it touches


def test_waiting_counts_merge_with_a_chunks_new_ones():
    """(feature, cell) keys still open after a chunk merge with the next chunk's: shared keys add up."""
    from omicsprep.atac.columns import _merged

    def merged(keys_a, counts_a, keys_b, counts_b):
        arrays = (np.asarray(values, dtype=np.int64) for values in (keys_a, counts_a, keys_b, counts_b))
        return [values.tolist() for values in _merged(*arrays, xp=np)]

    assert merged([5], [1], [3, 5, 7], [1, 1, 1]) == [[3, 5, 7], [1, 2, 1]]
    assert merged([3, 5, 7], [1, 1, 1], [5], [2]) == [[3, 5, 7], [1, 3, 1]]
    assert merged([2, 4, 6], [1, 1, 1], [4, 6, 8], [2, 2, 2]) == [[2, 4, 6, 8], [1, 3, 3, 2]]
    assert merged([4], [2], [], []) == merged([], [], [4], [2]) == [[4], [2]]


def test_peaks_may_touch_but_not_overlap_and_tiles_key_a_bounded_genome(fragments, barcodes, tmp_path):
    """Peaks are checked chromosome by chromosome (an overlap on the second is found; touching is
    no overlap), and 1 bp tiles key at most 127 chromosomes."""
    rows = fragments.iloc[:100].assign(count=1)
    touching = pd.DataFrame({"chrom": ["chr1", "chr1"], "start": [100, 200], "end": [200, 300]})
    assert count_fragments([rows], barcodes=barcodes, peaks=touching).n_vars == 2
    second = pd.DataFrame({"chrom": ["chr1", "chr2", "chr2"], "start": [100, 50, 100], "end": [200, 300, 150]})
    with pytest.raises(InputError, match=r"1 peaks overlap the previous one .e.g. after chr2:50-300."):
        count_fragments([rows], barcodes=barcodes, peaks=second)
    cell = barcodes[0]
    many = tmp_path / "fragments.tsv"
    for n_chromosomes in (127, 128):
        many.write_text("".join(f"c{i:03d}\t100\t110\t{cell}\t1\n" for i in range(n_chromosomes)))
        if n_chromosomes == 127:
            assert count_fragments(io.fragment_chunks(many), barcodes=barcodes, tile_width=1).n_vars == 127 * 10
            continue
        with pytest.raises(
            InputError,
            match=r"^fragments on 128 chromosomes or contigs: at most 127 with 1 bp tiles; use larger tiles or peaks$",
        ):
            count_fragments(io.fragment_chunks(many), barcodes=barcodes, tile_width=1)


def test_bad_inputs_name_their_first_case_and_the_limits(fragments, barcodes, tmp_path, monkeypatch):
    """Each check names the first offending fragment (not the chunk's first) and holds at its bounds."""
    from omicsprep.atac import fragments as module

    with pytest.raises(InputError, match=r"^cell barcodes repeat, e.g. 'A-1'$"):
        count_fragments([], barcodes=pd.Index(["A-1", "B-1", "A-1", "B-1"]))
    monkeypatch.setattr(module, "CELL_BITS", 3)
    module._check_barcodes(pd.Index([f"C{i}" for i in range(7)]))  # 7 < 2**3 cells can be keyed
    with pytest.raises(InputError, match=r"^8 cells: more than this count can key$"):
        module._check_barcodes(pd.Index([f"C{i}" for i in range(8)]))
    monkeypatch.undo()
    cell = barcodes[0]
    bad = tmp_path / "fragments.tsv"
    for second, example in (("300\t300", "chr1:300-300"), ("300\t4294967296", "chr1:300-4294967296")):
        bad.write_text(f"chr1\t100\t200\t{cell}\t1\nchr1\t{second}\t{cell}\t1\n")
        with pytest.raises(InputError, match=rf"1 fragments with bad coordinates, e.g. {example}$"):
            count_fragments(io.fragment_chunks(bad), barcodes=barcodes)
    sizes = {"chr1": 1000}
    bad.write_text(f"chr1\t100\t1000\t{cell}\t1\n")  # ends at the chromosome's last base
    assert count_fragments(io.fragment_chunks(bad), barcodes=barcodes, chrom_sizes=sizes).X.sum() == 1
    bad.write_text(f"chr1\t100\t900\t{cell}\t1\nchr1\t200\t1001\t{cell}\t1\n")
    with pytest.raises(InputError, match=r"1 fragments end past their chromosome, e.g. chr1:...-1001 \(chr1 is 1,000"):
        count_fragments(io.fragment_chunks(bad), barcodes=barcodes, chrom_sizes=sizes)
    for n_unknown, listed in ((5, "chrA, chrB, chrC, chrD, chrE$"), (6, "chrA, chrB, chrC, chrD, chrE ...$")):
        bad.write_text("".join(f"chr{name}\t100\t200\t{cell}\t1\n" for name in "ABCDEF"[:n_unknown]))
        with pytest.raises(
            InputError, match=rf"{n_unknown} fragments on chromosomes not in the genome's sizes: {listed}"
        ):
            count_fragments(io.fragment_chunks(bad), barcodes=barcodes, chrom_sizes=sizes)
    rows = fragments.iloc[:100].assign(count=1)
    bare_rows = rows.assign(chrom=rows["chrom"].str.removeprefix("chr"))
    peaks = pd.DataFrame({"chrom": [rows["chrom"].iloc[0]], "start": [0], "end": [10_000]})
    with pytest.raises(InputError, match=r"share none; they match without the 'chr' prefix"):
        count_fragments([bare_rows], barcodes=barcodes, peaks=peaks)
    with pytest.raises(InputError, match=r"\(chrZ\) share none$"):
        count_fragments([rows], barcodes=barcodes, peaks=peaks.assign(chrom="chrZ"))


def test_tfidf_and_lsi_agree_with_muon(peak_counts):
    from muon import atac

    ours, theirs = peak_counts.copy(), peak_counts.copy()
    tfidf(ours, backend="cpu")
    atac.pp.tfidf(theirs)
    np.testing.assert_allclose(ours.X.toarray(), sparse.csr_matrix(theirs.X).toarray(), rtol=1e-6, atol=1e-8)
    # In 12 cells, 14 peaks hold one fragment and 150 none: weighted as muon weighs them.
    few_ours, few_theirs = peak_counts[:12].copy(), peak_counts[:12].copy()
    assert (np.asarray(few_ours.X.sum(axis=0)).ravel() == 1).sum() == 14
    tfidf(few_ours, backend="cpu")
    with np.errstate(divide="ignore"):  # muon's weight of a peak without fragments
        atac.pp.tfidf(few_theirs)
    expected = np.nan_to_num(sparse.csr_matrix(few_theirs.X).toarray(), nan=0.0, posinf=0.0)
    np.testing.assert_allclose(few_ours.X.toarray(), expected, rtol=1e-6, atol=1e-8)
    lsi(ours, n_comps=10, max_depth_correlation=1.0, backend="cpu")
    atac.tl.lsi(theirs, n_comps=10)
    for k in range(5):  # the leading components, standardized as muon's, up to sign
        mine, its = ours.obsm["X_lsi"][:, k], theirs.obsm["X_lsi"][:, k]
        np.testing.assert_allclose(mine, np.sign(mine @ its) * its, rtol=0, atol=1e-3)  # muon: float32


def test_lsi_drops_components_that_track_depth(peak_counts):
    # Depth as lsi defines it: log1p of the cell's counts in the features.
    depth = np.log1p(np.asarray(peak_counts.X.sum(axis=1)).ravel())
    every, filtered = peak_counts.copy(), peak_counts.copy()
    for adata, limit in ((every, 1.0), (filtered, 0.9)):
        tfidf(adata, backend="cpu")
        lsi(adata, n_comps=10, max_depth_correlation=limit, backend="cpu")
    components = every.obsm["X_lsi"]
    assert components.shape == (1000, 10)
    correlation = np.array([np.corrcoef(components[:, k], depth)[0, 1] for k in range(10)])
    np.testing.assert_allclose(every.uns["lsi"]["depth_correlation"], correlation, rtol=1e-9)
    # On this sample the first component tracks depth (0.93) and no other does (|r| < 0.03).
    kept = np.abs(correlation) <= 0.9
    assert kept.tolist() == [False] + [True] * 9
    np.testing.assert_array_equal(filtered.uns["lsi"]["kept"], kept)
    np.testing.assert_allclose(filtered.uns["lsi"]["depth_correlation"], correlation, rtol=1e-9)
    np.testing.assert_allclose(filtered.obsm["X_lsi"], components[:, kept], rtol=1e-9, atol=1e-9)


def test_lsi_defaults_a_component_at_the_limit_depth_from_x_and_few_cells(peak_counts):
    """Without settings: 50 components, the one above 0.9 dropped; a component exactly at the
    limit kept; depth from X without a counts layer; no more components than cells less one."""
    default, at_limit = peak_counts.copy(), peak_counts.copy()
    for adata in (default, at_limit):
        tfidf(adata, backend="cpu")
    lsi(default, backend="cpu")
    correlation = default.uns["lsi"]["depth_correlation"]
    assert correlation.size == 50
    assert default.uns["lsi"]["kept"].tolist() == [False] + [True] * 49  # the first tracks depth (0.93)
    lsi(at_limit, max_depth_correlation=float(abs(correlation[0])), backend="cpu")
    assert at_limit.uns["lsi"]["kept"].all()
    raw = peak_counts.copy()
    assert "counts" not in raw.layers
    lsi(raw, n_comps=10, max_depth_correlation=1.0, backend="cpu")
    depth = np.log1p(np.asarray(raw.X.sum(axis=1)).ravel())
    expected = [np.corrcoef(raw.obsm["X_lsi"][:, k], depth)[0, 1] for k in range(10)]
    np.testing.assert_allclose(raw.uns["lsi"]["depth_correlation"], expected, rtol=1e-9)
    few = peak_counts[:12].copy()
    lsi(few, n_comps=50, max_depth_correlation=1.0, backend="cpu")
    assert few.obsm["X_lsi"].shape == (12, 11)


def test_a_component_against_depth_is_dropped_as_one_with_it(peak_counts, monkeypatch):
    # An SVD's components have no sign of their own: the one that tracks depth may come out
    # negated (correlation -0.93 here), and is dropped all the same.
    from scipy.sparse import linalg

    solver = linalg.svds

    def negated(*args, **kwargs):
        left, singular, right = solver(*args, **kwargs)
        return -left, singular, -right

    monkeypatch.setattr(linalg, "svds", negated)
    adata = peak_counts.copy()
    tfidf(adata, backend="cpu")
    lsi(adata, n_comps=10, max_depth_correlation=0.9, backend="cpu")
    correlation = adata.uns["lsi"]["depth_correlation"]
    assert correlation[0] < -0.9 and (np.abs(correlation[1:]) < 0.1).all()
    assert adata.uns["lsi"]["kept"].tolist() == [False] + [True] * 9
    assert adata.obsm["X_lsi"].shape == (1000, 9)


def test_bad_fragments_are_one_clear_error(tmp_path, barcodes):
    bad = tmp_path / "fragments.tsv"
    bad.write_text("chr1\t200\t100\tAAACAGCCAGCATGTC-1\t1\n")
    with pytest.raises(InputError, match=rf"^file '{bad}': 1 fragments with bad coordinates, e.g. chr1:200-100"):
        count_fragments(io.fragment_chunks(bad), barcodes=barcodes, source=bad)
    overlapping = pd.DataFrame({"chrom": ["chr1", "chr1"], "start": [100, 150], "end": [200, 300]})
    with pytest.raises(InputError, match=r"1 peaks overlap the previous one .e.g. after chr1:100-200."):
        count_fragments(io.fragment_chunks(bad), barcodes=barcodes, peaks=overlapping)
    sizes = tmp_path / "genome.fa.fai"
    sizes.write_text("chr1\t248956422\t112\t60\t61\nchr4\t190214555\t253105752\t60\t61\n")
    with pytest.raises(InputError, match=r"fragments on chromosomes not in the genome's sizes: chr2$"):
        count_fragments(io.fragment_chunks(FRAGMENTS), barcodes=barcodes, chrom_sizes=io.read_chrom_sizes(sizes))
    bad.write_text("chr1\t248956400\t248956500\tAAACAGCCAGCATGTC-1\t1\n")
    with pytest.raises(
        InputError,
        match=r"1 fragments end past their chromosome, e.g. chr1:...-248956500 "
        r"\(chr1 is 248,956,422 bp\)",
    ):
        count_fragments(io.fragment_chunks(bad), barcodes=barcodes, chrom_sizes=io.read_chrom_sizes(sizes))
    unsorted_message = (
        r"not sorted by chromosome and start as 10x writes them \(e.g. chr1:(101|701) comes after a later position or "
        r"another chromosome\); sort them first \(sort -k1,1 -k2,2n\)$"
    )
    for unsorted in (
        "chr1\t500\t600\tA-1\t1\nchr1\t101\t200\tA-1\t1\n",
        "chr1\t500\t600\tA-1\t1\nchr2\t100\t200\tA-1\t1\nchr1\t701\t800\tA-1\t1\n",
    ):
        bad.write_text(unsorted)
        with pytest.raises(InputError, match=unsorted_message):
            count_fragments(io.fragment_chunks(bad), barcodes=barcodes)
        rows = next(io.fragment_chunks(bad))  # and when the chunks are out of order
        with pytest.raises(InputError, match=unsorted_message):
            count_fragments([rows.iloc[:-1], rows.iloc[-1:]], barcodes=barcodes)
    bad.write_text("chr1\tten\t100\tAAACAGCCAGCATGTC-1\t1\n")
    with pytest.raises(InputError, match=rf"file '{bad}': cannot be read as 10x fragments"):
        count_fragments(io.fragment_chunks(bad), barcodes=barcodes)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_fragments_that_miss_the_cells_or_the_peaks_name_the_mismatch(barcodes, backend, caplog):
    """Peaks without the fragments' 'chr' prefix, or cells whose barcodes end in another
    suffix, stop the count naming the cause, not LSI later for want of features.
    """
    peaks = io.read_peaks(MULTIOME / "peaks.bed")
    with caplog.at_level("INFO", logger="omicsprep"):
        count_fragments(io.fragment_chunks(FRAGMENTS, backend=backend), barcodes=barcodes, peaks=peaks, backend=backend)
    assert any(
        message.startswith("fragments: 8,140 of 120,000 fragments in the cells; 937 of 1,000 cells with fragments; ")
        for message in caplog.messages
    )
    bare = peaks.assign(chrom=peaks["chrom"].str.removeprefix("chr"))
    with pytest.raises(
        InputError,
        match=rf"^file '{FRAGMENTS}': the fragments' chromosomes \(chr1, chr2, chr4\) and the peaks' \(1, 10, 11, "
        r"\.\.\.\) share none; they match without the 'chr' prefix",
    ):
        count_fragments(
            io.fragment_chunks(FRAGMENTS, backend=backend),
            barcodes=barcodes,
            peaks=bare,
            source=FRAGMENTS,
            backend=backend,
        )
    other_well = barcodes.str.replace("-1", "-2")
    with pytest.raises(
        InputError,
        match=r"none of the 120,000 fragments is of one of the 1,000 cells: barcodes like 'TTATCCGTCTTCAATC-1' against "
        r"the cells' 'AAACAGCCAGCATGTC-2'; they match without the '-<number>' suffix",
    ):
        count_fragments(io.fragment_chunks(FRAGMENTS, backend=backend), barcodes=other_well, backend=backend)
    unrelated = pd.Index([f"CELL{i}" for i in range(len(barcodes))])
    with pytest.raises(InputError, match=r"against the cells' 'CELL0'$"):
        count_fragments(io.fragment_chunks(FRAGMENTS, backend=backend), barcodes=unrelated, backend=backend)


def test_counts_within_the_genome_are_unchanged_by_its_check(tmp_path, peak_counts, barcodes):
    sizes = tmp_path / "chrom.sizes"
    sizes.write_text("chr1\t248956422\nchr2\t242193529\nchr4\t190214555\n")
    checked = count_fragments(
        io.fragment_chunks(FRAGMENTS, chunk_rows=20_000),
        barcodes=barcodes,
        peaks=io.read_peaks(MULTIOME / "peaks.bed"),
        chrom_sizes=io.read_chrom_sizes(sizes),
    )
    assert (checked.X != peak_counts.X).nnz == 0


def test_tss_enrichment_equals_muons(tmp_path, barcodes):
    import gzip
    import shutil

    import muon
    import pysam

    plain = tmp_path / "fragments.tsv"
    with gzip.open(FRAGMENTS, "rb") as source, plain.open("wb") as target:
        shutil.copyfileobj(source, target)
    indexed = pysam.tabix_index(str(plain), preset="bed", force=True)  # muon reads fragments through tabix
    tss = io.read_tss(MULTIOME / "genes.bed")
    ours = count_fragments(io.fragment_chunks(FRAGMENTS, chunk_rows=20_000), barcodes=barcodes, tss=tss)
    reference = ours.copy()
    reference.uns["files"] = {"fragments": indexed}
    genes = io.read_peaks(MULTIOME / "genes.bed").rename(
        columns={"chrom": "Chromosome", "start": "Start", "end": "End"}
    )
    muon.atac.tl.tss_enrichment(reference, features=genes, n_tss=len(genes), return_tss=False)
    assert (ours.obs["tss_enrichment"] > 0).sum() > 50
    np.testing.assert_allclose(ours.obs["tss_enrichment"], reference.obs["tss_score"], rtol=1e-9)


def test_a_tss_window_takes_fragments_that_start_before_its_last_base():
    """As muon fetches them: a fragment starting at TSS + 1 kb - 1 covers the window's last two
    bases (flank), one starting at TSS + 1 kb is not the window's."""
    from omicsprep.atac.features import _tss_coverage, position_keys

    windows = position_keys(np.array([0]), np.array([4000]))  # the TSS at 5,000, its window from 4,000
    for start, flank in ((5999, [2]), (6000, [])):
        code, starts, ends = np.array([0]), np.array([start]), np.array([6100])
        _, center, covered = _tss_coverage(code, starts, ends, windows, xp=np)
        assert covered.tolist() == flank and center.tolist() == [0] * len(flank)


def test_tss_near_a_chromosome_start_and_many_contigs(tmp_path):
    """TSS windows that start before bp 0 (chrM genes), and 300 contigs counted into
    tiles: both checked against a plain per-fragment count.
    """
    rng = np.random.default_rng(1)
    cells = pd.Index(["A-1", "B-1"])
    rows = [
        (f"contig{i}", s, s + int(rng.integers(50, 400)), cells[i % 2], int(rng.integers(1, 4)))
        for i in range(300)
        for s in rng.integers(0, 20_000, 5)
    ]
    rows += [
        (chrom, s, s + int(rng.integers(50, 400)), cells[int(rng.integers(2))], int(rng.integers(1, 4)))
        for chrom in ("chrM", "chr1")
        for s in rng.integers(0, 7_000, 400)
    ]
    frame = pd.DataFrame(rows, columns=["chrom", "start", "end", "barcode", "count"])
    path = tmp_path / "fragments.tsv"
    frame.sort_values(["chrom", "start"]).to_csv(path, sep="\t", header=False, index=False)
    tss = pd.DataFrame({"chrom": ["chrM", "chr1", "chr1"], "position": [600, 5000, 5500]})
    counted = count_fragments(io.fragment_chunks(path, chunk_rows=1000), barcodes=cells, tile_width=5000, tss=tss)
    names = counted.var_names.str.extract(r"(.+):(\d+)-(\d+)").astype({1: int, 2: int})
    expected = plain_count(frame, cells, list(names.itertuples(index=False, name=None)))
    np.testing.assert_array_equal(counted.X.toarray(), expected)
    assert counted.n_vars > 300
    pileup = np.zeros((2, 2001))  # muon's definition, fragment by fragment
    for row in frame.itertuples():
        for site in tss[tss["chrom"] == row.chrom]["position"]:
            if row.start < site + 1000 and row.end > site - 1000:
                low, high = max(row.start - (site - 1000), 0), min(row.end - (site - 1000), 2001)
                pileup[cells.get_loc(row.barcode), low:high] += row.count
    flank = np.hstack([pileup[:, :100], pileup[:, -100:]]).mean(axis=1)
    np.testing.assert_allclose(counted.obs["tss_enrichment"], pileup[:, 500:1501].mean(axis=1) / flank)


def test_compressed_fragments_and_empty_peaks(tmp_path, peak_counts, barcodes):
    """bzip2 and bgzip files read as the gzip one; a peak file without peaks counts nothing."""
    import bz2

    import pysam

    with gzip.open(FRAGMENTS, "rb") as handle:
        text = handle.read()
    (tmp_path / "fragments.tsv").write_bytes(text)
    (tmp_path / "fragments.tsv.bz2").write_bytes(bz2.compress(text))
    pysam.tabix_compress(str(tmp_path / "fragments.tsv"), str(tmp_path / "fragments.tsv.gz"))  # bgzip: many members
    peaks = io.read_peaks(MULTIOME / "peaks.bed")
    for name in ("fragments.tsv.bz2", "fragments.tsv.gz"):
        counted = count_fragments(
            io.fragment_chunks(tmp_path / name, chunk_rows=20_000), barcodes=barcodes, peaks=peaks
        )
        assert (counted.X != peak_counts.X).nnz == 0
    none = count_fragments(io.fragment_chunks(FRAGMENTS), barcodes=barcodes, peaks=peaks.iloc[:0])
    assert none.shape == (len(barcodes), 0)
    assert (none.obs["n_fragments"] == peak_counts.obs["n_fragments"]).all()


def test_tfidf_and_lsi_of_row_blocks_equal_one_matrix_s(peak_counts):
    # Beyond 32-bit indices the GPU holds the counts in row blocks (omicsprep.backend.to_device):
    # the TF-IDF is made block by block and the SVD multiplies block by block. The same code
    # runs on SciPy blocks here.
    from omicsprep.backend import blocks_of, is_dask_array, row_blocks

    whole, blocked = peak_counts.copy(), peak_counts.copy()
    rows = peak_counts.X.tocsr()
    blocked.X = row_blocks([rows[start:stop] for start, stop in ((0, 300), (300, 301), (301, 1000))])
    for adata in (whole, blocked):
        tfidf(adata, backend="cpu")
        lsi(adata, n_comps=10, max_depth_correlation=0.9, backend="cpu")
    assert is_dask_array(blocked.X) and is_dask_array(blocked.layers["counts"])
    assert abs(sparse.vstack(list(blocks_of(blocked.X))) - whole.X).max() < 1e-12
    np.testing.assert_array_equal(blocked.uns["lsi"]["kept"], whole.uns["lsi"]["kept"])
    correlations = (np.abs(adata.uns["lsi"]["depth_correlation"]) for adata in (blocked, whole))  # up to sign
    np.testing.assert_allclose(*correlations, atol=1e-9)
    for k in range(whole.obsm["X_lsi"].shape[1]):  # up to sign
        assert abs(np.corrcoef(blocked.obsm["X_lsi"][:, k], whole.obsm["X_lsi"][:, k])[0, 1]) > 1 - 1e-9


def test_64_bit_indices_give_the_same_atac_results_on_the_cpu(peak_counts):
    # Beyond 2^31 entries SciPy holds the counts with 64-bit indices (the GPU takes them in row
    # blocks): rule atac's chain gives what it gives with 32-bit ones.
    from dataclasses import replace

    from conftest import embedding_options, shipped_config, widened

    from omicsprep.atac.pipeline import run_atac
    from omicsprep.options import AtacOptions, from_config

    config = shipped_config()
    options = replace(from_config(AtacOptions, config["atac"]), min_cells_per_feature=1)
    wide, narrow = peak_counts.copy(), peak_counts.copy()
    wide.X = widened(wide.X)
    assert peak_counts.X.indptr.dtype == np.int32
    for adata in (wide, narrow):
        run_atac(adata, options=options, embedding_options=embedding_options(config), seed=0, backend="cpu")
    assert abs(wide.X - narrow.X).max() < 1e-12
    np.testing.assert_allclose(np.abs(wide.obsm["X_lsi"]), np.abs(narrow.obsm["X_lsi"]), atol=1e-6)
    assert wide.obs.filter(like="leiden").equals(narrow.obs.filter(like="leiden"))


def test_cells_per_feature_are_counted_a_chunk_of_entries_at_a_time(peak_counts, monkeypatch):
    # Rule atac's feature filter, without copying the matrix: in chunks of 1,000 entries here,
    # across CSC (as counted), CSR and dense, with stored zeros and a negative value among them.
    from omicsprep.atac import pipeline

    monkeypatch.setattr(pipeline, "FEATURE_CHUNK_ENTRIES", 1_000)
    matrix = peak_counts.X.copy()
    matrix.data[1::7] = 0  # the first entry kept above 0: a chunk loop that skips it undercounts
    matrix.data[5] = -1
    expected = np.asarray((matrix > 0).sum(axis=0)).ravel()
    assert matrix.nnz > 3_000 and (expected < np.diff(peak_counts.X.indptr)).any()
    for form in (matrix, matrix.tocsr(), matrix.tocoo(), matrix.toarray()):
        np.testing.assert_array_equal(pipeline._cells_per_feature(form), expected)


def test_run_atac_passes_its_settings_on(peak_counts):
    """run_atac keeps the features seen in min_cells_per_feature cells or more (two are enough, one
    is too few, named), its LSI is the one its settings ask for, and its provenance names the
    rule, the backend, the settings with the seed, and the steps."""
    import json
    from dataclasses import asdict, replace

    from conftest import embedding_options, shipped_config

    from omicsprep.atac.pipeline import _cells_per_feature, run_atac
    from omicsprep.options import AtacOptions, LsiOptions, from_config

    config = shipped_config()
    seen = np.sort(_cells_per_feature(peak_counts.X))
    shipped = from_config(AtacOptions, config["atac"])
    options = replace(
        shipped, min_cells_per_feature=int(seen[-40]), lsi=LsiOptions(n_comps=12, max_depth_correlation=0.02)
    )
    adata = peak_counts.copy()
    run_atac(adata, options=options, embedding_options=embedding_options(config), seed=3, backend="cpu")
    kept_features = _cells_per_feature(peak_counts.X) >= seen[-40]
    assert adata.n_vars == kept_features.sum() >= 40  # the 40th most seen feature's peers are kept too
    expected = peak_counts[:, kept_features].copy()
    tfidf(expected, backend="cpu")
    lsi(expected, n_comps=12, max_depth_correlation=0.02, backend="cpu")
    correlation = expected.uns["lsi"]["depth_correlation"]
    assert correlation.size == 12 and ((np.abs(correlation) > 0.02) & (np.abs(correlation) <= 0.9)).any()
    np.testing.assert_array_equal(adata.uns["lsi"]["kept"], expected.uns["lsi"]["kept"])
    provenance = adata.uns["omicsprep"]["atac"]
    assert provenance["backend"] == "cpu"
    assert json.loads(provenance["params"]) == json.loads(json.dumps({**asdict(options), "seed": 3}))
    assert {"filter_features", "to_device", "lsi", "to_host"} <= set(provenance["timings"])
    two = peak_counts.copy()
    run_atac(
        two,
        options=replace(shipped, min_cells_per_feature=int(seen[-2])),
        embedding_options=embedding_options(config),
        seed=0,
        backend="cpu",
    )
    assert two.n_vars == 2
    with pytest.raises(
        InputError, match=rf"^1 of 174 chromatin features are seen in {seen[-1]} cells or more: too few"
    ):
        run_atac(
            peak_counts.copy(),
            options=replace(shipped, min_cells_per_feature=int(seen[-1])),
            embedding_options=embedding_options(config),
            seed=0,
            backend="cpu",
        )
