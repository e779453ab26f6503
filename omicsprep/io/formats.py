"""What the workflow knows of files from their paths alone: an input's format, an output's name.

Standard library only: the workflow's rules read this module while Snakemake parses them,
in every Snakemake process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from omicsprep.errors import InputError

InputFormat = Literal["10x_h5", "10x_mtx", "h5ad", "zarr", "bam", "sam", "molecules"]
FORMATS: tuple[str, ...] = ("10x_h5", "10x_mtx", "h5ad", "zarr", "bam", "sam", "molecules")
# Reads (aligned, or a molecule table): counted into a matrix by UMI deduplication
# (omicsprep.reads.counting) first.
READ_FORMATS: tuple[str, ...] = ("bam", "sam", "molecules")
MOLECULE_TABLE_SUFFIXES = (".parquet", ".csv", ".tsv")
_MTX_NAMES = ("matrix.mtx", "matrix.mtx.gz")


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


# A sample's co-expression files by key: the workflow's coexpression rule writes them all into
# results/{sample}/coexpression/, the ``omicsprep coexpr`` command those write_coexpression writes.
COEXPRESSION_FILES = {
    "edges": "edges.parquet",
    "modules": "modules.tsv",
    "per_cluster": "modules_per_cluster.tsv",
    "eigengenes": "eigengenes.parquet",
    "provenance": "provenance.json",
    "correlation": "module_correlation.png",
    "umap": "module_scores_umap.png",
}
