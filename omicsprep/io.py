"""Reading count matrices and writing outputs atomically.

File I/O lives here (reads from BAM/SAM are decoded in :mod:`omicsprep.reads.molecules`); the
analysis modules take and return AnnData.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anndata as ad
import numpy as np
import pandas as pd
from anndata import AnnData
from matplotlib.figure import Figure
from scipy import sparse

from omicsprep.backend import Backend, cudf
from omicsprep.errors import InputError, OutOfSpaceError, existing_file

if TYPE_CHECKING:
    from mudata import MuData

log = logging.getLogger(__name__)

InputFormat = Literal["10x_h5", "10x_mtx", "h5ad", "zarr", "bam", "sam", "molecules"]
FORMATS: tuple[str, ...] = ("10x_h5", "10x_mtx", "h5ad", "zarr", "bam", "sam", "molecules")
# Reads (aligned, or a molecule table): counted into a matrix by UMI deduplication
# (omicsprep.reads.counting) first.
READ_FORMATS: tuple[str, ...] = ("bam", "sam", "molecules")
MOLECULE_TABLE_SUFFIXES = (".parquet", ".csv", ".tsv")
_MTX_NAMES = ("matrix.mtx", "matrix.mtx.gz")
_MTX_FEATURES = ("features.tsv.gz", "features.tsv", "genes.tsv", "genes.tsv.gz")


def detect_format(path: str | Path) -> InputFormat:
    """Guess the format of a count matrix from its path.

    Parameters
    ----------
    path
        A 10x HDF5 file (``.h5``), a 10x MatrixMarket folder, an ``.h5ad`` file or an
        AnnData ``.zarr`` store.

    Returns
    -------
    One of :data:`FORMATS`.

    Raises
    ------
    InputError
        The path is missing or its format is not recognised.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("does not exist", path=path)
    suffix = path.suffix.lower()
    if suffix == ".zarr" or (path.is_dir() and any((path / name).exists() for name in (".zgroup", "zarr.json"))):
        return "zarr"
    if path.is_dir():
        if any((path / name).exists() for name in _MTX_NAMES):
            return "10x_mtx"
        raise InputError(
            "is a folder but neither a 10x MatrixMarket folder (no matrix.mtx[.gz]) nor a .zarr store",
            path=path,
        )
    if suffix == ".h5":
        return "10x_h5"
    if suffix == ".h5ad":
        return "h5ad"
    if suffix in (".bam", ".sam"):
        return suffix[1:]  # type: ignore[return-value]
    if any(s.lower() in MOLECULE_TABLE_SUFFIXES for s in path.suffixes):
        return "molecules"
    raise InputError(
        f"unknown format (extension {suffix or 'none'!r}); expected one of {', '.join(FORMATS)} "
        "or a 'format' column in the sample sheet",
        path=path,
    )


def resolve_format(path: str | Path, *, fmt: str | None = None) -> InputFormat:
    """Check that ``path`` exists and return its format: ``fmt`` when given, else detected.

    Raises
    ------
    InputError
        Missing path, or a format that is neither given nor recognisable.
    """
    if not Path(path).exists():
        raise InputError("does not exist", path=path)
    if not fmt:
        return detect_format(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}", path=path)
    return fmt  # type: ignore[return-value]


def _read_mtx_folder(path: Path) -> AnnData:
    import scanpy as sc

    if not any((path / name).exists() for name in _MTX_FEATURES):
        raise InputError("10x MatrixMarket folder has no features.tsv.gz or genes.tsv", path=path)
    # v3 folders are gzipped, v2 folders are not; scanpy tells them apart by file name.
    return sc.read_10x_mtx(path, var_names="gene_symbols", make_unique=True, gex_only=False)


def _read_any(path: Path, fmt: InputFormat) -> AnnData:
    import scanpy as sc

    if fmt == "10x_h5":
        return sc.read_10x_h5(path, gex_only=False)
    if fmt == "10x_mtx":
        return _read_mtx_folder(path)
    if fmt == "h5ad":
        return ad.read_h5ad(path)
    return ad.read_zarr(path)


DuplicateBarcodes = Literal["error", "rename"]


def read_counts(
    path: str | Path,
    *,
    fmt: str | None = None,
    feature_type: str = "Gene Expression",
    duplicate_barcodes: DuplicateBarcodes = "error",
) -> AnnData:
    """Read a raw count matrix as cells x genes with a CSR ``X``.

    Parameters
    ----------
    path
        The matrix, in any of :data:`FORMATS`.
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
    adata.X = _compact_csr(adata.X)
    _check_counts(adata, path=path)
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


def _compact_csr(matrix: sparse.spmatrix | np.ndarray) -> sparse.csr_matrix:
    """``matrix`` as CSR with 32-bit indices where they fit: 10x HDF5 files store 64-bit
    indices, which would make every later copy half as large again."""
    matrix = sparse.csr_matrix(matrix)
    if matrix.indices.dtype != np.int32 and max(matrix.nnz, matrix.shape[1]) < np.iinfo(np.int32).max:
        indices = matrix.indices.astype(np.int32)
        matrix = sparse.csr_matrix((matrix.data, indices, matrix.indptr.astype(np.int32)), shape=matrix.shape,
                                   copy=False)
    return matrix


# Values are checked a block at a time, so that the checks hold no copy of the matrix.
CHECK_BLOCK = 1 << 24


def _check_counts(adata: AnnData, *, path: Path) -> None:
    values = adata.X.data
    if values.size == 0:
        raise InputError(f"matrix has no non-zero counts ({adata.n_obs} cells x {adata.n_vars} genes)", path=path)
    for start in range(0, values.size, CHECK_BLOCK):
        block = values[start : start + CHECK_BLOCK]
        if not np.isfinite(block).all():
            raise InputError("matrix holds NaN or infinite values; raw counts expected", path=path)
        if block.min() < 0:
            raise InputError("matrix holds negative values; raw counts expected", path=path)
        if not np.array_equal(block, np.round(block)):
            raise InputError("matrix holds non-integer values (normalized data?); raw counts expected", path=path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


TEMPORARY_INFIX = ".tmp"


@contextlib.contextmanager
def atomic_path(path: str | Path, *, expected_bytes: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success.

    Nothing partial survives a failure: the temporary file is removed when the block
    raises, and temporary files that a killed writer of the same output left behind
    (a SIGKILL runs no clean-up) are removed before writing.

    Parameters
    ----------
    path
        The output.
    expected_bytes
        About how large the output will be, named when the disk fills.

    Raises
    ------
    OutOfSpaceError
        The file system ran out of space while writing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}."
    for stale in path.parent.glob(f"{glob_escape(prefix)}*{TEMPORARY_INFIX}{glob_escape(path.suffix)}"):
        stale.unlink(missing_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=prefix, suffix=TEMPORARY_INFIX + path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp creates the file private (0600); give it the permissions of a normal file.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except Exception as exc:
        if out_of_space(exc):
            written = tmp.stat().st_size if tmp.is_file() else 0
            tmp.unlink(missing_ok=True)  # before the free space is measured
            raise OutOfSpaceError(path, needed_bytes=max(expected_bytes or 0, written)) from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)


def glob_escape(text: str) -> str:
    """``text`` matched literally by :meth:`Path.glob` (sample names may hold ``[``)."""
    return "".join(f"[{char}]" if char in "*?[" else char for char in text)


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a full file system; h5py
    reports it only in the message of an ``OSError`` without ``errno``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and (seen.errno == errno.ENOSPC or "No space left on device" in str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def stored_bytes(adata: AnnData) -> int:
    """About how many bytes ``adata`` takes uncompressed on disk: its matrices' and
    tables' buffers."""
    total = 0
    arrays = [adata.X, *adata.layers.values(), *adata.obsm.values(), *adata.varm.values(), *adata.obsp.values()]
    for array in arrays:
        if sparse.issparse(array):
            total += array.data.nbytes + array.indices.nbytes + array.indptr.nbytes
        elif hasattr(array, "nbytes"):
            total += int(array.nbytes)
    for frame in (adata.obs, adata.var):
        total += int(frame.memory_usage(deep=True).sum())
    return total


def read_h5ad(path: str | Path) -> AnnData:
    """Read an ``.h5ad`` file written by a previous rule."""
    return ad.read_h5ad(path)


FRAGMENT_COLUMNS = ["chrom", "start", "end", "barcode", "count"]


# Default fragments per chunk: the CPU's memory grows with it; the H200 counts 100M
# fragments 1.2x faster (file to matrix) in chunks of 20M than of 5M (benchmarks/RESULTS.md).
FRAGMENT_CHUNK_ROWS = {"cpu": 1_000_000, "gpu": 20_000_000}


def fragment_chunks(path: str | Path, *, chunk_rows: int | None = None, backend: Backend = "cpu") -> Iterator:
    """Stream a 10x ``fragments.tsv[.gz|.bz2|.zst|.lz4]`` (chrom, start, end, barcode, reads; ``#``
    header lines skipped) in chunks of about ``chunk_rows`` fragments (by default
    ``FRAGMENT_CHUNK_ROWS[backend]``).

    On the CPU the chunks are pandas DataFrames parsed by pyarrow; on the GPU, cuDF
    DataFrames parsed on the device from blocks of the (decompressed) text.

    Raises
    ------
    InputError
        Missing or unparsable file (e.g. non-integer coordinates).
    """
    path = existing_file(path)
    chunk_rows = FRAGMENT_CHUNK_ROWS[backend] if chunk_rows is None else chunk_rows
    chunks = _fragment_chunks_cudf(path, chunk_rows) if backend == "gpu" else _fragment_chunks_arrow(path, chunk_rows)
    try:
        yield from chunks
    except ValueError as exc:  # pyarrow's parse errors, and cuDF's as _parsed_fragments re-raises them
        raise InputError(f"cannot be read as 10x fragments (chrom, start, end, barcode, count): "
                         f"{type(exc).__name__}: {exc}", path=path) from exc


FRAGMENT_TYPES = {"chrom": "str", "start": "int64", "end": "int64", "barcode": "str", "count": "int64"}
BYTES_PER_FRAGMENT = 48  # a 10x fragments line, about


def _fragment_chunks_arrow(path: Path, chunk_rows: int) -> Iterator[pd.DataFrame]:
    """Chunks parsed by pyarrow from blocks of whole lines, one block in memory at a time
    (Arrow's streaming reader reads ahead several); chromosomes and barcodes
    dictionary-encoded (categorical), a few bytes a fragment."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    strings = pa.dictionary(pa.int32(), pa.string())
    types = {k: strings if v == "str" else pa.type_for_alias(v) for k, v in FRAGMENT_TYPES.items()}
    for text in line_blocks(path, max(1 << 20, chunk_rows * BYTES_PER_FRAGMENT)):
        yield pacsv.read_csv(
            pa.py_buffer(text),
            read_options=pacsv.ReadOptions(column_names=FRAGMENT_COLUMNS),
            parse_options=pacsv.ParseOptions(delimiter="\t", invalid_row_handler=_skip_comment_rows),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(FRAGMENT_TYPES)),
        ).to_pandas()


def _fragment_chunks_cudf(path: Path, chunk_rows: int) -> Iterator:
    """Chunks parsed by cuDF on the GPU: byte ranges of a plain file (cuDF reads the rows
    that start in each), or blocks of whole lines decompressed on the host from a
    compressed one."""
    import io as stdio

    block_bytes = max(1 << 20, chunk_rows * BYTES_PER_FRAGMENT)
    if path.suffix not in STREAM_CODECS:
        for offset in range(0, path.stat().st_size, block_bytes):
            yield _parsed_fragments(path, byte_range=(offset, block_bytes))
        return
    for text in line_blocks(path, block_bytes):
        yield _parsed_fragments(stdio.BytesIO(text))


STREAM_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}  # pyarrow's input streams, by suffix


def line_blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The (decompressed) text in blocks of about ``block_bytes`` that end with a line."""
    import pyarrow as pa

    with pa.input_stream(str(path), compression="detect") as handle:
        rest = b""
        while block := handle.read(block_bytes):
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # no line ends in this block
                rest += block
                continue
            text, rest = rest + block[:cut], block[cut:]
            yield text
        if rest.strip():
            yield rest


def _parsed_fragments(source, **options):  # noqa: ANN001, ANN202
    try:
        frame = cudf().read_csv(source, sep="\t", header=None, names=FRAGMENT_COLUMNS, usecols=list(FRAGMENT_TYPES),
                                dtype=FRAGMENT_TYPES, comment="#", compression=None, **options)
    except RuntimeError as exc:  # cuDF reports text it cannot parse so; other GPU errors pass through
        raise ValueError(str(exc)) from exc
    if frame["start"].isnull().any() or frame["end"].isnull().any():
        raise ValueError("non-integer or missing coordinates")
    return frame


def _skip_comment_rows(row) -> str:  # noqa: ANN001
    """Skip ``#`` header lines; refuse any other malformed row."""
    return "skip" if row.text.startswith("#") else "error"


def read_peaks(path: str | Path) -> pd.DataFrame:
    """Intervals from a BED file: ``chrom``, ``start``, ``end``, and ``strand`` when the
    file has a sixth column (``#``, ``track`` and ``browser`` lines skipped).

    Raises
    ------
    InputError
        Missing or unparsable file, or an interval whose end is not after its start.
    """
    path = existing_file(path)
    try:  # up to BED12's columns, so one-field track and browser lines parse too
        raw = pd.read_csv(path, sep="\t", header=None, comment="#", dtype=str, names=range(12))
        raw = raw[~raw[0].str.startswith(("track", "browser"))]
        peaks = pd.DataFrame({"chrom": raw[0], "start": raw[1].astype(np.int64), "end": raw[2].astype(np.int64)})
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot be read as BED ({exc})", path=path) from exc
    if raw[5].notna().any():
        peaks["strand"] = raw[5].fillna(".")
    if (peaks["end"] <= peaks["start"]).any() or (peaks["start"] < 0).any():
        raise InputError("holds intervals whose end is not after their start", path=path)
    return peaks.reset_index(drop=True)


def read_tss(path: str | Path) -> pd.DataFrame:
    """Transcription start sites of the genes in a BED file: ``chrom`` and ``position``,
    the start, or the last base for genes on the ``-`` strand (sixth column).

    Raises
    ------
    InputError
        As :func:`read_peaks`.
    """
    genes = read_peaks(path)
    minus = (genes["strand"] == "-").to_numpy() if "strand" in genes else np.zeros(len(genes), bool)
    return pd.DataFrame({"chrom": genes["chrom"], "position": np.where(minus, genes["end"] - 1, genes["start"])})


def read_chrom_sizes(path: str | Path) -> dict[str, int]:
    """Chromosome lengths from a two-column ``name<TAB>length`` file (UCSC ``chrom.sizes``;
    a FASTA index ``.fai`` works too: its first two columns are these).

    Raises
    ------
    InputError
        Missing or unparsable file.
    """
    path = existing_file(path)
    try:
        sizes = pd.read_csv(path, sep="\t", header=None, usecols=[0, 1], names=["chrom", "length"], comment="#",
                            dtype={"chrom": str, "length": np.int64})
    except ValueError as exc:
        raise InputError(f"cannot be read as chromosome sizes (name, length) ({exc})", path=path) from exc
    return dict(zip(sizes["chrom"], sizes["length"].astype(int), strict=True))


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by :func:`write_table` (Parquet or tab-separated text)."""
    if Path(path).suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, sep="\t")


def write_h5ad(adata: AnnData, path: str | Path, *, compression: Literal["lzf", "gzip"] | None = None) -> None:
    """Write ``adata`` to ``path`` atomically; uncompressed by default (anndata's default:
    at 1M cells lzf made writing 3.7x slower), or with one of HDF5's filters that every
    h5ad reader has."""
    with atomic_path(path, expected_bytes=stored_bytes(adata)) as tmp:
        adata.write_h5ad(tmp, compression=compression)


def write_h5mu(mdata: MuData, path: str | Path) -> None:
    """Write a MuData to ``path`` atomically."""
    expected = sum(stored_bytes(modality) for modality in mdata.mod.values())
    with atomic_path(path, expected_bytes=expected) as tmp:
        mdata.write_h5mu(tmp)


def write_table(frame: pd.DataFrame, path: str | Path, *, index: bool = False) -> None:
    """Write a table atomically; Parquet or tab-separated text chosen by extension."""
    with atomic_path(path) as tmp:
        if Path(path).suffix == ".parquet":
            frame.to_parquet(tmp, index=index)
        else:
            frame.to_csv(tmp, sep="\t", index=index)


def write_figure(figure: Figure, path: str | Path) -> None:
    """Save a Matplotlib figure atomically, in the format of the path's extension."""
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=110, bbox_inches="tight", format=Path(path).suffix.lstrip("."))


def write_coexpression(
    result: dict[str, pd.DataFrame], figures: dict[str, Figure], paths: dict[str, str | Path]
) -> None:
    """Write :func:`omicsprep.pipeline.run_coexpression`'s tables and their figures.

    ``paths`` maps ``edges``, ``modules``, ``eigengenes`` and each figure's name to a file.
    """
    write_table(result["edges"], paths["edges"])
    write_table(result["modules"], paths["modules"])
    write_table(result["eigengenes"], paths["eigengenes"], index=True)
    for name, figure in figures.items():
        write_figure(figure, paths[name])


def write_json(record: dict, path: str | Path) -> None:
    """Write a JSON record atomically (values JSON cannot hold are written as text)."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")


def read_provenance(path: str | Path, *, rule: str) -> dict:
    """A rule's provenance record (backend, versions, parameters, step timings): from an
    AnnData's ``uns["omicsprep"][rule]``, or a JSON file written by :func:`write_json`."""
    if Path(path).suffix == ".json":
        return json.loads(Path(path).read_text())
    return read_h5ad_elements(path, [f"uns/omicsprep/{rule}"])[f"uns/omicsprep/{rule}"]


def read_h5ad_elements(path: str | Path, keys: list[str]) -> dict[str, object]:
    """Read single elements (e.g. ``"obs"``, ``"obsm/X_umap"``) of an ``.h5ad`` file.

    Cheaper than reading the file: the matrix and layers stay on disk.
    """
    import h5py

    with h5py.File(path, "r") as handle:
        return {key: ad.io.read_elem(handle[key]) for key in keys}
