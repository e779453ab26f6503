"""Reading raw count matrices, with checks that the values are counts.

Formats are detected from the path: 10x HDF5 and MatrixMarket, h5ad and zarr.
"""

from __future__ import annotations

import logging
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Literal

import anndata as ad
import numpy as np
from anndata import AnnData
from scipy import sparse

from omicsprep.errors import InputError
from omicsprep.io.deflated import read_deflated, read_exactly
from omicsprep.io.formats import READ_FORMATS, InputFormat, resolve_format
from omicsprep.io.results import read_h5ad
from omicsprep.timings import timed_phase

log = logging.getLogger(__name__)

_MTX_FEATURES = ("features.tsv.gz", "features.tsv", "genes.tsv", "genes.tsv.gz")


def _read_mtx_folder(path: Path) -> AnnData:
    import scanpy as sc

    if not any((path / name).exists() for name in _MTX_FEATURES):
        raise InputError("10x MatrixMarket folder has no features.tsv.gz or genes.tsv", path=path)
    # v3 folders are gzipped, v2 folders are not; scanpy tells them apart by file name.
    return sc.read_10x_mtx(path, var_names="gene_symbols", make_unique=True, gex_only=False)


# Elements of a 10x HDF5 matrix read at a time: each block is converted (64-bit indices to
# 32-bit, integer counts to float32) as read, so no full-size copy in the file's types is held.
H5_READ_BLOCK = 1 << 25


def _read_10x_h5(path: Path) -> AnnData:
    """A 10x HDF5 matrix (Cell Ranger 3 and later) as scanpy's ``read_10x_h5`` reads it.

    Float32 counts (integer counts converted) with 32-bit indices where they fit, converted
    a block at a time as read; ``var`` holds ``gene_ids``, ``feature_types`` and every
    other feature field, ``obs`` the ``filtered_barcodes`` flags where present. Older
    files (Cell Ranger 2: a group per genome) are read by scanpy.
    """
    import h5py

    with h5py.File(path, "r") as handle:
        if "matrix" not in handle:
            import scanpy as sc  # here: its import is most of the reading of a small matrix

            return sc.read_10x_h5(path, gex_only=False)
        group = handle["matrix"]
        n_features, n_barcodes = (int(size) for size in group["shape"][:])
        indptr = group["indptr"][:]
        fits = max(int(indptr[-1]), n_features) < np.iinfo(np.int32).max
        index_dtype = np.int32 if fits else np.int64
        values = group["data"]
        data = _read_converted(values, np.float32 if values.dtype.kind in "iu" else values.dtype)
        matrix = sparse.csr_matrix(
            (data, _read_converted(group["indices"], index_dtype), indptr.astype(index_dtype)),
            shape=(n_barcodes, n_features),
            copy=False,
        )
        obs = {"obs_names": group["barcodes"][:].astype(str)}
        if "filtered_barcodes" in group:
            obs["filtered_barcodes"] = group["filtered_barcodes"][:].astype(bool)
        features = group["features"]
        var = {"var_names": features["name"][:].astype(str)}
        if "gene_id" in features:  # a probe-barcode matrix
            var |= {"gene_ids": features["gene_id"][:].astype(str), "probe_ids": features["id"][:].astype(str)}
        else:
            var["gene_ids"] = features["id"][:].astype(str)
        var["feature_types"] = features["feature_type"][:].astype(str)
        named = ("name", "feature_type", "id", "gene_id", "_all_tag_keys")
        for name, field in features.items():
            if isinstance(field, h5py.Dataset) and name not in named:
                var[name] = field[:].astype(bool if field.dtype.kind == "b" else str)
    return AnnData(matrix, obs=obs, var=var)


def _read_converted(dataset: Any, dtype: np.dtype | type) -> np.ndarray:
    """A one-dimensional HDF5 dataset as an array of ``dtype``, read and converted a block at a time.

    A dataset stored whole and unfiltered (contiguous) is read from the file in several
    threads (:func:`_read_contiguous`), and so is one deflated as Cell Ranger stores its
    matrices (:func:`~omicsprep.io.deflated.read_deflated`); others through HDF5, which
    reads in one thread.
    """
    deflated = read_deflated(dataset, dtype=dtype)
    if deflated is not None:
        return deflated
    out = np.empty(dataset.shape, dtype=dtype)
    offset = _contiguous_offset(dataset)
    if offset is not None:
        _read_contiguous(dataset.file.filename, offset=offset, stored=dataset.dtype, out=out)
        return out
    if dataset.dtype == out.dtype:
        dataset.read_direct(out)
        return out
    for start in range(0, out.size, H5_READ_BLOCK):
        out[start : start + H5_READ_BLOCK] = dataset[start : start + H5_READ_BLOCK]
    return out


def _contiguous_offset(dataset: Any) -> int | None:
    """Where a dataset's values start in its file, if stored as one unfiltered block of plain numbers; else ``None``."""
    import h5py

    plist = dataset.id.get_create_plist()
    plain = dataset.dtype.kind in "iuf" and plist.get_layout() == h5py.h5d.CONTIGUOUS and plist.get_nfilters() == 0
    return dataset.id.get_offset() if plain and dataset.size else None


def _read_contiguous(path: str, *, offset: int, stored: np.dtype, out: np.ndarray) -> None:
    """Read ``out.size`` values of type ``stored`` at ``offset`` of ``path`` into ``out``, converted.

    Blocks are read and converted in several threads at once: the system's reads and NumPy's
    conversions let other threads run, and one thread reads far below the memory's speed.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        blocks = range(0, out.size, H5_READ_BLOCK)
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            for _ in pool.map(partial(_read_block, fd, offset=offset, stored=stored, out=out), blocks):
                pass  # raises the first block's error
    finally:
        os.close(fd)


def _read_block(fd: int, start: int, *, offset: int, stored: np.dtype, out: np.ndarray) -> None:
    target = out[start : start + H5_READ_BLOCK]
    buffer = target if target.dtype == stored else np.empty(target.size, dtype=stored)
    read_exactly(fd, buffer.data.cast("B"), offset=offset + start * stored.itemsize)
    if buffer is not target:
        target[:] = buffer


def _read_any(path: Path, fmt: InputFormat) -> AnnData:
    if fmt == "10x_h5":
        return _read_10x_h5(path)
    if fmt == "10x_mtx":
        return _read_mtx_folder(path)
    if fmt == "h5ad":
        return read_h5ad(path)  # deflated arrays (the rules' own outputs) inflated in threads
    return ad.read_zarr(path)


def has_feature_type(path: str | Path, feature_type: str) -> bool:
    """Whether a count matrix holds features of ``feature_type`` (10x's ``feature_types``).

    Only the feature list is read.
    """
    path = Path(path)
    fmt = resolve_format(path)
    if fmt == "10x_h5":
        import h5py

        with h5py.File(path, "r") as handle:
            types = handle["matrix/features/feature_type"][:] if "matrix/features" in handle else []
        return feature_type.encode() in set(types)
    if fmt == "10x_mtx":
        import pandas as pd

        features = next((path / name for name in _MTX_FEATURES if (path / name).exists()), None)
        table = pd.read_csv(features, sep="\t", header=None) if features is not None else None
        return table is not None and table.shape[1] > 2 and (table[2] == feature_type).any()
    var = ad.read_h5ad(path, backed="r").var if fmt == "h5ad" else ad.read_zarr(path).var
    return "feature_types" in var and bool((var["feature_types"] == feature_type).any())


DuplicateBarcodes = Literal["error", "rename"]


@timed_phase("read")
def read_counts(
    path: str | Path,
    *,
    fmt: str | None = None,
    feature_type: str = "Gene Expression",
    duplicate_barcodes: DuplicateBarcodes = "error",
    fractional: bool = False,
) -> AnnData:
    """Read a raw count matrix as cells x genes with a CSR ``X``.

    Parameters
    ----------
    path
        The matrix, in any of :data:`~omicsprep.io.formats.FORMATS`.
    fmt
        Its format; detected from ``path`` when ``None``.
    feature_type
        The rows of a 10x matrix to keep (``var["feature_types"]``), e.g. ``"Antibody
        Capture"`` for CITE-seq tags; matrices without feature types are kept whole.
    duplicate_barcodes
        A barcode that names several cells: ``"error"`` refuses the matrix (a renamed
        barcode no longer matches the sample's fragments or antibody tags); ``"rename"``
        appends ``-1``, ``-2``, ... to the repeats (anndata's ``obs_names_make_unique``)
        and logs how many were renamed.
    fractional
        Accept non-integer counts: ambient-corrected ones (SoupX, DecontX), which are
        estimates of counts; still non-negative and finite.

    Returns
    -------
    The counts, with unique cell and gene names (repeated gene names, common among gene
    symbols, get anndata's suffixes).

    Raises
    ------
    InputError
        Missing file, unknown or unreadable format, an empty matrix, repeated barcodes
        (unless renamed), or values that are not counts (negative, fractional or
        non-finite).
    """
    path = Path(path)
    fmt = resolve_format(path, fmt=fmt)
    if fmt in READ_FORMATS:
        raise InputError(f"holds reads ({fmt}), not a count matrix: count its UMIs first", path=path)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*names are not unique.*")
            adata = _read_any(path, fmt)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot be read as {fmt} ({type(exc).__name__}: {exc})", path=path) from exc
    if "feature_types" in adata.var:
        kept = (adata.var["feature_types"] == feature_type).to_numpy()
        if not kept.any():
            found = ", ".join(sorted(set(adata.var["feature_types"])))
            raise InputError(f"no {feature_type!r} features (found: {found})", path=path)
        if not kept.all():  # a copy of the whole matrix otherwise
            adata = adata[:, kept].copy()
    if adata.n_obs == 0 or adata.n_vars == 0:
        raise InputError(f"matrix is empty ({adata.n_obs} cells x {adata.n_vars} genes)", path=path)
    _unique_barcodes(adata, path=path, duplicate_barcodes=duplicate_barcodes)
    adata.var_names_make_unique()
    adata.X = _canonical_csr(adata.X)
    _check_counts(adata, path=path, fractional=fractional)
    return adata


def _unique_barcodes(adata: AnnData, *, path: Path, duplicate_barcodes: DuplicateBarcodes) -> None:
    repeated = adata.obs_names[adata.obs_names.duplicated()].unique().sort_values()
    if repeated.empty:
        return
    shown = ", ".join(map(repr, repeated[:3])) + (", ..." if len(repeated) > 3 else "")
    if duplicate_barcodes == "error":
        raise InputError(
            f"{len(repeated)} barcode(s) name more than one cell ({shown}); set duplicate_barcodes: rename "
            "in the config to rename the repeats",
            path=path,
        )
    log.warning("%s: %d repeated barcode(s) renamed with suffixes -1, -2, ... (%s)", path, len(repeated), shown)
    adata.obs_names_make_unique()


def _canonical_csr(matrix: sparse.spmatrix | np.ndarray) -> sparse.csr_matrix:
    """``matrix`` in one form whatever the file held: CSR, float32, canonical, no stored zeros.

    Indices sorted and summed, 32-bit where they fit. The same counts stored dense or sparse,
    as integers or as floats of either width, then give the same results to the last bit
    (float64 values would otherwise carry through normalization and PCA and move cells
    between clusters). 10x HDF5 files store 64-bit indices, which would make every later
    copy half as large again.
    """
    matrix = sparse.csr_matrix(matrix)
    if matrix.dtype != np.float32:
        matrix = matrix.astype(np.float32)
    if not matrix.has_canonical_format:
        matrix.sum_duplicates()
    if np.count_nonzero(matrix.data) < matrix.nnz:  # counted without a copy: 3M cells hold billions
        matrix.eliminate_zeros()
    if matrix.indices.dtype != np.int32 and max(matrix.nnz, matrix.shape[1]) < np.iinfo(np.int32).max:
        indices = matrix.indices.astype(np.int32)
        matrix = sparse.csr_matrix(
            (matrix.data, indices, matrix.indptr.astype(np.int32)), shape=matrix.shape, copy=False
        )
    return matrix


# Values are checked a block at a time, several blocks at once (NumPy lets threads run
# together), so that the checks hold no copy of the matrix.
CHECK_BLOCK = 1 << 24


def _check_counts(adata: AnnData, *, path: Path, fractional: bool) -> None:
    values = adata.X.data
    if values.size == 0:
        raise InputError(f"matrix has no non-zero counts ({adata.n_obs} cells x {adata.n_vars} genes)", path=path)
    blocks = (values[start : start + CHECK_BLOCK] for start in range(0, values.size, CHECK_BLOCK))
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        problems = {problem for problem in pool.map(partial(_value_problem, fractional=fractional), blocks) if problem}
    # The same message whichever block is checked first: the first kind found, in this order.
    for problem in VALUE_PROBLEMS:
        if problem in problems:
            raise InputError(f"matrix holds {problem}; raw counts expected", path=path)


VALUE_PROBLEMS = ("NaN or infinite values", "negative values", "non-integer values (normalized data?)")


def _value_problem(block: np.ndarray, *, fractional: bool) -> str | None:
    if not np.isfinite(block).all():
        return VALUE_PROBLEMS[0]
    if block.min() < 0:
        return VALUE_PROBLEMS[1]
    if not fractional and not np.array_equal(block, np.round(block)):
        return VALUE_PROBLEMS[2]
    return None
