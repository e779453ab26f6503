"""Reading CellBender ``remove-background``'s output (see :mod:`omicsprep.cells.cellbender`)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.errors import InputError
from omicsprep.io.counts import read_counts
from omicsprep.timings import timed_phase

# Per-droplet estimates CellBender writes for the barcodes it analysed (droplet_latents/).
DROPLET_LATENTS = ("cell_probability", "background_fraction", "cell_size", "droplet_efficiency")


@timed_phase("read")
def read_cellbender(path: str | Path, *, feature_type: str = "Gene Expression") -> AnnData:
    """CellBender's corrected counts, with its per-barcode estimates.

    Parameters
    ----------
    path
        The ``.h5`` file CellBender wrote (``--output``; its ``*_filtered.h5`` reads the
        same way, with the cells alone).
    feature_type
        The features to keep, as :func:`~omicsprep.io.read_counts` keeps them.

    Returns
    -------
    AnnData
        Barcodes x genes, corrected counts in a CSR ``X`` (float32), barcodes and genes
        named as :func:`~omicsprep.io.read_counts` names those of the raw matrix.
        ``obs["analyzed"]`` marks the barcodes CellBender modelled (the others, surely
        empty, have no counts); for them ``obs`` has ``cell_probability`` (a cell when
        > 0.5, CellBender's call), ``background_fraction`` (the share of the droplet's
        counts removed), ``cell_size`` and ``droplet_efficiency`` (NaN elsewhere).
        ``var["ambient_expression"]`` is the inferred ambient profile and
        ``var["analyzed"]`` marks the genes modelled (the others are left uncorrected in
        cells). ``uns["cellbender"]`` holds the target false positive rate and the
        training curve (``train_elbo`` per epoch).

    Raises
    ------
    InputError
        The file is missing or unreadable, or is a count matrix CellBender did not write.
    """
    path = Path(path)
    corrected = read_counts(path, fmt="10x_h5", feature_type=feature_type)
    try:
        with h5py.File(path, "r") as handle:
            if "droplet_latents" not in handle:
                raise InputError("has no droplet_latents: not an output of CellBender remove-background", path=path)
            latents = {name: handle["droplet_latents"][name][()] for name in handle["droplet_latents"]}
            ambient = handle["global_latents/ambient_expression"][()]
            metadata = handle["metadata"]
            analyzed_genes = metadata["features_analyzed_inds"][()]
            fpr = float(metadata["target_false_positive_rate"][0])
            train_elbo = metadata["learning_curve_train_elbo"][()]
            feature_types = handle["matrix/features/feature_type"][()].astype(str)
    except InputError:
        raise
    except (OSError, KeyError) as exc:
        raise InputError(f"cannot be read as CellBender output ({type(exc).__name__}: {exc})", path=path) from exc
    # Latents and gene indices refer to every feature of the file, before read_counts kept one type.
    kept_features = feature_types == feature_type
    analyzed_gene = np.zeros(feature_types.size, dtype=bool)
    analyzed_gene[analyzed_genes] = True
    corrected.var["ambient_expression"] = ambient[kept_features]
    corrected.var["analyzed"] = analyzed_gene[kept_features]
    corrected.obs = _droplet_latents(latents, n_barcodes=corrected.n_obs, index=corrected.obs_names)
    corrected.uns["cellbender"] = {"target_false_positive_rate": fpr, "train_elbo": np.asarray(train_elbo)}
    return corrected


def _droplet_latents(latents: dict[str, np.ndarray], *, n_barcodes: int, index: pd.Index) -> pd.DataFrame:
    """Per-barcode estimates, NaN for the barcodes CellBender did not analyse.

    The full output indexes its latents by ``barcode_indices_for_latents``; the filtered
    output keeps those indices of every analysed barcode but writes the latents of its own
    barcodes alone, in their order.
    """
    rows = latents["barcode_indices_for_latents"]
    if rows.size != latents["cell_probability"].size:
        rows = np.arange(n_barcodes)
    obs = pd.DataFrame({"analyzed": np.zeros(n_barcodes, dtype=bool)}, index=index)
    obs.iloc[rows, 0] = True
    for name in DROPLET_LATENTS:
        column = np.full(n_barcodes, np.nan)
        column[rows] = latents[name]
        obs[name] = column
    return obs
