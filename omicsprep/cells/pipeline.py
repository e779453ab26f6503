"""Rule call_cells as one chain: cells called among raw droplets, then ambient RNA removed."""

from __future__ import annotations

import logging
from dataclasses import asdict

import numpy as np
from anndata import AnnData

from omicsprep.backend import Backend
from omicsprep.cells import ambient, calling
from omicsprep.errors import InputError
from omicsprep.options import (
    CellOptions,
)
from omicsprep.provenance import StepTimer, record_provenance

log = logging.getLogger(__name__)


def run_call_cells(
    raw: AnnData,
    *,
    filtered: AnnData | None,
    cellbender: AnnData | None,
    options: CellOptions,
    backend: Backend,
) -> tuple[AnnData, calling.CellCalls]:
    """Call the cells among a sample's raw droplets and remove ambient RNA from them.

    Parameters
    ----------
    raw
        Every barcode x genes, raw counts.
    filtered
        The sample's already called cells (a filtered matrix), or ``None``: then
        ``options.method`` calls them.
    cellbender
        CellBender's corrected counts, for ``options.ambient.method`` ``cellbender``.
    options
        Section ``cells``: the calling method and the ambient removal.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The cells (ambient-corrected counts in ``X`` when a method removes them, the raw ones in
    ``layers["counts_uncorrected"]``) and the calls of every barcode, whose table gets each
    cell's ``ambient_fraction``.

    Raises
    ------
    InputError
        ``filtered`` with other genes than ``raw``, or what :func:`omicsprep.cells.calling.call_cells`
        raises.
    """
    timer = StepTimer(backend=backend)
    if filtered is not None and not filtered.var_names.equals(raw.var_names):
        differ = filtered.var_names.symmetric_difference(raw.var_names)
        raise InputError(
            f"the raw matrix's genes differ from the input's ({raw.n_vars} vs {filtered.n_vars} genes; "
            f"{len(differ)} in one only, e.g. {differ[0]!r})"
            if len(differ)
            else "the raw matrix's genes are in another order than the input's"
        )
    with timer.step("call_cells"):
        calls = calling.call_cells(
            raw, options=options, given=None if filtered is None else filtered.obs_names, backend=backend
        )
    cells = raw[calls.table["is_cell"].to_numpy()].copy()
    with timer.step("ambient"):
        ambient.remove_ambient(
            cells,
            raw=raw,
            options=options.ambient,
            cellbender_output=cellbender,
            seed=options.seed,
            backend=backend,
        )
    calls.table["ambient_fraction"] = np.nan
    if "ambient_fraction" in cells.obs:
        calls.table.loc[cells.obs_names, "ambient_fraction"] = cells.obs["ambient_fraction"].to_numpy()
    cells.uns["cells"] = {
        "method": str(calls.table["method"].iloc[0]),
        "n_cells": int(cells.n_obs),
        "n_barcodes": int(raw.n_obs),
        "knee": float(calls.ranks.knee),
        "inflection": float(calls.ranks.inflection),
    }
    record_provenance(cells, rule="call_cells", backend=backend, params=asdict(options), timings=timer.seconds)
    return cells, calls
