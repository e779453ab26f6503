"""Cells from raw droplets: every barcode's totals, ranks and test, and the cells called.

One table per sample holds every barcode of the raw matrix, whichever method calls the
cells, so that the report and later rules read the same columns for each method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.backend import Backend
from omicsprep.cells import emptydrops, soupx
from omicsprep.cells.ranks import BarcodeRanks, barcode_ranks, rank_totals
from omicsprep.errors import InputError
from omicsprep.options import CellOptions

# Cell Ranger's initial call assumes this many cells when none are expected.
CELL_RANGER_EXPECTED_CELLS = 3000
TEST_COLUMNS = ("log_prob", "p_value", "limited", "fdr")


@dataclass(frozen=True)
class CellCalls:
    """A sample's cell calls.

    ``table`` has one row per barcode (indexed by barcode, the raw matrix's order): ``total``,
    ``rank``, the test's ``log_prob``, ``p_value``, ``limited`` and ``fdr`` (NaN where not
    tested), ``is_cell`` and ``method``. ``ranks`` is the barcode-rank curve; ``ambient`` the
    ambient profile (proportions per gene, of the barcodes with at most ``lower`` UMIs).
    """

    table: pd.DataFrame
    ranks: BarcodeRanks
    ambient: np.ndarray


def call_cells(raw: AnnData, *, options: CellOptions, given: pd.Index | None = None, backend: Backend) -> CellCalls:
    """Call the cells among a raw matrix's barcodes.

    Parameters
    ----------
    raw
        Every barcode x genes, raw counts (CSR ``X``).
    options
        The method and its settings (section ``cells``).
    given
        Barcodes already called (a filtered matrix's): they are the cells, and ``method`` is
        ``input``; ``None``: ``options.method`` calls them.
    backend
        Where emptyDrops' Monte Carlo runs, ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The calls; ``raw`` is not changed.

    Raises
    ------
    InputError
        No empty droplets (every barcode has more than ``lower`` UMIs: a filtered matrix given
        as raw?), no barcode above ``lower``, more cells expected than barcodes, barcodes of
        ``given`` missing from ``raw``, or no cell called.
    """
    # float64 whatever the counts' dtype: the knee (DropletUtils' 10 ** log10 of a total, 1985.0000000000002
    # for 1985) compared as R compares it, float32 totals rounding it to the total.
    totals = np.asarray(raw.X.sum(axis=1, dtype=np.float64)).ravel()
    method = "input" if given is not None else options.method
    if method != "none":  # every barcode a cell: no droplet need be empty
        _check_droplets(totals, options=options)
    ranks = _barcode_ranks(totals, lower=options.lower, required=method in ("knee", "emptydrops"))
    table = pd.DataFrame({"total": totals, "rank": ranks.rank}, index=raw.obs_names.copy())
    table.index.name = "barcode"
    for column in TEST_COLUMNS:
        table[column] = np.nan
    if given is not None:
        missing = given.difference(table.index)
        if len(missing):
            raise InputError(
                f"{len(missing)} of the filtered matrix's barcodes are not in the raw matrix ({missing[0]!r}, ...)"
            )
        is_cell = table.index.isin(given)
    elif method in ("emptydrops", "emptydrops_cr"):
        result = _test_droplets(raw, ranks=ranks, options=options, backend=backend)
        for column in TEST_COLUMNS:
            table[column] = result.table[column].to_numpy()
        is_cell = (table["fdr"] <= options.fdr).to_numpy()
    elif method == "knee":
        is_cell = totals >= ranks.knee
    else:
        is_cell = totals > 0
    table["is_cell"] = is_cell
    table["method"] = method
    if not is_cell.any():
        raise InputError(
            f"no cell called among {len(totals)} barcodes (cells.method {method}, fdr {options.fdr}, "
            f"knee {ranks.knee:g} UMIs): is this a raw (unfiltered) matrix of droplets?"
        )
    # The ambient profile shown in the report: SoupX's soup of the droplets with at most lower UMIs
    # (none with method none and no such droplet).
    try:
        ambient = soupx.soup_profile(raw.X, soup_range=(0, options.lower + 1))
    except ValueError:
        ambient = np.full(raw.n_vars, np.nan)
    return CellCalls(table=table, ranks=ranks, ambient=ambient)


def _barcode_ranks(totals: np.ndarray, *, lower: int, required: bool) -> BarcodeRanks:
    """DropletUtils' barcode ranks, or the ranks alone (knee and inflection NaN).

    The latter where the method needs no knee and there are too few distinct totals for one.
    """
    try:
        return barcode_ranks(totals, lower=lower)
    except ValueError as exc:  # DropletUtils' own refusal: too few distinct totals above lower
        if required:
            raise InputError(f"barcode ranks: {exc} (cells.lower = {lower})") from exc
    rank = rank_totals(totals)
    return BarcodeRanks(knee=np.nan, inflection=np.nan, rank=rank, fitted=np.full(totals.size, np.nan))


def _check_droplets(totals: np.ndarray, *, options: CellOptions) -> None:
    n_empty = int(np.count_nonzero(totals <= options.lower))
    if n_empty == 0:
        raise InputError(
            f"has no empty droplets: all {totals.size} barcodes have more than cells.lower = {options.lower} UMIs "
            "(a filtered matrix given as raw?)"
        )
    if n_empty == totals.size:
        raise InputError(f"no barcode has more than cells.lower = {options.lower} UMIs: no droplet can be a cell")
    expected = options.expected_cells
    if expected is not None and expected > totals.size:
        raise InputError(f"cells.expected_cells = {expected} is more than the {totals.size} barcodes of the matrix")


def _test_droplets(
    raw: AnnData, *, ranks: BarcodeRanks, options: CellOptions, backend: Backend
) -> emptydrops.EmptyDropsResult:
    if options.method == "emptydrops_cr":
        cr = options.emptydrops_cr
        return emptydrops.empty_drops_cell_ranger(
            raw.X,
            expected_cells=options.expected_cells or CELL_RANGER_EXPECTED_CELLS,
            max_percentile=cr.max_percentile,
            max_min_ratio=cr.max_min_ratio,
            umi_min=cr.umi_min,
            umi_min_frac_median=cr.umi_min_frac_median,
            candidates_max=cr.candidates_max,
            ambient_rank_min=cr.ambient_rank_min,
            ambient_rank_max=cr.ambient_rank_max,
            niters=options.niters,
            seed=options.seed,
            backend=backend,
        )
    return emptydrops.empty_drops(
        raw.X,
        lower=options.lower,
        niters=options.niters,
        test_ambient=options.test_ambient,
        ignore=options.ignore,
        retain=ranks.knee if options.retain is None else options.retain,
        by_rank=options.by_rank,
        seed=options.seed,
        backend=backend,
    )


def called_cells(adata: AnnData, *, is_cell: pd.Series) -> AnnData:
    """The barcodes of ``adata`` that the sample's cell calling called cells (a copy).

    Parameters
    ----------
    adata
        Barcodes x features of another modality of the sample (its antibody tags).
    is_cell
        Whether each barcode is a cell (the calls' table column, indexed by barcode).

    Raises
    ------
    InputError
        None of ``adata``'s barcodes is a called cell.
    """
    keep = is_cell.reindex(adata.obs_names, fill_value=False).to_numpy(dtype=bool)
    if not keep.any():
        raise InputError(f"none of the {adata.n_obs} barcodes is among the cells called on the RNA")
    return adata[keep].copy()
