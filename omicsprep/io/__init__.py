"""File I/O: reading inputs and earlier rules' outputs, and writing outputs atomically.

The analysis modules take and return AnnData; files are read and written here
(:mod:`~omicsprep.io.counts`, :mod:`~omicsprep.io.fragments`, :mod:`~omicsprep.io.results`,
:mod:`~omicsprep.io.writers`), and reads are streamed from BAM/SAM files and molecule
tables by :mod:`omicsprep.reads.molecules`, through the text reader it shares with the
fragments (:mod:`~omicsprep.io.text`).

Each name is imported from its module at its first use (PEP 562), so that a rule imports
only the readers and writers it uses, and the workflow's rules, read in every Snakemake
process, only :mod:`~omicsprep.io.formats`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omicsprep.timings import phase

if TYPE_CHECKING:
    from omicsprep.io.cellbender import read_cellbender
    from omicsprep.io.counts import DuplicateBarcodes, has_feature_type, read_counts
    from omicsprep.io.formats import (
        COEXPRESSION_FILES,
        FORMATS,
        MOLECULE_TABLE_SUFFIXES,
        READ_FORMATS,
        InputFormat,
        detect_format,
        resolve_format,
    )
    from omicsprep.io.fragments import (
        FRAGMENT_CHUNK_ROWS,
        FRAGMENT_COLUMNS,
        fragment_chunks,
        read_chrom_sizes,
        read_peaks,
        read_tss,
    )
    from omicsprep.io.results import (
        H5adSamples,
        read_celltypist_model,
        read_h5ad,
        read_h5ad_elements,
        read_provenance,
        read_table,
    )
    from omicsprep.io.star import (
        read_barcode_stats,
        read_solo_features,
        read_solo_matrix,
        read_solo_summary,
    )
    from omicsprep.io.writers import (
        H5adParts,
        atomic_path,
        glob_escape,
        h5ad_in_parts,
        out_of_space,
        stored_bytes,
        values_bytes,
        write_coexpression,
        write_figure,
        write_h5ad,
        write_h5mu,
        write_json,
        write_models,
        write_table,
    )

# Each public name and the module that defines it (as __all__ lists them).
_MODULES = {
    "COEXPRESSION_FILES": "formats",
    "DuplicateBarcodes": "counts",
    "FORMATS": "formats",
    "FRAGMENT_CHUNK_ROWS": "fragments",
    "FRAGMENT_COLUMNS": "fragments",
    "InputFormat": "formats",
    "MOLECULE_TABLE_SUFFIXES": "formats",
    "READ_FORMATS": "formats",
    "atomic_path": "writers",
    "H5adParts": "writers",
    "H5adSamples": "results",
    "h5ad_in_parts": "writers",
    "detect_format": "formats",
    "fragment_chunks": "fragments",
    "glob_escape": "writers",
    "has_feature_type": "counts",
    "out_of_space": "writers",
    "read_barcode_stats": "star",
    "read_cellbender": "cellbender",
    "read_celltypist_model": "results",
    "read_chrom_sizes": "fragments",
    "read_counts": "counts",
    "read_h5ad": "results",
    "read_h5ad_elements": "results",
    "read_peaks": "fragments",
    "read_provenance": "results",
    "read_solo_features": "star",
    "read_solo_matrix": "star",
    "read_solo_summary": "star",
    "read_table": "results",
    "read_tss": "fragments",
    "resolve_format": "formats",
    "stored_bytes": "writers",
    "values_bytes": "writers",
    "write_coexpression": "writers",
    "write_figure": "writers",
    "write_h5ad": "writers",
    "write_h5mu": "writers",
    "write_json": "writers",
    "write_models": "writers",
    "write_table": "writers",
}

__all__ = [
    "COEXPRESSION_FILES",
    "FORMATS",
    "FRAGMENT_CHUNK_ROWS",
    "FRAGMENT_COLUMNS",
    "MOLECULE_TABLE_SUFFIXES",
    "READ_FORMATS",
    "DuplicateBarcodes",
    "H5adParts",
    "H5adSamples",
    "InputFormat",
    "atomic_path",
    "detect_format",
    "fragment_chunks",
    "glob_escape",
    "h5ad_in_parts",
    "has_feature_type",
    "out_of_space",
    "read_barcode_stats",
    "read_cellbender",
    "read_celltypist_model",
    "read_chrom_sizes",
    "read_counts",
    "read_h5ad",
    "read_h5ad_elements",
    "read_peaks",
    "read_provenance",
    "read_solo_features",
    "read_solo_matrix",
    "read_solo_summary",
    "read_table",
    "read_tss",
    "resolve_format",
    "stored_bytes",
    "values_bytes",
    "write_coexpression",
    "write_figure",
    "write_h5ad",
    "write_h5mu",
    "write_json",
    "write_models",
    "write_table",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with phase("imports"):  # a reader's libraries (AnnData, h5py) load here, before its read phase
        value = getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    globals()[name] = value  # later uses find it without this function
    return value


def __dir__() -> list[str]:
    return __all__
