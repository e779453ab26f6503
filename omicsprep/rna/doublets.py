"""Scrublet's doublet scores, computed alike on either backend.

The steps are scanpy's Scrublet (Wolock et al. 2019) as ``scanpy.pp.scrublet`` runs it with
exact neighbours: genes in at least 3 cells, cells with at least 3 genes, highly variable
genes of the median-normalized log counts, doublets simulated by adding the raw counts of
random pairs of cells, both normalized to 10^6, z-scored with the observed cells' gene
statistics, PCA fitted on the observed cells, and each cell scored by the share of simulated
doublets among its nearest other points. One deliberate difference from scanpy: a simulated
doublet identical to the cell (its partner has no counts in the variable genes) is counted,
where scanpy's sparse distance graph drops the zero distance.

The pairs are drawn on the host from one seeded stream, the one scanpy draws them from, so
that both backends score the same simulated doublets; the arithmetic is float64 on both.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.backend import Backend, array_module, asnumpy, cuml, single_cell_api

# Scrublet's defaults, as scanpy and rapids-singlecell keep them.
SIM_DOUBLET_RATIO = 2.0
MIN_CELLS_PER_GENE = 3
MIN_GENES_PER_CELL = 3


class DoubletScores(NamedTuple):
    """Scores and calls of one group of cells.

    ``scored`` flags the cells Scrublet kept (at least 3 genes); ``scores`` and
    ``predicted`` are theirs, in the group's order. ``record`` is what scanpy keeps in
    ``uns["scrublet"]``.
    """

    scored: np.ndarray
    scores: np.ndarray
    predicted: np.ndarray
    record: dict[str, Any]


def doublet_pairs(n_cells: int, *, n_doublets: int, seed: int) -> np.ndarray:
    """Random distinct ordered pairs of cells, ``n_doublets`` x 2, drawn on the host.

    The same draw as scanpy's (a ``RandomState(seed)`` sampling the n^2 grid without
    replacement), so a seed gives the same simulated doublets as ``scanpy.pp.scrublet``.
    """
    cells = sample_without_replacement(n_cells * n_cells, n_doublets, random_state=np.random.RandomState(seed))
    return np.vstack(np.unravel_index(cells, (n_cells, n_cells))).T


def sample_without_replacement(n_population: int, n_samples: int, *, random_state: np.random.RandomState) -> np.ndarray:
    """scikit-learn's ``sample_without_replacement``, the same integers in the same order, vectorized.

    For the small samples of a large population that Scrublet draws (at most 1% of it),
    scikit-learn calls ``random_state.randint(n_population)`` once per integer and draws
    again on a repeat: 0.1 s per 40,000, seconds for a sample scored in groups. A
    ``RandomState`` gives the same stream one value or many at a time, so the first
    ``n_samples`` distinct values of a vector of draws are the same integers; other ratios
    go to scikit-learn itself. ``random_state`` may advance further than scikit-learn's
    would (the draws after the last value kept): give each call a fresh one.
    """
    if n_population == 0 or n_samples / n_population > 0.01:  # scikit-learn's own choice of method
        from sklearn.utils.random import sample_without_replacement as sample_in_loop

        return sample_in_loop(n_population, n_samples, random_state=random_state)
    draws = np.empty(0, dtype=np.int64)
    while True:
        draws = np.concatenate([draws, random_state.randint(n_population, size=n_samples)])
        _, first = np.unique(draws, return_index=True)
        if len(first) >= n_samples:
            return draws[np.sort(first)[:n_samples]]


def scrublet(counts: Any, *, expected_rate: float, n_comps: int, seed: int, backend: Backend) -> DoubletScores:
    """Score one group of cells for doublets.

    Parameters
    ----------
    counts
        Raw counts, cells x genes, a CSR matrix on the backend's device; not modified.
    expected_rate
        Expected doublet rate of the assay.
    n_comps
        Principal components of the neighbour search.
    seed
        Seed of the simulated pairs and of the CPU's PCA.
    backend
        ``"cpu"`` (scikit-learn) or ``"gpu"`` (CuPy and cuML).

    Returns
    -------
    The scores and calls; the threshold is the minimum between the two modes of the
    simulated doublets' scores, and no cell is called where there is none.
    """
    xp = array_module(backend)
    api = single_cell_api(backend)
    genes = _expressed(counts, axis=0, backend=backend) >= MIN_CELLS_PER_GENE
    counts = counts[:, xp.flatnonzero(genes)]
    scored = _expressed(counts, axis=1, backend=backend) >= MIN_GENES_PER_CELL
    counts = counts[xp.flatnonzero(scored)]
    # Unnamed cells and genes, each table shared by the AnnData objects of its size: making
    # and checking default names took a fifth of a group's time on the GPU.
    cell_names = _numbered(counts.shape[0])
    observed = AnnData(counts.copy(), obs=cell_names, var=_numbered(counts.shape[1]))
    api.pp.normalize_total(observed)
    observed.layers["log1p"] = observed.X.copy()
    api.pp.log1p(observed, layer="log1p")
    api.pp.highly_variable_genes(observed, layer="log1p", flavor="seurat")
    variable = xp.flatnonzero(xp.asarray(observed.var["highly_variable"].to_numpy()))
    genes = _numbered(len(variable))
    observed = AnnData(observed.X[:, variable], obs=cell_names, var=genes)
    counts = counts[:, variable]
    pairs = doublet_pairs(observed.n_obs, n_doublets=int(observed.n_obs * SIM_DOUBLET_RATIO), seed=seed)
    device_pairs = xp.asarray(pairs)
    simulated = AnnData(counts[device_pairs[:, 0]] + counts[device_pairs[:, 1]], obs=_numbered(len(pairs)), var=genes)
    for cells in (observed, simulated):
        api.pp.normalize_total(cells, target_sum=1e6)
    manifold_obs, manifold_sim = _embed(observed.X, simulated.X, n_comps=n_comps, seed=seed, backend=backend)
    n_neighbors = round(0.5 * np.sqrt(observed.n_obs))
    scores = _neighbour_scores(
        manifold_obs, manifold_sim, n_neighbors=n_neighbors, expected_rate=expected_rate, backend=backend
    )
    n_obs = observed.n_obs
    scores_obs, scores_sim = scores[:n_obs], scores[n_obs:]
    record: dict[str, Any] = {
        "doublet_scores_sim": scores_sim,
        "doublet_parents": pairs,
        "parameters": {
            "expected_doublet_rate": expected_rate,
            "sim_doublet_ratio": SIM_DOUBLET_RATIO,
            "n_neighbors": n_neighbors,
            "random_state": seed,
        },
    }
    threshold = _threshold(scores_sim)
    if threshold is None:
        predicted = np.zeros(n_obs, dtype=bool)
    else:
        record["threshold"] = threshold
        predicted = scores_obs > threshold
    return DoubletScores(asnumpy(scored), scores_obs, predicted, record)


def _numbered(n: int) -> pd.DataFrame:
    """A table of ``n`` rows named ``"0"``, ``"1"``, ...: AnnData's default names."""
    return pd.DataFrame(index=pd.RangeIndex(n).astype(str))


def _expressed(counts: Any, *, axis: int, backend: Backend) -> Any:
    """Cells expressing each gene (``axis=0``) or genes expressed by each cell (``axis=1``)."""
    indicator = counts.copy()
    indicator.data = (indicator.data > 0).astype(indicator.dtype)
    return array_module(backend).asarray(indicator.sum(axis=axis)).ravel()


def _embed(observed: Any, simulated: Any, *, n_comps: int, seed: int, backend: Backend) -> tuple[Any, Any]:
    """Both sets z-scored with the observed cells' gene means and deviations, then projected on their PCA."""
    xp = array_module(backend)
    # Gene means and deviations of the observed cells as scanpy computes them (float64 sums of
    # the values and their squares, unbiased variance), so that the z-scores match its to the last bits.
    values = observed.astype(xp.float64)
    n_cells = observed.shape[0]
    mean = xp.asarray(values.sum(axis=0)).ravel() / n_cells
    variance = (xp.asarray(values.multiply(values).sum(axis=0)).ravel() / n_cells - mean**2) * (n_cells / (n_cells - 1))
    scale = 1 / xp.sqrt(variance)
    z_obs = (values.toarray() - mean) * scale
    z_sim = (simulated.astype(xp.float64).toarray() - mean) * scale
    if backend == "gpu":
        pca = cuml().decomposition.PCA(n_components=n_comps, svd_solver="full", output_type="cupy")
    else:
        from sklearn.decomposition import PCA

        pca = PCA(n_components=n_comps, random_state=np.random.RandomState(seed), svd_solver="arpack")
    pca.fit(z_obs)
    return pca.transform(z_obs), pca.transform(z_sim)


def _neighbour_scores(
    manifold_obs: Any, manifold_sim: Any, *, n_neighbors: int, expected_rate: float, backend: Backend
) -> np.ndarray:
    """Scrublet's Bayesian doublet likelihood, observed cells first (its error and z-scores are not kept).

    Each point's neighbourhood is its ``k_adj - 1`` nearest other points, ``k_adj`` being
    ``n_neighbors`` scaled by the share of simulated points (scanpy's and
    rapids-singlecell's convention); the search is exact.
    """
    xp = array_module(backend)
    n_obs, n_sim = len(manifold_obs), len(manifold_sim)
    manifold = xp.concatenate([manifold_obs, manifold_sim])
    k_adj = round(n_neighbors * (1 + n_sim / float(n_obs)))
    if backend == "gpu":
        search = cuml().neighbors.NearestNeighbors(n_neighbors=k_adj, output_type="cupy")
    else:
        from sklearn.neighbors import NearestNeighbors

        search = NearestNeighbors(n_neighbors=k_adj, algorithm="brute")
    search.fit(manifold)
    _, neighbors = search.kneighbors(manifold)
    # The point itself is in its table (distance 0) but not counted; the table stays on
    # the device and only the counts come back. Counted by a product with ones (exact in
    # float32 below 2^24), not ``.sum(axis=1)``: CuPy compiles its row reductions for a
    # block size that grows with k, so every new range of group sizes compiled one, 1.5 s
    # on a machine's first sample of that size.
    itself = xp.arange(len(manifold))[:, None]
    simulated_neighbors = ((neighbors >= n_obs) & (neighbors != itself)).astype(xp.float32)
    nd = asnumpy(simulated_neighbors @ xp.ones(neighbors.shape[1], dtype=xp.float32)).astype(np.float64)
    del simulated_neighbors, neighbors
    rho, r, big_n = expected_rate, n_sim / float(n_obs), float(k_adj)
    q = (nd + 1) / (big_n + 2)
    ld = q * rho / r / (1 - rho - q * (1 - rho - rho / r))
    return ld


def _threshold(scores_sim: np.ndarray) -> float | None:
    """The minimum between the two modes of the simulated doublets' scores, or ``None`` without two modes."""
    from skimage.filters import threshold_minimum

    try:
        return float(threshold_minimum(scores_sim))
    except RuntimeError:  # skimage: the histogram does not become bimodal
        return None
