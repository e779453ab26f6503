"""File I/O: reading inputs and earlier rules' outputs, and writing outputs atomically.

The analysis modules take and return AnnData; files are read and written here
(:mod:`~omicsprep.io.counts`, :mod:`~omicsprep.io.fragments`, :mod:`~omicsprep.io.results`,
:mod:`~omicsprep.io.writers`), and reads are streamed from BAM/SAM files and molecule
tables by :mod:`omicsprep.reads.molecules`, through the text reader it shares with the
fragments (:mod:`~omicsprep.io.text`).
"""

from omicsprep.io.cellbender import read_cellbender
from omicsprep.io.counts import (
    FORMATS,
    MOLECULE_TABLE_SUFFIXES,
    READ_FORMATS,
    DuplicateBarcodes,
    InputFormat,
    detect_format,
    has_feature_type,
    read_counts,
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
from omicsprep.io.results import read_h5ad, read_h5ad_elements, read_provenance, read_table
from omicsprep.io.star import read_barcode_stats, read_solo_features, read_solo_matrix, read_solo_summary
from omicsprep.io.writers import (
    COEXPRESSION_FILES,
    atomic_path,
    background_writes,
    glob_escape,
    out_of_space,
    stored_bytes,
    write_coexpression,
    write_figure,
    write_h5ad,
    write_h5mu,
    write_json,
    write_table,
)

__all__ = [
    "COEXPRESSION_FILES",
    "FORMATS",
    "FRAGMENT_CHUNK_ROWS",
    "FRAGMENT_COLUMNS",
    "MOLECULE_TABLE_SUFFIXES",
    "READ_FORMATS",
    "DuplicateBarcodes",
    "InputFormat",
    "atomic_path",
    "background_writes",
    "detect_format",
    "fragment_chunks",
    "glob_escape",
    "has_feature_type",
    "out_of_space",
    "read_barcode_stats",
    "read_cellbender",
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
    "write_coexpression",
    "write_figure",
    "write_h5ad",
    "write_h5mu",
    "write_json",
    "write_table",
]
