"""Modalities joined by barcode: the real Multiome cells, and barcodes that do not match."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import REPO

from omicsprep import chromatin, io
from omicsprep.errors import InputError
from omicsprep.multiome import join_modalities

MULTIOME = REPO / "tests" / "data" / "multiome"
CITESEQ = REPO / "tests" / "data" / "citeseq"


@pytest.fixture(scope="module")
def atac():
    barcodes = pd.Index(pd.read_csv(MULTIOME / "barcodes.tsv", header=None)[0])
    return chromatin.count_fragments(io.fragment_chunks(MULTIOME / "fragments.tsv.gz"), barcodes=barcodes,
                                     peaks=io.read_peaks(MULTIOME / "peaks.bed"))


def test_join_keeps_the_common_cells(atac):
    half = atac[::2].copy()  # a second modality with every other cell
    joined, overlap = join_modalities({"atac": atac, "prot": half}, min_overlap=0.4)
    assert overlap == {"atac": 0.5, "prot": 1.0}
    assert joined.n_obs == 500 and list(joined.mod) == ["atac", "prot"]
    assert list(joined["atac"].obs_names) == list(half.obs_names)


def test_barcodes_that_do_not_overlap_are_refused(atac):
    prot = io.read_counts(CITESEQ / "cells", feature_type="Antibody Capture")
    with pytest.raises(InputError, match=r"modalities share 0 cell barcodes \(atac 0.0% of 1000, prot 0.0% of 2872\)"):
        join_modalities({"atac": atac, "prot": prot}, min_overlap=0.5)
