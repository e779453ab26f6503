"""SoupX: soup profile, autoEstCont and adjustCounts against R SoupX 1.6.2 and against the planted truth."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, import_for_gpu_test
from scipy import io, sparse

from omicsprep.cells.soupx import estimate_contamination, remove_soup, soup_profile

sys.path.insert(0, str(REPO / "benchmarks"))
import generate

# The generator's markers are so abundant that the soup puts them into most cells of other
# types: their tf-idf stays below SoupX's default 1.0 (R SoupX finds no marker either).
TFIDF_MIN = 0.5

SOUPX_SCRIPT = r"""
suppressPackageStartupMessages({library(Matrix); library(SoupX)})
args = commandArgs(TRUE); dir = args[1]
read = function(name) as(t(readMM(file.path(dir, name))), 'CsparseMatrix')
tod = read('raw.mtx'); toc = read('cells.mtx')
# Names that sort as the indices do, so that SoupX breaks ties in gene order.
rownames(tod) = rownames(toc) = sprintf('g%05d', seq_len(nrow(toc)) - 1)
colnames(tod) = paste0('d', seq_len(ncol(tod))); colnames(toc) = paste0('c', seq_len(ncol(toc)))
sc = SoupChannel(tod, toc)
sc = setClusters(sc, readLines(file.path(dir, 'clusters.txt')))
sc = autoEstCont(sc, tfidfMin=as.numeric(args[2]), doPlot=FALSE, verbose=FALSE)
write17 = function(x, name) writeLines(sprintf('%.17g', x), file.path(dir, name))
write17(sc$soupProfile$est, 'soup.txt')
write17(c(sc$fit$rhoEst, sc$fit$rhoFWHM), 'rho.txt')
writeLines(unique(sc$fit$dd$gene), file.path(dir, 'markers.txt'))
entries = function(m, name) {
  m = as(m, 'TsparseMatrix')
  write.table(data.frame(cell=m@j, gene=m@i, x=sprintf('%.17g', m@x)), file.path(dir, name),
              row.names=FALSE, quote=FALSE)
}
entries(adjustCounts(sc, verbose=0), 'by_cluster.txt')
entries(adjustCounts(sc, clusters=FALSE, verbose=0), 'by_cell.txt')
sc = setContaminationFraction(sc, setNames(as.numeric(readLines(file.path(dir, 'cell_rho.txt'))), colnames(toc)))
entries(adjustCounts(sc, verbose=0), 'by_cluster_cell_rho.txt')
"""


@dataclass(frozen=True)
class Droplets:
    raw: sparse.csr_matrix
    cells: sparse.csr_matrix
    cell_type: np.ndarray
    ambient_fraction: np.ndarray
    markers: list[np.ndarray]


@dataclass(frozen=True)
class SoupxResult:
    soup: np.ndarray
    rho: float
    rho_half_max: tuple[float, float]
    markers: list[int]
    by_cluster: sparse.csr_matrix
    by_cell: sparse.csr_matrix
    by_cluster_cell_rho: sparse.csr_matrix


@pytest.fixture(scope="module")
def droplets() -> Droplets:
    generated = generate.generate_raw_droplets(500, 20_000, 2_000, seed=0)
    is_cell = generated.truth["is_cell"].to_numpy()
    return Droplets(
        raw=generated.counts,
        cells=generated.counts[is_cell],
        cell_type=generated.truth["cell_type"].to_numpy()[is_cell],
        ambient_fraction=generated.truth["ambient_fraction"].to_numpy()[is_cell],
        markers=generated.markers,
    )


def cell_rho(droplets: Droplets) -> np.ndarray:
    """A contamination fraction per cell, 5% to 20%."""
    return np.linspace(0.05, 0.2, droplets.cells.shape[0])


def _read_entries(path: Path, shape: tuple[int, int]) -> sparse.csr_matrix:
    cell, gene, value = np.loadtxt(path, skiprows=1, unpack=True, ndmin=2)
    return sparse.csr_matrix((value, (cell.astype(int), gene.astype(int))), shape=shape)


@pytest.fixture(scope="module")
def soupx_reference(droplets: Droplets, tmp_path_factory: pytest.TempPathFactory) -> SoupxResult:
    if shutil.which("Rscript") is None:
        pytest.skip("Rscript is not installed: no SoupX parity")
    has_soupx = ["Rscript", "-e", "quit(status = !nzchar(system.file(package = 'SoupX')))"]
    if subprocess.run(has_soupx, capture_output=True, check=False).returncode != 0:
        pytest.skip("the R package SoupX is not installed: no SoupX parity")
    work = tmp_path_factory.mktemp("soupx")
    io.mmwrite(work / "raw.mtx", droplets.raw)
    io.mmwrite(work / "cells.mtx", droplets.cells)
    np.savetxt(work / "clusters.txt", droplets.cell_type, fmt="%d")
    np.savetxt(work / "cell_rho.txt", cell_rho(droplets), fmt="%.17g")
    (work / "soupx.R").write_text(SOUPX_SCRIPT)
    subprocess.run(["Rscript", str(work / "soupx.R"), str(work), str(TFIDF_MIN)], check=True, capture_output=True)
    rho, low, high = np.loadtxt(work / "rho.txt")
    return SoupxResult(
        soup=np.loadtxt(work / "soup.txt"),
        rho=float(rho),
        rho_half_max=(float(low), float(high)),
        markers=[int(name[1:]) for name in (work / "markers.txt").read_text().split()],
        by_cluster=_read_entries(work / "by_cluster.txt", droplets.cells.shape),
        by_cell=_read_entries(work / "by_cell.txt", droplets.cells.shape),
        by_cluster_cell_rho=_read_entries(work / "by_cluster_cell_rho.txt", droplets.cells.shape),
    )


def assert_close_counts(got: sparse.csr_matrix, expected: sparse.csr_matrix, tolerance: float = 1e-6) -> None:
    difference = abs(got - expected)
    assert difference.max() <= tolerance, difference.max()


def test_soup_profile_is_soupx(droplets, soupx_reference):
    assert np.array_equal(soup_profile(droplets.raw), soupx_reference.soup)


def test_contamination_is_soupx(droplets, soupx_reference):
    estimate = estimate_contamination(
        droplets.cells, soup_profile(droplets.raw), clusters=droplets.cell_type, tfidf_min=TFIDF_MIN
    )
    assert estimate.markers == soupx_reference.markers
    assert abs(estimate.rho - soupx_reference.rho) <= 0.01
    assert estimate.rho == soupx_reference.rho  # the same grid point, measured
    assert estimate.rho_half_max == soupx_reference.rho_half_max


@pytest.mark.parametrize("by", ["cluster", "cell"])
def test_remove_soup_is_soupx(droplets, soupx_reference, by):
    clusters = droplets.cell_type if by == "cluster" else None
    corrected = remove_soup(
        droplets.cells, soupx_reference.soup, rho=soupx_reference.rho, clusters=clusters, backend="cpu"
    )
    expected = soupx_reference.by_cluster if by == "cluster" else soupx_reference.by_cell
    assert_close_counts(corrected, expected)


def test_remove_soup_with_a_rho_per_cell_is_soupx(droplets, soupx_reference):
    corrected = remove_soup(
        droplets.cells, soupx_reference.soup, rho=cell_rho(droplets), clusters=droplets.cell_type, backend="cpu"
    )
    assert_close_counts(corrected, soupx_reference.by_cluster_cell_rho)


def test_contamination_is_the_planted_one(droplets):
    estimate = estimate_contamination(
        droplets.cells, soup_profile(droplets.raw), clusters=droplets.cell_type, tfidf_min=TFIDF_MIN
    )
    assert abs(estimate.rho - droplets.ambient_fraction.mean()) <= 0.03


def test_remove_soup_clears_markers_from_other_types(droplets):
    soup = soup_profile(droplets.raw)
    rho = estimate_contamination(droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=TFIDF_MIN).rho
    corrected = remove_soup(droplets.cells, soup, rho=rho, clusters=droplets.cell_type)
    for cell_type, markers in enumerate(droplets.markers):
        others = droplets.cell_type != cell_type
        before = droplets.cells[others][:, markers].sum()
        after = corrected[others][:, markers].sum()
        assert after <= 0.2 * before, (cell_type, before, after)


def test_remove_soup_removes_rho_of_each_cell_at_most(droplets):
    soup = soup_profile(droplets.raw)
    rho = cell_rho(droplets)
    totals = np.asarray(droplets.cells.sum(axis=1)).ravel()
    for clusters in (droplets.cell_type, None):
        corrected = remove_soup(droplets.cells, soup, rho=rho, clusters=clusters)
        removed = totals - np.asarray(corrected.sum(axis=1)).ravel()
        assert (corrected.data > 0).all()
        assert (corrected > droplets.cells).nnz == 0
        if clusters is None:  # every cell loses exactly its soup; by cluster, each cluster does
            np.testing.assert_allclose(removed, rho * totals, rtol=1e-9)
        else:
            np.testing.assert_allclose(
                np.bincount(clusters, weights=removed), np.bincount(clusters, weights=rho * totals), rtol=1e-9
            )


def test_remove_soup_leaves_the_input_alone(droplets):
    before = droplets.cells.copy()
    remove_soup(droplets.cells, soup_profile(droplets.raw), rho=0.1, clusters=droplets.cell_type)
    assert (droplets.cells != before).nnz == 0
    assert np.array_equal(droplets.cells.indptr, before.indptr)


def test_no_markers_is_one_clear_error(droplets):
    with pytest.raises(ValueError, match="no plausible marker genes"):
        estimate_contamination(droplets.cells, soup_profile(droplets.raw), clusters=droplets.cell_type)


@pytest.mark.gpu
@pytest.mark.parametrize("by", ["cluster", "cell"])
def test_remove_soup_gpu_is_cpu(droplets, request, by):
    import_for_gpu_test(request.config, "cupy")
    soup = soup_profile(droplets.raw)
    rho = cell_rho(droplets)
    clusters = droplets.cell_type if by == "cluster" else None
    cpu = remove_soup(droplets.cells, soup, rho=rho, clusters=clusters, backend="cpu")
    gpu = remove_soup(droplets.cells, soup, rho=rho, clusters=clusters, backend="gpu")
    assert isinstance(gpu, sparse.csr_matrix)
    assert_close_counts(gpu, cpu)
