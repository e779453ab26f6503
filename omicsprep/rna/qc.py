"""Quality control: per-cell metrics, cell and gene filtering, doublet scores."""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.backend import Backend, is_dask_array, keep_columns, rapids_singlecell, take_rows
from omicsprep.errors import TooFewCellsError
from omicsprep.options import FilterOptions
from omicsprep.rna import doublets

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


def score_doublets(
    adata: AnnData, *, expected_rate: float, max_cells_per_run: int, seed: int, backend: Backend
) -> None:
    """Score doublets with Scrublet; adds ``doublet_score`` and ``predicted_doublet``.

    Scrublet searches k = 0.5 sqrt(n) neighbours among the n cells scored together and 2n
    simulated doublets: its exact search costs about n^2 distances and its neighbour table
    grows as n^1.5. A sample of more than ``max_cells_per_run`` cells is therefore split at
    random into equal groups, each scored on its own, as Scrublet advises for separate
    lanes. Both backends score the same simulated doublets (:mod:`omicsprep.rna.doublets`).

    Parameters
    ----------
    adata
        Raw counts of cells that passed QC; ``obs`` gains only the two columns (cells with
        fewer than 3 genes are not scored: NaN, not called), ``uns["scrublet"]`` Scrublet's
        record (one per group under ``"batches"`` when grouped).
    expected_rate
        Expected doublet rate of the assay.
    max_cells_per_run
        Most cells scored together.
    seed
        Seed for the groups and for simulating doublets.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    # Scrublet keeps only its most variable genes (about the top 15%), so a small gene
    # panel leaves fewer genes than 30 components.
    n_comps = max(2, min(30, adata.n_obs - 1, adata.n_vars // 10))
    n_groups = -(-adata.n_obs // int(max_cells_per_run))
    group = np.zeros(adata.n_obs, dtype=np.int64)
    if n_groups > 1:
        group = np.random.default_rng(seed).permutation(adata.n_obs) % n_groups
        log.info("doublets: %d cells scored in %d groups", adata.n_obs, n_groups)
    scores = np.full(adata.n_obs, np.nan)
    predicted = np.zeros(adata.n_obs, dtype=bool)
    records = {}
    for label in range(n_groups):
        cells = np.flatnonzero(group == label)
        result = doublets.scrublet(
            take_rows(adata.X, cells),
            expected_rate=expected_rate,
            n_comps=n_comps,
            seed=seed,
            backend=backend,
        )
        scores[cells[result.scored]] = result.scores
        predicted[cells[result.scored]] = result.predicted
        records[str(label)] = result.record
    adata.obs["doublet_score"] = scores
    adata.obs["predicted_doublet"] = predicted
    adata.uns["scrublet"] = records["0"] if n_groups == 1 else {"batches": records}


def filter_genes(adata: AnnData, *, min_cells: int, backend: Backend) -> None:
    """Drop, in place, genes detected in fewer than ``min_cells`` cells."""
    if backend == "gpu" and is_dask_array(adata.X):  # row blocks: each block's columns taken on the GPU
        keep, n_cells = rapids_singlecell().pp.filter_genes(adata.X, min_cells=min_cells, inplace=False, verbose=False)
        matrix, adata.X = adata.X, None
        adata.var["n_cells"] = n_cells
        adata._inplace_subset_var(keep)  # noqa: SLF001 - as scanpy's and rapids-singlecell's filter_genes do
        adata.X = keep_columns(matrix, keep)
    elif backend == "gpu":
        rapids_singlecell().pp.filter_genes(adata, min_cells=min_cells, verbose=False)
    else:
        import scanpy as sc

        sc.pp.filter_genes(adata, min_cells=min_cells)


def require_cells(adata: AnnData, *, minimum: int, after: str, metrics: pd.DataFrame, settings: dict[str, Any]) -> None:
    """Fail clearly when fewer than ``minimum`` cells are left: which filters removed how many, of how many.

    Parameters
    ----------
    adata
        The cells left.
    minimum
        Fewest cells the sample may keep.
    after
        The step that removed cells, named in the message.
    metrics
        Every input cell's QC metrics and ``fail_reason`` (empty: kept); carried by the error.
    settings
        Each fail reason's setting (``{"min_genes": 200, "mad_log1p_total_counts": "5 MADs"}``).

    Raises
    ------
    TooFewCellsError
        Too few cells remain, e.g. "only 0 cells left after cell filtering (at least 30 needed):
        min_genes 200 removed 1,107 of 1,107 cells; median per input cell: 45 genes, 61 UMIs".
    """
    if adata.n_obs >= minimum:
        return
    removed = metrics["fail_reason"][metrics["fail_reason"] != ""].value_counts()
    in_order = [reason for reason in settings if reason in removed.index]  # as the filters were applied
    filters = ", ".join(f"{reason} {settings[reason]} removed {removed[reason]:,}" for reason in in_order)
    medians = [f"{metrics['n_genes_by_counts'].median():,.0f} genes", f"{metrics['total_counts'].median():,.0f} UMIs"]
    if "pct_counts_mt" in metrics:
        medians.append(f"{metrics['pct_counts_mt'].median():.1f}% mitochondrial")
    problem = f"only {adata.n_obs} cells left after {after} (at least {minimum} needed): "
    if filters:
        problem += f"{filters} of {len(metrics):,} cells; median per input cell: {', '.join(medians)}; "
        problem += "loosen the QC settings"
    else:
        problem += f"the sample holds {len(metrics):,} cells, none removed; qc.min_cells_left asks more"
    raise TooFewCellsError(problem, metrics=metrics)


def filter_settings(filter_options: FilterOptions) -> dict[str, Any]:
    """Each fail reason of :func:`qc_pass_mask` with its setting, as :func:`require_cells` names them."""
    settings = {
        name: getattr(filter_options, name)
        for name in ("min_genes", "max_genes", "min_counts", "max_counts", "max_pct_mt")
        if getattr(filter_options, name) is not None
    }
    settings.update({f"mad_{metric}": f"({filter_options.n_mads} MADs)" for metric in MAD_METRICS})
    settings["mad_pct_counts_mt"] = f"({filter_options.n_mads_mt} MADs)"
    return settings
