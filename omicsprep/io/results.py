"""Reading back what earlier rules wrote: h5ad files (whole or by element), tables, provenance.

AnnData is imported by the readers that return it: rule run_times reads tables and
provenance records only, and starts without it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import pandas as pd

from omicsprep.io.deflated import read_deflated
from omicsprep.timings import timed_phase

if TYPE_CHECKING:
    from anndata import AnnData


@timed_phase("read")
def read_h5ad(path: str | Path, *, skip: Collection[str] = ()) -> AnnData:
    """Read an ``.h5ad`` file written by a previous rule.

    Arrays deflated by HDF5's gzip filter (``h5ad_compression: gzip``) are decompressed in
    several threads (:func:`~omicsprep.io.deflated.read_deflated`); the rest as anndata reads
    it. Files of anndata before 0.8 (no encoding on the file) are read by anndata whole.

    Parameters
    ----------
    path
        The file.
    skip
        Elements left unread (``"X"``, ``"obsm"``, ``"layers/counts"``, ...): they come back
        as ``None`` or empty, and take no memory or time (a file of anndata before 0.8 is
        read whole).

    In a pool worker, ``X`` comes from memory when the job that wrote the file left it there
    (:func:`omicsprep.pool.worker.take_kept`).
    """
    import anndata as ad
    from anndata.experimental import read_dispatched

    from omicsprep.io.writers import STAMP
    from omicsprep.pool.worker import take_kept

    skipped = {f"/{name.strip('/')}" for name in skip}
    with h5py.File(path, "r") as handle:
        if handle.attrs.get("encoding-type") == "anndata":
            kept = None if "/X" in skipped else take_kept(path, stamp=handle.attrs.get(STAMP))
            unread = skipped | {"/X"} if kept is not None else skipped
            adata = read_dispatched(handle, partial(_read_deflated_arrays, skipped=unread))
            if kept is not None:
                adata.X = kept
            return adata
    return ad.read_h5ad(path)


def _read_deflated_arrays(read: Any, name: str, elem: Any, iospec: Any, *, skipped: set[str]) -> Any:
    """One element read as anndata reads it, but deflated arrays and sparse matrices by :func:`read_deflated`.

    Elements named in ``skipped`` are not read (``None``).
    """
    if name in skipped:
        return None
    if iospec.encoding_type == "array" and isinstance(elem, h5py.Dataset):
        values = read_deflated(elem)
        return read(elem) if values is None else values
    if iospec.encoding_type in ("csr_matrix", "csc_matrix"):
        parts = {part: read_deflated(elem[part]) for part in ("data", "indices", "indptr")}
        if all(values is None for values in parts.values()):
            return read(elem)
        import anndata as ad
        from scipy import sparse

        kind = "array" if getattr(ad.settings, "use_sparse_array_on_read", False) else "matrix"
        constructor = getattr(sparse, f"{iospec.encoding_type.removesuffix('_matrix')}_{kind}")
        arrays = [elem[part][...] if values is None else values for part, values in parts.items()]
        return constructor(tuple(arrays), shape=tuple(elem.attrs["shape"]))
    return read(elem)


@timed_phase("read")
def read_table(path: str | Path, *, index: bool = False) -> pd.DataFrame:
    """Read a table written by :func:`omicsprep.io.write_table` (Parquet or tab-separated text).

    ``index``: the text's first column is the index (written with ``index=True``).
    """
    if Path(path).suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, sep="\t", index_col=0 if index else None)


@timed_phase("read")
def read_celltypist_model(path: str | Path) -> Any:
    """A CellTypist model (``celltypist.models.Model``) from its ``.pkl``; not one: an :class:`InputError`."""
    from celltypist.models import Model

    from omicsprep.errors import InputError

    try:
        return Model.load(str(path))
    except Exception as error:  # CellTypist raises whatever unpickling a wrong file gives
        raise InputError(f"not a CellTypist model ({error})", path=path) from error


@timed_phase("read")
def read_provenance(path: str | Path, *, rule: str) -> dict[str, Any]:
    """A rule's provenance record: backend, versions, parameters, step timings.

    Read from an AnnData's ``uns["omicsprep"][rule]``, or a JSON file written by
    :func:`omicsprep.io.write_json`.
    """
    if Path(path).suffix == ".json":
        return json.loads(Path(path).read_text())
    with h5py.File(path, "r") as handle:
        return _record(handle[f"uns/omicsprep/{rule}"])


def _record(group: h5py.Group) -> dict[str, Any]:
    # What omicsprep.provenance.record_provenance stores: text and numbers, in dictionaries.
    values: dict[str, Any] = {}
    for name, node in group.items():
        if isinstance(node, h5py.Group):
            values[name] = _record(node)
        else:
            value = node[()]
            values[name] = value.decode() if isinstance(value, bytes) else value.item()
    return values


class H5adSamples(Mapping[str, "AnnData"]):
    """Samples' ``.h5ad`` files as a mapping that reads a sample each time it is asked for, holding none.

    A merge that takes each sample once, in order, then holds one sample's matrices at a
    time (:func:`omicsprep.rna.integration.concatenate_samples` on the GPU).

    Parameters
    ----------
    paths
        Sample name to its file.
    skip
        Elements left unread, as :func:`read_h5ad` takes them.
    """

    def __init__(self, paths: Mapping[str, str | Path], *, skip: Collection[str] = ()) -> None:
        self.paths, self.skip = dict(paths), tuple(skip)

    def __getitem__(self, name: str) -> AnnData:
        return read_h5ad(self.paths[name], skip=self.skip)

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


@timed_phase("read")
def read_h5ad_elements(path: str | Path, keys: list[str]) -> dict[str, object]:
    """Read single elements (e.g. ``"obs"``, ``"obsm/X_umap"``) of an ``.h5ad`` file.

    Cheaper than reading the file: the matrix and layers stay on disk.
    """
    import anndata as ad

    with h5py.File(path, "r") as handle:
        return {key: ad.io.read_elem(handle[key]) for key in keys}
