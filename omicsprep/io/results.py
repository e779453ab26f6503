"""Reading back what earlier rules wrote: h5ad files (whole or by element), tables, provenance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import anndata as ad
import pandas as pd
from anndata import AnnData

from omicsprep.timings import timed_phase


@timed_phase("read")
def read_h5ad(path: str | Path) -> AnnData:
    """Read an ``.h5ad`` file written by a previous rule."""
    return ad.read_h5ad(path)


@timed_phase("read")
def read_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by :func:`omicsprep.io.write_table` (Parquet or tab-separated text)."""
    if Path(path).suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, sep="\t")


@timed_phase("read")
def read_provenance(path: str | Path, *, rule: str) -> dict[str, Any]:
    """A rule's provenance record: backend, versions, parameters, step timings.

    Read from an AnnData's ``uns["omicsprep"][rule]``, or a JSON file written by
    :func:`omicsprep.io.write_json`.
    """
    if Path(path).suffix == ".json":
        return json.loads(Path(path).read_text())
    key = f"uns/omicsprep/{rule}"
    return cast(dict[str, Any], read_h5ad_elements(path, [key])[key])


@timed_phase("read")
def read_h5ad_elements(path: str | Path, keys: list[str]) -> dict[str, object]:
    """Read single elements (e.g. ``"obs"``, ``"obsm/X_umap"``) of an ``.h5ad`` file.

    Cheaper than reading the file: the matrix and layers stay on disk.
    """
    import h5py

    with h5py.File(path, "r") as handle:
        return {key: ad.io.read_elem(handle[key]) for key in keys}
