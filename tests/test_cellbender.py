"""CellBender remove-background: its command line, its output read back, scored against planted truth."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from omicsprep.cells.ambient import aligned_counts
from omicsprep.cells.cellbender import remove_background_command
from omicsprep.errors import InputError
from omicsprep.io.cellbender import read_cellbender
from omicsprep.testing.droplets import generate_raw_droplets
from omicsprep.testing.generate import write_10x_h5
from omicsprep.testing.genes import gene_names
from omicsprep.testing.scoring import called_by_cellbender, quality

# CellBender 0.4.0's output on `generate.py --cells 200 --raw-barcodes 5000 --genes 500`
# (tests/data/cellbender/README.md says how it was made).
FIXTURE = REPO / "tests" / "data" / "cellbender" / "cellbender_200_5000_500.h5"
FIXTURE_ANALYZED = 600  # its --total-droplets-included


@pytest.fixture(scope="module")
def fixture_droplets():
    return generate_raw_droplets(200, 5000, 500, seed=0)


@pytest.fixture(scope="module")
def corrected():
    return read_cellbender(FIXTURE)


def test_command_defaults():
    argv = remove_background_command("raw.h5", "out/cb.h5")
    assert argv == [
        "cellbender",
        "remove-background",
        "--input",
        str(Path("raw.h5").absolute()),
        "--output",
        str(Path("out/cb.h5").absolute()),
        "--epochs",
        "150",
        "--fpr",
        "0.01",
    ]


def test_command_options():
    argv = remove_background_command(
        Path("/data/raw.h5"),
        "/o/cb.h5",
        expected_cells=5000,
        total_droplets=20_000,
        epochs=50,
        learning_rate=3e-4,
        fpr=0.05,
        posterior_batch_size=1024,
        projected_ambient_count_threshold=1.0,
        cuda=True,
        cpu_threads=4,
    )
    assert argv[2:] == [
        "--input",
        "/data/raw.h5",
        "--output",
        "/o/cb.h5",
        "--epochs",
        "50",
        "--fpr",
        "0.05",
        "--expected-cells",
        "5000",
        "--total-droplets-included",
        "20000",
        "--learning-rate",
        "0.0003",
        "--posterior-batch-size",
        "1024",
        "--projected-ambient-count-threshold",
        "1.0",
        "--cpu-threads",
        "4",
        "--cuda",
    ]


@pytest.mark.parametrize(
    ("output", "options", "message"),
    [
        ("cb.h5ad", {}, "does not end in .h5"),
        ("cb.h5", {"epochs": 0}, "epochs"),
        ("cb.h5", {"fpr": 1.0}, "fpr"),
    ],
)
def test_command_refuses(output, options, message):
    with pytest.raises(ValueError, match=message):
        remove_background_command("raw.h5", output, **options)


def test_command_takes_the_bounds_allowed():
    """One epoch and a false positive rate of 0 (remove nothing of the cells') are allowed."""
    argv = remove_background_command("raw.h5", "cb.h5", epochs=1, fpr=0.0)
    assert argv[argv.index("--epochs") + 1] == "1" and argv[argv.index("--fpr") + 1] == "0.0"


def test_reader_layout(corrected, fixture_droplets):
    assert corrected.shape == (5000, 500)
    assert corrected.obs_names.tolist() == fixture_droplets.barcodes
    assert corrected.var_names.tolist() == gene_names(500)
    assert corrected.X.dtype == np.float32
    analyzed = corrected.obs["analyzed"].to_numpy()
    assert analyzed.sum() == FIXTURE_ANALYZED
    # Only the analysed barcodes have estimates and counts; the surely-empty ones have neither.
    assert corrected.obs.loc[analyzed, "cell_probability"].between(0, 1).all()
    assert corrected.obs.loc[~analyzed, "cell_probability"].isna().all()
    assert corrected.X[~analyzed].nnz == 0
    assert 0 < corrected.var["analyzed"].sum() < 500
    assert corrected.var["ambient_expression"].sum() == pytest.approx(1, abs=1e-3)
    assert corrected.uns["cellbender"]["target_false_positive_rate"] == 0.01


def test_reader_counts_against_truth(corrected, fixture_droplets):
    """Corrected <= raw per entry; the cells called and the background removed, against the planted truth."""
    raw = fixture_droplets.counts
    assert ((corrected.X - raw) > 0).sum() == 0
    scores = quality(called_by_cellbender(corrected), fixture_droplets)
    print("MEASURE cellbender fixture", scores)
    assert scores["precision"] == 1.0
    assert scores["recall"] == 1.0
    assert scores["entries_above_raw"] == 0
    # CellBender takes a cell's ambient to be about an empty droplet's counts (here ~20 UMIs)
    # plus a swapping share of the cell's own (prior mean 3%), so of the 5-20% planted (mean
    # 11.9%) it removed 2.7% per cell, and 13% of the other types' markers (measured on the
    # fixture; tests/data/cellbender/README.md).
    assert 0.015 < scores["removed_fraction"] < 0.05
    assert 0.05 < scores["foreign_marker_reduction"] < 0.3


def test_background_fraction_is_what_was_removed(corrected, fixture_droplets):
    cells = corrected.obs["cell_probability"].to_numpy() > 0.5
    raw_total = np.asarray(fixture_droplets.counts[cells].sum(axis=1)).ravel()
    kept_total = np.asarray(corrected.X[cells].sum(axis=1)).ravel()
    expected = (raw_total - kept_total) / (raw_total + 0.001)  # CellBender's definition (run.py)
    np.testing.assert_allclose(corrected.obs["background_fraction"].to_numpy()[cells], expected, atol=1e-6)


def test_aligned_counts(corrected):
    # The first barcode and gene among those asked: position 0 is found, not missing.
    called = corrected.obs_names[corrected.obs["cell_probability"] > 0.5][::-1]
    barcodes = corrected.obs_names[:1].append(called)
    genes = corrected.var_names[[0, 7, 3, 400]]
    counts = aligned_counts(corrected, barcodes=barcodes, genes=genes)
    assert counts.shape == (len(barcodes), 4)
    expected = corrected[barcodes, genes].X.toarray()
    np.testing.assert_array_equal(counts.toarray(), expected)
    # float32 whatever CellBender's matrix holds
    as_float64 = corrected.copy()
    as_float64.X = as_float64.X.astype(np.float64)
    assert aligned_counts(as_float64, barcodes=barcodes, genes=genes).dtype == np.float32


def test_aligned_counts_name_what_is_missing(corrected):
    """One error naming the kind, the count and the first three missing names."""
    genes = corrected.var_names[:2]
    strangers = ["NOT-A", "NOT-B", "NOT-C", "NOT-D"]
    with pytest.raises(KeyError, match=r"4 barcode\(s\) not in CellBender's output \('NOT-A', 'NOT-B', 'NOT-C'\): was"):
        aligned_counts(corrected, barcodes=strangers, genes=genes)
    with pytest.raises(KeyError, match=r"1 gene\(s\) not in CellBender's output \('NOT-A-GENE'\)"):
        aligned_counts(corrected, barcodes=corrected.obs_names[:2], genes=[*genes, "NOT-A-GENE"])


def test_reader_refuses_plain_matrix(tmp_path, fixture_droplets):
    plain = tmp_path / "raw.h5"
    write_10x_h5(fixture_droplets.counts, plain, barcodes=fixture_droplets.barcodes)
    with pytest.raises(InputError, match="not an output of CellBender"):
        read_cellbender(plain)


@pytest.mark.parametrize("cuda", [False, pytest.param(True, marks=pytest.mark.gpu)], ids=["cpu", "cuda"])
def test_cellbender_cli_end_to_end(tmp_path, cuda):
    """The real CLI on a tiny raw matrix, read back (a few epochs: the layout, not the quality)."""
    if shutil.which("cellbender") is None:
        pytest.skip("cellbender is not on PATH (pip install cellbender==0.4.0, see envs/cellbender.yaml)")
    droplets = generate_raw_droplets(100, 2000, 300, seed=1)
    raw = tmp_path / "raw.h5"
    write_10x_h5(droplets.counts, raw, barcodes=droplets.barcodes)
    run_dir = tmp_path / "run"  # CellBender writes its checkpoint into its working folder
    run_dir.mkdir()
    command = remove_background_command(
        raw, run_dir / "cb.h5", expected_cells=100, total_droplets=300, epochs=5, cpu_threads=2, cuda=cuda
    )
    result = subprocess.run(command, cwd=run_dir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    corrected = read_cellbender(run_dir / "cb.h5")
    assert corrected.obs_names.tolist() == droplets.barcodes
    assert corrected.obs["analyzed"].sum() == 300
    assert ((corrected.X - droplets.counts) > 0).sum() == 0
    # The filtered output holds the droplets the full one calls cells. Which they are after 5
    # epochs varies (on the H200 52 of 60 called were true cells); quality is checked on the
    # fixture's 60-epoch run above and by benchmarks/cellbender.py.
    filtered = read_cellbender(run_dir / "cb_filtered.h5")
    called = corrected.obs_names[corrected.obs["cell_probability"] > 0.5]
    assert sorted(filtered.obs_names) == sorted(called)  # in another order


def test_ambient_removal_by_cellbender_takes_its_counts_of_the_called_cells(corrected, fixture_droplets):
    """``method: cellbender`` replaces the cells' counts by CellBender's (kept raw in a layer); its
    output missing or lacking a called cell is one error saying what to do."""
    from anndata import AnnData
    from scipy import sparse

    from omicsprep.cells.ambient import UNCORRECTED_LAYER, remove_ambient
    from omicsprep.options.counting import AmbientOptions

    called = (corrected.obs["cell_probability"] > 0.5).to_numpy()
    raw = AnnData(sparse.csr_matrix(fixture_droplets.counts, dtype=np.float32))
    raw.obs_names, raw.var_names = corrected.obs_names, corrected.var_names
    cells = raw[called].copy()
    options = AmbientOptions(method="cellbender")
    remove_ambient(cells, raw=raw, options=options, cellbender_output=corrected, seed=0, backend="cpu")
    np.testing.assert_array_equal(cells.X.toarray(), corrected[called].X.toarray())
    np.testing.assert_array_equal(cells.layers[UNCORRECTED_LAYER].toarray(), raw[called].X.toarray())
    with pytest.raises(InputError, match=r"^ambient method cellbender, but no CellBender output was given$"):
        remove_ambient(raw[called].copy(), raw=raw, options=options, seed=0, backend="cpu")
    stranger = raw[called].copy()
    stranger.obs_names = [*stranger.obs_names[:-1], "NOT-A-BARCODE"]
    lacking = r"^CellBender's output lacks called cells or genes of the raw matrix \(1 barcode.*\): "
    with pytest.raises(InputError, match=lacking + r"raise cells\.ambient\.cellbender\.total_droplets$"):
        remove_ambient(stranger, raw=raw, options=options, cellbender_output=corrected, seed=0, backend="cpu")
