"""DecontX: parity with pydecontx (the Python port of celda's decontX), the planted truth, GPU = CPU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from scipy import sparse

from omicsprep.cells.decontx import DecontXResult, _entries, _inverse_digamma, decontx, fit_dirichlet_shares
from omicsprep.errors import InputError
from omicsprep.testing.droplets import generate_raw_droplets


@dataclass(frozen=True)
class Cells:
    counts: sparse.csr_matrix
    cell_type: np.ndarray
    ambient_fraction: np.ndarray
    total: np.ndarray
    markers: list[np.ndarray]


@pytest.fixture(scope="module")
def cells() -> Cells:
    raw = generate_raw_droplets(500, 20_000, 2_000, seed=1)
    truth = raw.truth[raw.truth["is_cell"]]
    return Cells(
        counts=raw.counts[raw.truth["is_cell"].to_numpy()],
        cell_type=truth["cell_type"].to_numpy(),
        ambient_fraction=truth["ambient_fraction"].to_numpy(),
        total=truth["total"].to_numpy(),
        markers=raw.markers,
    )


@pytest.fixture(scope="module")
def result(cells: Cells) -> DecontXResult:
    return decontx(cells.counts, clusters=cells.cell_type)


@pytest.mark.parametrize(
    ("estimate_delta", "delta"), [(True, (10.0, 10.0)), (False, (10.0, 10.0)), (False, (4.0, 16.0))]
)
def test_same_as_pydecontx(cells: Cells, *, estimate_delta: bool, delta: tuple[float, float]):
    """Same EM, same random start, same pseudocount: only the order of summation differs.

    So the numbers agree to rounding (3e-15 in contamination and 3e-12 in the counts
    measured), far inside the 0.01 asked; the bounds leave room for a platform's rounding.
    """
    pydecontx = pytest.importorskip("pydecontx")
    ours = decontx(cells.counts, clusters=cells.cell_type, estimate_delta=estimate_delta, delta=delta)
    reference = pydecontx.decontx(cells.counts.T.tocsc(), z=cells.cell_type, estimate_delta=estimate_delta, delta=delta)
    assert ours.iterations == reference.estimates["all_cells"]["iteration"]
    np.testing.assert_allclose(ours.contamination, reference.contamination, rtol=0, atol=1e-9)
    expected = reference.decontx_counts.T.tocsr()
    expected.sort_indices()
    np.testing.assert_array_equal(ours.corrected.indices, expected.indices)
    np.testing.assert_allclose(ours.corrected.data, expected.data, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("with_zeros", "beta"), [(False, (2.0, 15.0)), (True, (2.0, 15.0)), (False, (0.3, 3.0))])
def test_dirichlet_fit_same_as_pydecontx(*, with_zeros: bool, beta: tuple[float, float]):
    """MCMCprecision's fit, as pydecontx ports it; zeros take the branch that shifts shares off 0;
    shares of Beta(0.3, 3) start the fixed point below 1 (the start's floor is 0.01)."""
    pydecontx = pytest.importorskip("pydecontx")
    contamination = np.random.default_rng(0).beta(*beta, size=1000)
    if with_zeros:
        contamination[:10] = 0.0
    expected = pydecontx.fit_dirichlet(np.column_stack([1 - contamination, contamination]))["alpha"]
    np.testing.assert_allclose(fit_dirichlet_shares(contamination, xp=np), expected, rtol=1e-12)


def test_inverse_digamma_inverts_digamma():
    """Minka's start and Newton's steps give the x of each digamma value the fit meets, from
    concentrations of 0.01 (-100) to 10^17 (40), either side of the start's switch at -2.22."""
    from scipy.special import digamma

    targets = np.linspace(-100.0, 40.0, 2801)
    np.testing.assert_allclose(digamma(_inverse_digamma(targets)), targets, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("share", "rtol"), [(0.2, 1e-12), (0.5, 1e-4)])
def test_dirichlet_fit_of_cells_all_alike_is_pydecontx(share: float, rtol: float):
    """Cells all alike have no maximum: the fixed point runs towards infinite precision. At 0.2 the
    moments give a start (the variance rounds to 1e-17) and both reach the same float64 values; at
    0.5 the variance is 0, no start, and MCMCprecision draws one at random (ours: 1): both stop
    within the fit's tolerance, 1e-5 apart."""
    pydecontx = pytest.importorskip("pydecontx")
    contamination = np.full(50, share)
    expected = pydecontx.fit_dirichlet(np.column_stack([1 - contamination, contamination]))["alpha"]
    ours = fit_dirichlet_shares(contamination, xp=np)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, expected, rtol=rtol)


def test_contamination_against_planted_truth(cells: Cells, result: DecontXResult):
    """DecontX sees only the ambient counts that come from the other clusters.

    The planted ambient profile is every cell's pooled expression, so the part of a cell's
    ambient counts that comes from its own type is indistinguishable from native counts: the
    identifiable contamination is ``planted * (1 - own type's share of the ambient pool)``.
    DecontX estimates that (MAE 0.009 measured) and so under-estimates the planted fraction
    itself (MAE 0.030: 0.097 estimated on average against 0.126 planted).
    """
    assert ((result.contamination >= 0) & (result.contamination <= 1)).all()
    native_totals = cells.total * (1 - cells.ambient_fraction)
    own_share = np.bincount(cells.cell_type, weights=native_totals) / native_totals.sum()
    identifiable = cells.ambient_fraction * (1 - own_share[cells.cell_type])
    assert np.abs(result.contamination - identifiable).mean() < 0.015
    assert np.abs(result.contamination - cells.ambient_fraction).mean() < 0.04
    assert result.contamination.mean() < cells.ambient_fraction.mean()
    assert np.corrcoef(result.contamination, cells.ambient_fraction)[0, 1] > 0.8


def test_markers_removed_from_other_types(cells: Cells, result: DecontXResult):
    """A type's exclusive markers in another type's cells are contamination (96.9% to 99.999% removed, measured)."""
    for cell_type, genes in enumerate(cells.markers):
        other = cells.cell_type != cell_type
        observed = cells.counts[other][:, genes].sum()
        kept = result.corrected[other][:, genes].sum()
        assert kept <= 0.2 * observed, cell_type
        own = cells.counts[~other][:, genes].sum()
        assert result.corrected[~other][:, genes].sum() >= 0.99 * own, cell_type


def test_corrected_counts_at_most_observed(cells: Cells, result: DecontXResult):
    assert result.corrected.shape == cells.counts.shape
    assert (result.corrected.data >= 0).all()
    assert (result.corrected.data <= cells.counts.data + 1e-12).all()
    removed = 1 - np.asarray(result.corrected.sum(axis=1)).ravel() / cells.total
    # The counts removed per cell follow the final theta, one EM step past the reported shares.
    np.testing.assert_allclose(removed, result.contamination, atol=0.01)


def test_duplicate_entries_summed_and_input_kept(cells: Cells, result: DecontXResult):
    coo = cells.counts.tocoo()
    # Every count split in two entries of the same row and gene: CSR with duplicates.
    rows = np.tile(coo.row, 2)
    order = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=coo.shape[0]))])
    halves = sparse.csr_matrix((np.tile(coo.data / 2, 2)[order], np.tile(coo.col, 2)[order], indptr), shape=coo.shape)
    assert not halves.has_canonical_format
    before = halves.data.copy()
    again = decontx(halves, clusters=cells.cell_type)
    np.testing.assert_array_equal(halves.data, before)
    np.testing.assert_allclose(again.contamination, result.contamination, atol=1e-9)
    # The corrected counts hold each (cell, gene) once, as the summed input's do.
    assert again.corrected.has_canonical_format
    np.testing.assert_array_equal(again.corrected.indptr, result.corrected.indptr)
    np.testing.assert_array_equal(again.corrected.indices, result.corrected.indices)
    np.testing.assert_allclose(again.corrected.data, result.corrected.data, rtol=1e-9)


def test_bad_input(cells: Cells):
    with pytest.raises(InputError, match="one cluster label per cell"):
        decontx(cells.counts, clusters=cells.cell_type[:-1])
    with pytest.raises(InputError, match="at least two clusters"):
        decontx(cells.counts, clusters=np.zeros(cells.counts.shape[0], dtype=int))
    empty = sparse.vstack([cells.counts, sparse.csr_matrix((1, cells.counts.shape[1]))]).tocsr()
    with pytest.raises(InputError, match="1 cells have none"):
        decontx(empty, clusters=np.append(cells.cell_type, 0))


def test_entry_sums_same_on_both_paths(cells: Cells):
    """The GPU's sums (matrices built once; SciPy standing in for cupyx) equal the CPU's bit for bit.

    Sums per cluster and gene by a (cluster-gene, entry) product against ``bincount``, sums per
    cell against a SciPy product by ones; each adds a row's entries in their CSR order.
    """
    values = np.random.default_rng(0).random(cells.counts.nnz)
    by_product, by_bincount = (
        _entries(cells.counts, cells.cell_type, xp=np, sparse_module=sparse, bins_by_product=on_gpu)
        for on_gpu in (True, False)
    )
    assert by_bincount.cluster_gene_by_entry is None
    # Their matrices keep every cluster-gene pair and gene where the last genes have no counts.
    padded = sparse.hstack([cells.counts, sparse.csr_matrix((cells.counts.shape[0], 3))]).tocsr()
    padded_by_product, padded_by_bincount = (
        _entries(padded, cells.cell_type, xp=np, sparse_module=sparse, bins_by_product=on_gpu)
        for on_gpu in (True, False)
    )
    assert padded_by_product.by_cell.shape == padded_by_bincount.by_cell.shape == padded.shape
    n_bins = len(np.unique(cells.cell_type)) * padded.shape[1]
    assert padded_by_product.cluster_gene_by_entry.shape == (n_bins, padded.nnz)
    np.testing.assert_array_equal(by_product.per_cluster_gene(values), by_bincount.per_cluster_gene(values))
    with_values = sparse.csr_matrix((values, cells.counts.indices, cells.counts.indptr), shape=cells.counts.shape)
    np.testing.assert_array_equal(by_product.per_cell(values), with_values @ np.ones(with_values.shape[1]))
    np.testing.assert_array_equal(
        by_product.cell, np.repeat(np.arange(cells.counts.shape[0]), np.diff(cells.counts.indptr))
    )


@pytest.mark.gpu
def test_gpu_matches_cpu(cells: Cells, result: DecontXResult):
    gpu = decontx(cells.counts, clusters=cells.cell_type, backend="gpu")
    assert gpu.iterations == result.iterations
    np.testing.assert_allclose(gpu.contamination, result.contamination, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(gpu.corrected.indices, result.corrected.indices)
    np.testing.assert_allclose(gpu.corrected.data, result.corrected.data, rtol=0, atol=1e-4)


def test_the_defaults_are_the_configurations_and_one_iteration_is_the_least(cells: Cells):
    """decontx's defaults are the configuration's DecontX options (celda's: 500 iterations at
    most) on the CPU; max_iter=1 runs one EM iteration, 0 is one clear error."""
    import inspect

    from omicsprep.options.counting import DecontxOptions

    parameters = inspect.signature(decontx).parameters
    for name, value in vars(DecontxOptions()).items():
        assert parameters[name].default == value, name
    assert DecontxOptions().max_iter == 500
    assert parameters["backend"].default == "cpu"
    # The default at work too (a signature need not show the default a call takes): where no
    # change is below the convergence, 500 iterations.
    few = slice(0, 60)
    assert decontx(cells.counts[few], clusters=cells.cell_type[few], convergence=0.0).iterations == 500
    assert decontx(cells.counts, clusters=cells.cell_type, max_iter=1).iterations == 1
    with pytest.raises(InputError, match=r"^DecontX needs at least one EM iteration, got max_iter=0$"):
        decontx(cells.counts, clusters=cells.cell_type, max_iter=0)


def test_two_clusters_a_lone_count_and_genes_without_counts(cells: Cells):
    """Two clusters are enough; a cell of one count is a cell with counts (the error counts the
    empty ones only); the corrected matrix keeps the input's shape where its last genes have no
    counts."""
    two = np.isin(cells.cell_type, np.unique(cells.cell_type)[:2])
    lone = sparse.csr_matrix(([1.0], ([0], [0])), shape=(1, cells.counts.shape[1]))
    counts = sparse.hstack([sparse.vstack([cells.counts[two], lone]), sparse.csr_matrix((two.sum() + 1, 3))]).tocsr()
    clusters = np.append(cells.cell_type[two], cells.cell_type[two][0])
    result = decontx(counts, clusters=clusters, max_iter=3)
    assert result.corrected.shape == counts.shape
    assert 0 <= result.contamination[-1] <= 1 and result.corrected[-1].sum() <= 1
    empty = sparse.vstack([counts, sparse.csr_matrix((1, counts.shape[1]))]).tocsr()
    with pytest.raises(InputError, match="DecontX needs cells with counts: 1 cells have none"):
        decontx(empty, clusters=np.append(clusters, clusters[0]))
