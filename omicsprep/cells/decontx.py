"""DecontX: per-cell contamination from a Bayesian two-component mixture, and decontaminated counts.

DecontX (Yang et al., Genome Biology 2020; ``celda::decontX``) models each cell's counts as a
multinomial mixture of its cluster's native expression ``phi`` and a contamination profile
``eta`` made of the other clusters' expression, mixed by a per-cell native share ``theta``
with a Beta(``delta``) prior. Variational EM assigns every count a native responsibility,
re-estimates ``phi``, ``eta``, ``theta`` (and ``delta`` by Minka's Dirichlet fixed point, as
``MCMCprecision::fit_dirichlet``) and stops when no cell's ``theta`` moves by ``convergence``.

The EM is written over the non-zero entries with gathers and sparse matrix-vector products by
matrices built once (sums per cell; sums per cluster and gene, by ``bincount`` on the CPU), so
NumPy and CuPy run the same code; on the GPU the entries move to the device once and only the
Dirichlet statistics and the convergence test come back per iteration. The numbers follow
``src/DecontX.cpp`` and its Python port ``pydecontx`` 0.1.0 step for step (same random start
from ``numpy.random.default_rng(seed).beta``, same pseudocount), so results agree with
``pydecontx`` to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from scipy import sparse
from scipy.special import digamma, polygamma

from omicsprep.backend import Backend, array_module, asnumpy, cupyx_sparse, max_gpu_sparse_entries
from omicsprep.errors import InputError

# Added to every probability, as decontX does, so no responsibility is 0/0.
PSEUDOCOUNT = 1e-20
# MCMCprecision::fit_dirichlet's tolerance, as decontX calls it.
DIRICHLET_TOLERANCE = 0.1
DIRICHLET_MAX_ITER = 100_000


@dataclass(frozen=True)
class DecontXResult:
    """What :func:`decontx` estimates.

    Attributes
    ----------
    contamination
        Per cell, the share of its counts assigned to contamination, in [0, 1].
    corrected
        The decontaminated counts, cells x genes (float64, the input's sparsity pattern): each
        count times its native responsibility.
    iterations
        EM iterations run.
    """

    contamination: np.ndarray
    corrected: sparse.csr_matrix
    iterations: int


@dataclass(frozen=True)
class _Entries:
    """The non-zero counts on the array module's device, with the indices and sums the EM needs.

    The sums are sparse products by matrices built once: CuPy sorts and checks every sparse
    matrix made afresh, and its weighted ``bincount`` scatters with float64 atomics in no
    fixed order. Each product adds a row's entries one by one in their CSR order, as
    ``bincount`` does, so the CPU's numbers are those of a plain loop to the last bit.
    """

    counts: Any  # (nnz,) float64
    cell: Any  # (nnz,) the row of each entry
    cluster_gene: Any  # (nnz,) cluster * n_genes + gene, the entry's place in a (clusters, genes) table
    by_cell: Any  # (cells, genes) CSR of the counts' structure, whose data is swapped for the values to sum
    gene_ones: Any  # (n_genes,) float64
    # (clusters * genes, nnz) CSR of ones on the GPU; None on the CPU, where bincount's
    # sequential scatter is faster than this product and costs no set-up.
    cluster_gene_by_entry: Any
    cell_totals: Any  # (n_cells,) float64
    n_clusters: int

    @property
    def n_genes(self) -> int:
        return int(self.gene_ones.size)

    def per_cell(self, values: Any) -> Any:
        """Sums of per-entry ``values`` over each cell's entries."""
        # Same structure, new data: the matrix stays checked and canonical.
        self.by_cell.data = values
        return self.by_cell @ self.gene_ones

    def per_cluster_gene(self, values: Any) -> Any:
        """Sums of per-entry ``values`` by cluster and gene, a (clusters, genes) table."""
        shape = (self.n_clusters, self.n_genes)
        if self.cluster_gene_by_entry is None:
            sums = np.bincount(self.cluster_gene, weights=values, minlength=shape[0] * shape[1])
        else:
            sums = self.cluster_gene_by_entry @ values
        return sums.reshape(shape)


def decontx(
    cells: sparse.csr_matrix,
    *,
    clusters: np.ndarray,
    max_iter: int = 500,
    delta: tuple[float, float] = (10.0, 10.0),
    estimate_delta: bool = True,
    convergence: float = 0.001,
    seed: int = 12345,
    backend: Backend = "cpu",
) -> DecontXResult:
    """Estimate each cell's ambient contamination with DecontX and remove it from the counts.

    Parameters
    ----------
    cells
        Counts of called cells (no empty droplets), cells x genes.
    clusters
        One label per cell, at least two distinct: a cell's contamination is modelled as the
        expression of the other clusters.
    max_iter
        Most EM iterations.
    delta
        Beta prior of the native share ``theta`` (native, contamination pseudo-counts); the
        starting value when ``estimate_delta``.
    estimate_delta
        Re-estimate ``delta`` each iteration from the cells' shares (Dirichlet maximum
        likelihood).
    convergence
        Stop when no cell's ``theta`` changes by this much in one iteration.
    seed
        Seed of the random starting ``theta`` (drawn from Beta(``delta``)).
    backend
        ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy); same code, same numbers to rounding.

    Returns
    -------
    DecontXResult
        Per-cell contamination, decontaminated counts and the iterations run.

    Raises
    ------
    InputError
        When ``clusters`` does not give one label per cell, has fewer than two labels, or a
        cell has no counts.
    """
    if max_iter < 1:
        raise InputError(f"DecontX needs at least one EM iteration, got max_iter={max_iter}")
    cells = sparse.csr_matrix(cells)
    if not cells.has_canonical_format:  # summed and sorted on a copy, leaving the caller's matrix be
        cells = cells.copy()
        cells.sum_duplicates()
    xp = array_module(backend)
    on_gpu = backend == "gpu"
    entries = _entries(
        cells, clusters, xp=xp, sparse_module=cupyx_sparse() if on_gpu else sparse, bins_by_product=on_gpu
    )
    theta = xp.asarray(np.random.default_rng(seed).beta(delta[0], delta[1], size=cells.shape[0]))
    prior = np.asarray(delta, dtype=np.float64)
    phi, eta = _profiles(entries.counts * theta[entries.cell], entries, floor=PSEUDOCOUNT)
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        native = _native_counts(entries, theta, phi, eta)
        phi, eta = _profiles(native, entries, floor=0.0)
        native_totals = entries.per_cell(native)
        # Rounding can put a share a hair outside [0, 1], where the Dirichlet fit takes logs.
        contamination = xp.clip((entries.cell_totals - native_totals) / entries.cell_totals, 0.0, 1.0)
        if estimate_delta:
            prior = fit_dirichlet_shares(contamination, xp=xp)
        updated = (native_totals + prior[0]) / (entries.cell_totals + prior.sum())
        change = float(xp.abs(updated - theta).max())
        theta = updated
        if change < convergence:
            break
    corrected = _native_counts(entries, theta, phi, eta)
    return DecontXResult(
        contamination=asnumpy(contamination),
        corrected=sparse.csr_matrix((asnumpy(corrected), cells.indices.copy(), cells.indptr.copy()), shape=cells.shape),
        iterations=iterations,
    )


def _entries(
    cells: sparse.csr_matrix, clusters: np.ndarray, *, xp: Any, sparse_module: ModuleType, bins_by_product: bool
) -> _Entries:
    """Check the input, move the non-zero counts (CSR, canonical) to the device once and index them there.

    ``bins_by_product`` builds the (cluster-gene, entry) matrix that sums by cluster and gene
    (the GPU's way); without it they are summed by ``bincount``.
    """
    n_cells, n_genes = cells.shape
    if len(clusters) != n_cells:
        raise InputError(f"DecontX needs one cluster label per cell: {len(clusters)} labels for {n_cells} cells")
    labels, cluster = np.unique(np.asarray(clusters), return_inverse=True)
    if labels.size < 2:
        raise InputError(
            f"DecontX needs at least two clusters (contamination comes from the others), got {labels.size}"
        )
    cell_totals = np.asarray(cells.sum(axis=1), dtype=np.float64).ravel()
    if (cell_totals <= 0).any():
        raise InputError(f"DecontX needs cells with counts: {int((cell_totals <= 0).sum())} cells have none")
    n_bins = labels.size * n_genes
    if bins_by_product and max(cells.nnz, n_bins) > max_gpu_sparse_entries():  # cuSPARSE's 32-bit indices
        raise InputError(
            f"DecontX on the GPU takes at most {max_gpu_sparse_entries():,} entries and cluster-gene pairs, got "
            f"{cells.nnz:,} and {n_bins:,}: run rule call_cells on the CPU (backend_per_rule: {{call_cells: cpu}})"
        )
    # The CSR arrays travel as they are (32-bit, counts often float32) and widen on the device;
    # on the host the index pointers are 64-bit, as SciPy's beyond 2^31 entries.
    indptr = xp.asarray(cells.indptr, dtype=xp.int32 if bins_by_product else xp.int64)
    genes = xp.asarray(cells.indices, dtype=xp.int32)
    counts = xp.asarray(cells.data).astype(xp.float64)
    # Every cell has entries, so a 1 where each cell after the first starts, summed, is the row.
    # 64-bit indices: NumPy converts narrower ones at every gather.
    starts = xp.zeros(cells.nnz, dtype=xp.int8)
    starts[indptr[1:-1]] = 1
    cell = xp.cumsum(starts, dtype=xp.int64)
    cluster_gene = xp.asarray(cluster)[cell] * n_genes + genes
    cluster_gene_by_entry = None
    if bins_by_product:
        entry = xp.arange(cells.nnz, dtype=xp.int32)
        cluster_gene_by_entry = sparse_module.coo_matrix(
            (xp.ones(cells.nnz), (cluster_gene.astype(xp.int32), entry)), shape=(n_bins, cells.nnz)
        ).tocsr()
    return _Entries(
        counts=counts,
        cell=cell,
        cluster_gene=cluster_gene,
        by_cell=sparse_module.csr_matrix((counts, genes, indptr), shape=(n_cells, n_genes)),
        gene_ones=xp.ones(n_genes),
        cluster_gene_by_entry=cluster_gene_by_entry,
        cell_totals=xp.asarray(cell_totals),
        n_clusters=int(labels.size),
    )


def _native_counts(entries: _Entries, theta: Any, phi: Any, eta: Any) -> Any:
    """Per entry, its counts times the posterior probability that they are native (decontX's ``normp``).

    ``p / (p + q)`` with ``p = (phi + pc)(theta + pc)`` and ``q = (eta + pc)(1 - theta + pc)``,
    written ``1 / (1 + q/p)`` with ``q/p`` the product of a gene ratio per cluster and an odds
    per cell: two gathers per entry instead of four, updated in place (the entries are many).
    """
    contaminant_ratio = (eta.ravel() + PSEUDOCOUNT) / (phi.ravel() + PSEUDOCOUNT)
    contaminant_odds = (1.0 - theta + PSEUDOCOUNT) / (theta + PSEUDOCOUNT)
    denominator = contaminant_ratio[entries.cluster_gene]
    denominator *= contaminant_odds[entries.cell]
    denominator += 1.0
    return entries.counts / denominator


def _profiles(native: Any, entries: _Entries, *, floor: float) -> tuple[Any, Any]:
    """Native profiles ``phi`` and contamination profiles ``eta``, clusters x genes, rows summing to 1.

    ``phi`` of a cluster is the native counts of its cells (plus ``floor``, as decontX's
    initialisation adds the pseudocount); its ``eta`` is the other clusters' ``phi`` summed.
    """
    phi = entries.per_cluster_gene(native) + floor
    eta = phi.sum(axis=0) - phi
    return phi / phi.sum(axis=1, keepdims=True), eta / eta.sum(axis=1, keepdims=True)


def fit_dirichlet_shares(contamination: Any, *, xp: Any) -> np.ndarray:
    """Maximum-likelihood Beta (``delta``) of the cells' (native, contamination) shares.

    ``MCMCprecision::fit_dirichlet`` on the two-column matrix decontX passes it: zeros are
    moved off the boundary by 1% of the smallest positive share, the method-of-moments start
    is floored at 0.01, then Minka's fixed point runs on the host (two numbers), fed with
    statistics reduced on the device.

    Parameters
    ----------
    contamination
        Per cell, the contamination share in [0, 1] (NumPy or CuPy).
    xp
        The array module of ``contamination``.

    Returns
    -------
    numpy.ndarray
        ``(native, contamination)`` concentrations.
    """
    shares = xp.stack([1.0 - contamination, contamination], axis=1)
    # Decided on the device (a shift of 0 leaves the shares as they are), so that the
    # statistics below are the one transfer.
    smallest_positive = xp.where(shares > 0, shares, xp.inf).min()
    shift = xp.where(shares.min() == 0, smallest_positive * 0.01, 0.0)
    shares = (shares + shift) / (1.0 + 2.0 * shift)
    shares = shares / shares.sum(axis=1, keepdims=True)
    mean_log, mean, mean_square = asnumpy(
        xp.stack([xp.log(shares).mean(axis=0), shares.mean(axis=0), (shares**2).mean(axis=0)])
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        start = (mean - mean_square) / (mean_square - mean**2) * mean
    # A non-finite start (all cells alike) is where MCMCprecision draws a random one; 1 is as good.
    alpha = np.where(np.isfinite(start), np.maximum(0.01, start), 1.0)
    for _ in range(DIRICHLET_MAX_ITER):
        previous = alpha
        alpha = _inverse_digamma(digamma(previous.sum()) + mean_log)
        if np.abs(previous - alpha).max() <= DIRICHLET_TOLERANCE:
            break
    return alpha


def _inverse_digamma(y: np.ndarray, *, newton_steps: int = 5) -> np.ndarray:
    """The ``x`` with ``digamma(x) == y``: Minka's start and Newton steps (``MCMCprecision::inv_digamma``)."""
    x = np.where(y < -2.22, -1.0 / (y - digamma(1.0)), np.exp(y) + 0.5)
    for _ in range(newton_steps):
        x = x - (digamma(x) - y) / polygamma(1, x)
    return x
