"""Quality control: per-cell metrics, cell and gene filtering, doublet scores."""

from __future__ import annotations

import logging
from typing import Any, Literal
from unittest.mock import patch

import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.backend import Backend, cuml, cupy, rapids_scrublet_class, rapids_singlecell
from omicsprep.errors import InputError

log = logging.getLogger(__name__)

# Metrics that MAD filtering looks at, on the log scale where counts are skewed.
MAD_METRICS = ("log1p_total_counts", "log1p_n_genes_by_counts")


def annotate_gene_groups(adata: AnnData, *, patterns: dict[str, str]) -> None:
    """Flag gene groups in ``adata.var`` by regular expressions on gene names.

    Parameters
    ----------
    adata
        Cells x genes.
    patterns
        Column name to regular expression, e.g. ``{"mt": "(?i)^mt-"}``; matched from the
        start of each gene name.
    """
    names = adata.var_names.to_series()
    for group, pattern in patterns.items():
        adata.var[group] = names.str.match(pattern).to_numpy()


def calculate_qc_metrics(adata: AnnData, *, qc_vars: list[str], backend: Backend) -> None:
    """Add per-cell and per-gene QC metrics (scanpy's names) to ``obs`` and ``var``.

    Parameters
    ----------
    adata
        Raw counts in ``X``.
    qc_vars
        Boolean columns of ``var`` whose share of counts is reported as
        ``pct_counts_<name>``.
    backend
        ``"cpu"`` (scanpy) or ``"gpu"`` (rapids-singlecell; ``X`` already on the device).
    """
    if backend == "gpu":
        rapids_singlecell().pp.calculate_qc_metrics(adata, qc_vars=qc_vars, log1p=True)
    else:
        import scanpy as sc

        sc.pp.calculate_qc_metrics(adata, qc_vars=qc_vars, percent_top=None, log1p=True, inplace=True)


def mad_outliers(values: pd.Series | np.ndarray, *, n_mads: float) -> np.ndarray:
    """Mark values more than ``n_mads`` median absolute deviations from the median.

    Parameters
    ----------
    values
        One metric per cell.
    n_mads
        How many MADs away counts as an outlier.

    Returns
    -------
    Boolean mask, ``True`` for outliers; all ``False`` when the MAD is zero (e.g. most
    cells without mitochondrial counts), where a spread cannot be judged.
    """
    values = np.asarray(values, dtype=float)
    median = np.nanmedian(values)
    mad = np.nanmedian(np.abs(values - median))
    if not mad > 0:
        return np.zeros(values.shape, dtype=bool)
    return np.abs(values - median) > n_mads * mad


def qc_pass_mask(
    adata: AnnData,
    *,
    method: Literal["thresholds", "mad"],
    min_genes: int | None = None,
    max_genes: int | None = None,
    min_counts: int | None = None,
    max_counts: int | None = None,
    max_pct_mt: float | None = None,
    n_mads: float = 5.0,
    n_mads_mt: float = 3.0,
) -> pd.Series:
    """Decide which cells pass QC and record why the others fail.

    Parameters
    ----------
    adata
        Cells with metrics from :func:`calculate_qc_metrics`.
    method
        ``"thresholds"`` applies the fixed limits; ``"mad"`` also drops cells that are
        outliers in log counts or log genes (``n_mads``) or in mitochondrial share
        (``n_mads_mt``, upper side), as in the single-cell best-practices book.
    min_genes, max_genes, min_counts, max_counts, max_pct_mt
        Fixed limits; ``None`` disables one. Applied with either method.
    n_mads, n_mads_mt
        MAD multipliers for ``method="mad"``.

    Returns
    -------
    The reason each cell fails (``""`` when it passes), indexed like ``adata.obs``.
    """
    obs = adata.obs
    checks: list[tuple[str, np.ndarray]] = []
    limits: list[tuple[str, float | None, pd.Series]] = [
        ("min_genes", min_genes, obs["n_genes_by_counts"] < (min_genes or 0)),
        ("max_genes", max_genes, obs["n_genes_by_counts"] > (max_genes or 0)),
        ("min_counts", min_counts, obs["total_counts"] < (min_counts or 0)),
        ("max_counts", max_counts, obs["total_counts"] > (max_counts or 0)),
    ]
    if "pct_counts_mt" in obs:
        limits.append(("max_pct_mt", max_pct_mt, obs["pct_counts_mt"] > (max_pct_mt or 0)))
    checks += [(name, np.asarray(failed)) for name, limit, failed in limits if limit is not None]
    if method == "mad":
        checks += [(f"mad_{metric}", mad_outliers(obs[metric], n_mads=n_mads)) for metric in MAD_METRICS]
        if "pct_counts_mt" in obs:
            pct_mt = obs["pct_counts_mt"].to_numpy()
            high = pct_mt > np.median(pct_mt)
            checks.append(("mad_pct_counts_mt", mad_outliers(pct_mt, n_mads=n_mads_mt) & high))
    reasons = pd.Series("", index=obs.index, dtype=object)
    for name, failed in checks:
        first = failed & (reasons == "").to_numpy()
        reasons[first] = name
    return reasons


DOUBLET_GROUP = "_doublet_group"


def score_doublets(
    adata: AnnData, *, expected_rate: float, max_cells_per_run: int, seed: int, backend: Backend
) -> None:
    """Score doublets with Scrublet; adds ``doublet_score`` and ``predicted_doublet``.

    Scrublet searches k = 0.5 sqrt(n) neighbours among the n cells scored together and 2n
    simulated doublets: its exact search costs about n^2 distances and its neighbour table
    grows as n^1.5. A sample of more than ``max_cells_per_run`` cells is therefore split at
    random into equal groups, each scored on its own, as Scrublet advises for separate
    lanes.

    Parameters
    ----------
    adata
        Raw counts of cells that passed QC; ``obs`` gains only the two columns.
    expected_rate
        Expected doublet rate of the assay.
    max_cells_per_run
        Most cells scored together.
    seed
        Seed for the groups and for simulating doublets.
    backend
        ``"cpu"`` (scanpy) or ``"gpu"`` (rapids-singlecell, with the neighbour
        classifier kept on the device: :func:`_classify_on_gpu`).
    """
    # Scrublet keeps only its most variable genes (about the top 15%), so a small gene
    # panel leaves fewer genes than 30 components.
    n_comps = max(2, min(30, adata.n_obs - 1, adata.n_vars // 10))
    n_groups = -(-adata.n_obs // int(max_cells_per_run))
    # scanpy replaces obs with its own per-group copies (which gain `n_genes`): the
    # original obs is restored with the two scores only.
    obs = adata.obs.copy()
    batch_key = None
    if n_groups > 1:
        batch_key = DOUBLET_GROUP
        order = np.random.default_rng(seed).permutation(adata.n_obs)
        adata.obs[batch_key] = pd.Categorical((order % n_groups).astype(str))
        log.info("doublets: %d cells scored in %d groups", adata.n_obs, n_groups)
    try:
        if backend == "gpu":
            with patch.object(rapids_scrublet_class(), "_nearest_neighbor_classifier", _classify_on_gpu):
                rapids_singlecell().pp.scrublet(
                    adata,
                    expected_doublet_rate=expected_rate,
                    n_prin_comps=n_comps,
                    batch_key=batch_key,
                    rng=seed,
                    verbose=False,
                )
        else:
            import scanpy as sc

            # Exact neighbours: no pynndescent compilation, and the same graph as on the GPU.
            sc.pp.scrublet(
                adata,
                expected_doublet_rate=expected_rate,
                n_prin_comps=n_comps,
                batch_key=batch_key,
                use_approx_neighbors=False,
                random_state=seed,
                verbose=False,
            )
        scores = adata.obs.loc[obs.index]
        obs["doublet_score"] = scores["doublet_score"].to_numpy()
        obs["predicted_doublet"] = scores["predicted_doublet"].to_numpy().astype(bool)
    finally:
        adata.obs = obs
    # The grouping column is not kept, so the record of it would point nowhere.
    adata.uns["scrublet"].pop("batched_by", None)


def _classify_on_gpu(
    self: Any,  # rapids-singlecell's Scrublet
    k: int = 40,
    *,
    use_approx_nn: bool = True,  # unused: the search is exact, as in rapids-singlecell
    distance_metric: str = "euclidean",
    exp_doub_rate: float = 0.1,
    stdev_doub_rate: float = 0.03,
    get_neighbor_parents: bool = False,
) -> None:
    """rapids-singlecell's Scrublet neighbour classifier (same arithmetic), its neighbour table kept on the device.

    rapids-singlecell (0.18) copies the k-neighbour table to the host and labels it with
    Python strings, which dominates the run on large samples. Here the table stays in GPU
    memory and simulated neighbours are counted by index.
    """
    if get_neighbor_parents:
        msg = "doublet neighbour parents are not computed on the GPU"
        raise NotImplementedError(msg)
    cp = cupy()
    observed, simulated = cp.asarray(self.manifold_obs_), cp.asarray(self.manifold_sim_)
    n_obs, n_sim = len(observed), len(simulated)
    manifold = cp.concatenate([observed, simulated])
    k_adj = round(k * (1 + n_sim / n_obs))
    search = cuml().neighbors.NearestNeighbors(n_neighbors=k_adj, metric=distance_metric, output_type="cupy")
    search.fit(manifold)
    _, neighbors = search.kneighbors(manifold)
    # The first neighbour is the cell itself; simulated doublets follow the cells.
    nd = cp.asnumpy((neighbors[:, 1:] >= n_obs).sum(axis=1)).astype(np.float64)
    del neighbors
    # rapids-singlecell's arithmetic, in NumPy as there, so the scores are the same.
    rho, r, big_n = exp_doub_rate, n_sim / float(n_obs), float(k_adj)
    q = (nd + 1) / (big_n + 2)
    ld = q * rho / r / (1 - rho - q * (1 - rho - rho / r))
    se_q = np.sqrt(q * (1 - q) / (big_n + 3))
    se_ld = (
        q
        * rho
        / r
        / (1 - rho - q * (1 - rho - rho / r)) ** 2
        * np.sqrt((se_q / q * (1 - rho)) ** 2 + (stdev_doub_rate / rho * (1 - q)) ** 2)
    )
    self.doublet_scores_obs_, self.doublet_scores_sim_ = ld[:n_obs], ld[n_obs:]
    self.doublet_errors_obs_, self.doublet_errors_sim_ = se_ld[:n_obs], se_ld[n_obs:]


def filter_genes(adata: AnnData, *, min_cells: int, backend: Backend) -> None:
    """Drop, in place, genes detected in fewer than ``min_cells`` cells."""
    if backend == "gpu":
        rapids_singlecell().pp.filter_genes(adata, min_cells=min_cells, verbose=False)
    else:
        import scanpy as sc

        sc.pp.filter_genes(adata, min_cells=min_cells)


def require_cells(adata: AnnData, *, minimum: int, after: str) -> None:
    """Fail clearly when fewer than ``minimum`` cells are left.

    Raises
    ------
    InputError
        Too few cells remain after the step named ``after``.
    """
    if adata.n_obs < minimum:
        msg = f"only {adata.n_obs} cells left after {after} (at least {minimum} needed); loosen the QC settings"
        raise InputError(msg)
