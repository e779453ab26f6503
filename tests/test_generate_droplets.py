"""The generated raw droplets: their truth, and their reads counted back to the same matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from omicsprep.options import METHODS, UmiOptions
from omicsprep.reads import counting
from omicsprep.testing.droplets import RawDroplets, droplet_reads, generate_raw_droplets
from omicsprep.testing.genes import gene_names
from omicsprep.testing.reads import write_bam

N_CELLS, N_BARCODES, N_GENES = 100, 3_000, 500


@pytest.fixture(scope="module")
def droplets() -> RawDroplets:
    return generate_raw_droplets(N_CELLS, N_BARCODES, N_GENES, seed=11)


def test_truth_of_raw_droplets(droplets: RawDroplets) -> None:
    truth = droplets.truth
    counts = droplets.counts
    assert counts.shape == (N_BARCODES, N_GENES)
    assert len(set(droplets.barcodes)) == N_BARCODES
    assert truth["is_cell"].sum() == N_CELLS
    assert (truth["cell_type"] >= 0).equals(truth["is_cell"])
    assert truth["ambient_fraction"].notna().equals(truth["is_cell"])
    assert truth.loc[truth["is_cell"], "ambient_fraction"].between(0.0, 0.3).all()
    np.testing.assert_array_equal(truth["total"], np.asarray(counts.sum(axis=1)).ravel())
    assert truth.loc[truth["is_cell"], "total"].min() >= 300
    assert truth.loc[~truth["is_cell"], "total"].median() < 10
    assert droplets.ambient.sum() == pytest.approx(1.0)


def test_markers_are_ambient_outside_their_type(droplets: RawDroplets) -> None:
    """A type's markers reach other cells only through the ambient part of their UMIs (at most ~20%)."""
    truth = droplets.truth
    cells = np.flatnonzero(truth["is_cell"])
    cell_type = truth["cell_type"].to_numpy()[cells]
    counts = droplets.counts[cells]
    totals = np.asarray(counts.sum(axis=1)).ravel()
    for marker_type, genes in enumerate(droplets.markers):
        own = cell_type == marker_type
        if not own.any():
            continue
        marker_counts = np.asarray(counts[:, genes].sum(axis=1)).ravel()
        own_share = marker_counts[own].sum() / totals[own].sum()
        other_share = marker_counts[~own].sum() / totals[~own].sum()
        ambient_share = droplets.ambient[genes].sum()
        # Other cells hold at most 20% ambient UMIs, of which the markers are ambient_share.
        assert other_share < 0.2 * ambient_share * 1.5 + 1e-3
        assert own_share > 10 * other_share


@pytest.fixture(scope="module")
def droplets_bam(droplets: RawDroplets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bam = tmp_path_factory.mktemp("droplets") / "droplets.bam"
    write_bam(droplet_reads(droplets, seed=12), bam)
    return bam


@pytest.mark.parametrize("method", METHODS)
def test_droplet_reads_count_back_to_the_matrix(droplets: RawDroplets, droplets_bam: Path, method) -> None:
    adata = counting.count_umis(droplets_bam, fmt="bam", options=UmiOptions(method=method), backend="cpu")
    counted = counting.long_table(adata).set_index(["cell", "gene"])["count"]

    coo = droplets.counts.tocoo()
    names = np.array(gene_names(N_GENES), dtype=object)
    expected = pd.Series(
        coo.data.astype(np.int64),
        index=pd.MultiIndex.from_arrays(
            [np.asarray(droplets.barcodes, dtype=object)[coo.row], names[coo.col]], names=["cell", "gene"]
        ),
        name="count",
    ).sort_index()
    # Exact: the UMIs of one barcode and gene are two or more bases apart, so none merge.
    pd.testing.assert_series_equal(counted.sort_index(), expected, check_names=False)
