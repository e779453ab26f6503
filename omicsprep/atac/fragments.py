"""Chromatin fragments counted into peaks or genome tiles, with QC per cell, on either backend.

The QC per cell: fragment lengths, the fraction in features and TSS enrichment.

Fragments arrive in chunks (:func:`omicsprep.io.fragment_chunks`), so memory follows the
chunk size and the output matrix, not the file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.atac.columns import CELL_BITS, FeatureColumns, runs
from omicsprep.atac.features import MAX_POSITION, TSS_CENTER, TSS_FLANK, Peaks, Tiles, TssWindows, position_keys
from omicsprep.backend import Backend, array_module, asnumpy, cudf
from omicsprep.errors import InputError, naming_file

NUCLEOSOME_FREE = 147  # fragments shorter than one nucleosome's DNA (bp)
MONO_NUCLEOSOME = 294  # up to this length: one nucleosome
PER_CELL = ("n_fragments", "nucleosome_free", "mono_nucleosome", "in_features", "tss_center", "tss_flank")
BARCODE_EXAMPLES = 100  # fragments' barcodes outside the cells kept to diagnose a mismatch
BARCODE_SUFFIX = re.compile(r"-\d+$")  # the GEM well's, e.g. "-1" in Cell Ranger's barcodes

log = logging.getLogger(__name__)


def count_fragments(
    chunks: Iterable,
    *,
    barcodes: pd.Index,
    peaks: pd.DataFrame | None = None,
    tile_width: int = 5000,
    chrom_sizes: Mapping[str, int] | None = None,
    tss: pd.DataFrame | None = None,
    source: str | Path | None = None,
    backend: Backend = "cpu",
) -> AnnData:
    """Cells x features counts of fragments: one per feature a fragment overlaps.

    The fragments must be sorted by chromosome and start, as 10x writes them (and tabix
    needs): a feature's counts are then final once the fragments have passed it, so each
    is written once, into the output, and memory is one chunk plus the output matrix.

    Parameters
    ----------
    chunks
        Fragments (``chrom``, ``start``, ``end``, ``barcode``, and ``count`` (reads) for
        ``tss``; 0-based, end exclusive), in file order:
        pandas DataFrames on the CPU, cuDF DataFrames on the GPU
        (:func:`omicsprep.io.fragment_chunks`).
    barcodes
        The cells (unique); fragments of other barcodes are only counted (``uns``).
    peaks
        ``chrom``, ``start``, ``end`` of non-overlapping peaks; genome tiles of
        ``tile_width`` bp when ``None``.
    tile_width
        Tile size in bp.
    chrom_sizes
        The genome's chromosome lengths: fragments on other chromosomes, or past a
        chromosome's end, are refused. Unchecked when ``None``.
    tss
        ``chrom`` and ``position`` (0-based) of transcription start sites: adds
        ``obs["tss_enrichment"]`` (TSS windows may overlap; each counts).
    source
        The fragments' file, named in errors about them.
    backend
        ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy): where each chunk's overlaps and counts are
        computed and the output is assembled.

    Returns
    -------
    Counts (CSC) with features named ``chrom:start-end``, in the fragments' order of
    chromosomes, then by start (peaks on chromosomes without fragments last; tiles only
    where there are counts); ``obs`` holds ``n_fragments``, ``nucleosome_signal``
    (mono-nucleosomal over nucleosome-free fragments), ``frac_in_features`` (with peaks:
    the fraction of fragments in peaks, FRiP) and, with ``tss``, ``tss_enrichment``.

    Raises
    ------
    InputError
        Repeated barcodes; unsorted fragments; fragments whose end is not after their
        start, with a negative start or beyond 2**32 bp; more chromosomes than tile keys
        hold; with ``chrom_sizes``, fragments on an unknown chromosome or past its end;
        overlapping peaks; no fragment of a cell, or no peak on the fragments'
        chromosomes (naming the mismatch: a barcode suffix, a ``chr`` prefix).
    """
    _check_barcodes(barcodes)
    xp = array_module(backend)
    features = Peaks(peaks, xp) if peaks is not None else Tiles(tile_width, xp)
    windows = TssWindows(tss, xp) if tss is not None else None
    counter = _FragmentCounter(barcodes, features=features, chrom_sizes=chrom_sizes, tss=windows, backend=backend)
    with naming_file(source):  # the chunks' errors are the fragments'
        for chunk in chunks:
            if len(chunk):
                counter.add(chunk)
        counter.check_matched()
    return counter.to_anndata()


def _check_barcodes(barcodes: pd.Index) -> None:
    if not barcodes.is_unique:
        raise InputError(f"cell barcodes repeat, e.g. {barcodes[barcodes.duplicated()][0]!r}")
    if len(barcodes) >= 1 << CELL_BITS:
        raise InputError(f"{len(barcodes):,} cells: more than this count can key")


class _FragmentCounter:
    """Sorted fragments counted chunk by chunk.

    Into the features' columns, and into the QC counts per cell (a row per name in ``PER_CELL``).
    """

    def __init__(
        self,
        barcodes: pd.Index,
        *,
        features: Peaks | Tiles,
        chrom_sizes: Mapping[str, int] | None,
        tss: TssWindows | None,
        backend: Backend,
    ) -> None:
        self.xp = xp = array_module(backend)
        self.index_type = cudf().Index if backend == "gpu" else pd.Index
        self.barcodes, self.cells = barcodes, self.index_type(np.asarray(barcodes, dtype=str))
        self.features, self.chrom_sizes, self.tss = features, chrom_sizes, tss
        self.per_cell = xp.zeros((len(PER_CELL), len(barcodes)), dtype=xp.int64)
        self.columns = FeatureColumns(xp)
        self.chromosomes: list[str] = []  # in the fragments' order
        self.last_position, self.outside_cells = -1, 0
        self.outside_examples: dict[str, None] = {}  # (ordered set) barcodes of fragments outside the cells

    def add(self, chunk) -> None:
        """Count a chunk of fragments (not empty) that follows the previous ones."""
        xp = self.xp
        start, end = self._checked_coordinates(chunk)
        chrom = self._chromosome_codes(chunk)
        self.last_position = _check_sorted(chunk, position_keys(chrom, start), after=self.last_position, xp=xp)
        finished_below = self.features.finished_below(self.chromosomes, int(chrom[-1]), int(start[-1]))
        cell = xp.asarray(self.cells.get_indexer(chunk["barcode"]), dtype=xp.int64)
        inside = cell >= 0
        self.outside_cells += int((~inside).sum())
        if len(self.outside_examples) < BARCODE_EXAMPLES and not bool(inside.all()):
            outside = asnumpy(xp.flatnonzero(~inside)[:BARCODE_EXAMPLES])
            self.outside_examples.update(dict.fromkeys(_host(chunk["barcode"].iloc[outside]).tolist()))
        cell, chrom, start, end = cell[inside], chrom[inside], start[inside], end[inside]
        self._count_lengths(cell, end - start)
        fragment, feature = self.features.overlaps(chrom, start, end, chromosomes=self.chromosomes)
        self.columns.add((feature << CELL_BITS) | cell[fragment], finished_below=finished_below)
        in_feature = xp.zeros(cell.size, dtype=bool)
        in_feature[fragment] = True
        self._count("in_features", cell[in_feature])
        if self.tss is not None:
            reads = xp.asarray(chunk["count"].values, dtype=xp.int64)[inside]
            fragment, center, flank = self.tss.coverage(chrom, start, end, chromosomes=self.chromosomes)
            self._count("tss_center", cell[fragment], weights=center * reads[fragment])
            self._count("tss_flank", cell[fragment], weights=flank * reads[fragment])

    def _checked_coordinates(self, chunk):
        """The chunk's starts and ends, once found valid (and within the genome's sizes)."""
        start = self.xp.asarray(chunk["start"].values, dtype=self.xp.int64)
        end = self.xp.asarray(chunk["end"].values, dtype=self.xp.int64)
        _check_coordinates(chunk, start=start, end=end, xp=self.xp)
        if self.chrom_sizes is not None:
            _check_genome(chunk, end=end, chrom_sizes=self.chrom_sizes, index_type=self.index_type, xp=self.xp)
        return start, end

    def _chromosome_codes(self, chunk):
        """The chunk's chromosomes as codes into the fragments' chromosomes, new ones added."""
        self.chromosomes += _new_chromosomes(
            chunk["chrom"], known=self.chromosomes, index_type=self.index_type, xp=self.xp
        )
        self.features.reach(self.chromosomes)
        return self.xp.asarray(self.index_type(self.chromosomes).get_indexer(chunk["chrom"]), dtype=self.xp.int64)

    def _count_lengths(self, cell, length) -> None:
        """Fragments per cell: all, nucleosome-free and mono-nucleosomal ones."""
        self._count("n_fragments", cell)
        self._count("nucleosome_free", cell[length < NUCLEOSOME_FREE])
        self._count("mono_nucleosome", cell[(length >= NUCLEOSOME_FREE) & (length <= MONO_NUCLEOSOME)])

    def _count(self, name: str, cell, *, weights=None) -> None:
        """Add the fragments of ``cell`` (or their ``weights``) to the per-cell counts ``name``."""
        self.per_cell[PER_CELL.index(name)] += _bincount(
            cell, weights=weights, minlength=len(self.barcodes), xp=self.xp
        )

    def check_matched(self) -> None:
        """Stop where the fragments miss every cell, or the peaks every chromosome; log the shares.

        One share of fragments matched is normal: 10x files hold the fragments of every barcode.
        """
        in_cells = int(self.per_cell[PER_CELL.index("n_fragments")].sum())
        if self.outside_cells and not in_cells:
            raise InputError(_unmatched_barcodes(self.outside_cells, list(self.outside_examples), self.barcodes))
        cells_with_fragments = int((self.per_cell[PER_CELL.index("n_fragments")] > 0).sum())
        shares = [
            f"{in_cells:,} of {in_cells + self.outside_cells:,} fragments in the cells",
            f"{cells_with_fragments:,} of {len(self.barcodes):,} cells with fragments",
        ]
        if isinstance(self.features, Peaks) and self.chromosomes and self.features.chromosomes:
            with_peaks = set(self.chromosomes) & set(self.features.chromosomes)
            if not with_peaks:
                raise InputError(_unmatched_chromosomes(self.chromosomes, self.features.chromosomes))
            shares.append(f"{len(with_peaks)} of the fragments' {len(self.chromosomes)} chromosomes with peaks")
        log.info("fragments: %s", "; ".join(shares))

    def to_anndata(self) -> AnnData:
        """The counts (all features finished) and the QC per cell, as :func:`count_fragments` returns them."""
        self.columns.add(self.xp.zeros(0, dtype=self.xp.int64), finished_below=None)
        matrix, names = self.features.matrix(self.columns, n_cells=len(self.barcodes), chromosomes=self.chromosomes)
        per_cell = self.per_cell if self.tss is not None else self.per_cell[: len(PER_CELL) - 2]
        return _to_anndata(
            matrix,
            names,
            dict(zip(PER_CELL, asnumpy(per_cell), strict=False)),
            barcodes=self.barcodes,
            outside_cells=self.outside_cells,
            features=self.features.description,
        )


def _bincount(values, *, minlength: int, xp: ModuleType, weights=None):
    """Integer counts (weighted sums) per value; CuPy's ``bincount`` refuses empty input."""
    if values.size == 0:
        return xp.zeros(minlength, dtype=xp.int64)
    return xp.bincount(values, weights=weights, minlength=minlength).astype(xp.int64)


def _check_coordinates(chunk, *, start, end, xp: ModuleType) -> None:
    bad = (start < 0) | (end <= start) | (end >= MAX_POSITION)
    n_bad = int(bad.sum())
    if n_bad:
        i = int(xp.argmax(bad))
        raise InputError(
            f"{n_bad} fragments with bad coordinates, e.g. {chunk['chrom'].iloc[i]}:{int(start[i])}-{int(end[i])}"
        )


def _check_genome(chunk, *, end, chrom_sizes: Mapping[str, int], index_type, xp: ModuleType) -> None:
    code = xp.asarray(index_type(list(chrom_sizes)).get_indexer(chunk["chrom"]), dtype=xp.int64)
    unknown = code < 0
    if bool(unknown.any()):
        names = sorted(_host(chunk["chrom"][unknown].unique()))
        raise InputError(
            f"{int(unknown.sum())} fragments on chromosomes not in the genome's sizes: "
            f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
        )
    past = end > xp.asarray(list(chrom_sizes.values()), dtype=xp.int64)[code]
    if bool(past.any()):
        i = int(xp.argmax(past))
        name = chunk["chrom"].iloc[i]
        raise InputError(
            f"{int(past.sum())} fragments end past their chromosome, e.g. {name}:...-{int(end[i])} "
            f"({name} is {chrom_sizes[name]:,} bp)"
        )


def _host(values):
    """The pandas values of a cuDF object; pandas and NumPy ones as they are."""
    return values.to_pandas() if hasattr(values, "to_pandas") else values


def _unmatched_barcodes(n_fragments: int, examples: list[str], cells: pd.Index) -> str:
    """What the fragments' barcodes and the cells' have apart, when no fragment is a cell's."""
    problem = (
        f"none of the {n_fragments:,} fragments is of one of the {len(cells):,} cells: barcodes like "
        f"{examples[0]!r} against the cells' {cells[0]!r}"
    )
    bare_cells = {BARCODE_SUFFIX.sub("", barcode) for barcode in cells}
    if any(BARCODE_SUFFIX.sub("", barcode) in bare_cells for barcode in examples):
        problem += "; they match without the '-<number>' suffix: give the fragments' and the cells' barcodes the same"
    return problem


def _unmatched_chromosomes(fragments: list[str], peaks: list[str]) -> str:
    """What the fragments' chromosomes and the peaks' have apart, when they share none."""
    problem = f"the fragments' chromosomes ({_some(fragments)}) and the peaks' ({_some(peaks)}) share none"
    if {name.removeprefix("chr") for name in fragments} & {name.removeprefix("chr") for name in peaks}:
        problem += "; they match without the 'chr' prefix: name the chromosomes alike in both files"
    return problem


def _some(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _new_chromosomes(chrom, *, known: list[str], index_type, xp: ModuleType) -> list[str]:
    """A chunk's chromosomes that are not ``known``, in order of first appearance."""
    seen = set(known)
    new = [name for name in _host(chrom.unique()).tolist() if name not in seen]
    if len(new) < 2:
        return new
    code = xp.asarray(index_type(new).get_indexer(chrom), dtype=xp.int64)
    first_codes, _ = runs(code, xp=xp)
    return [new[i] for i in dict.fromkeys(asnumpy(first_codes).tolist()) if i >= 0]


def _check_sorted(chunk, position, *, after: int, xp: ModuleType) -> int:
    """The chunk's last position, once its positions are found to ascend from ``after``."""
    earlier = xp.concatenate([xp.asarray([after], dtype=xp.int64), position[:-1]])
    unsorted = position < earlier
    if bool(unsorted.any()):
        i = int(xp.argmax(unsorted))
        raise InputError(
            f"fragments are not sorted by chromosome and start as 10x writes them (e.g. "
            f"{chunk['chrom'].iloc[i]}:{int(position[i]) & (MAX_POSITION - 1)} comes after a later "
            "position or another chromosome); sort them first (sort -k1,1 -k2,2n)"
        )
    return int(position[-1])


def _to_anndata(
    matrix: sparse.csc_matrix,
    names: np.ndarray,
    per_cell: dict[str, np.ndarray],
    *,
    barcodes: pd.Index,
    outside_cells: int,
    features: str,
) -> AnnData:
    """The counts, the features' names and the QC metrics as an AnnData."""
    obs = pd.DataFrame(
        {
            "n_fragments": per_cell["n_fragments"],
            "nucleosome_signal": per_cell["mono_nucleosome"] / np.maximum(per_cell["nucleosome_free"], 1),
            "frac_in_features": per_cell["in_features"] / np.maximum(per_cell["n_fragments"], 1),
        },
        index=pd.Index(barcodes, dtype=str),
    )
    if "tss_center" in per_cell:
        obs["tss_enrichment"] = _tss_enrichment(per_cell["tss_center"], per_cell["tss_flank"])
    adata = AnnData(matrix, obs=obs, var=pd.DataFrame(index=pd.Index(names, dtype=object)))
    adata.uns["fragments"] = {"outside_cells": outside_cells, "features": features}
    return adata


def _tss_enrichment(center: np.ndarray, flank: np.ndarray) -> np.ndarray:
    """Mean coverage per central position over mean per flank position.

    A cell without flank coverage gets the cells' mean flank instead (as muon does).
    """
    flank_mean = flank / (2 * TSS_FLANK)
    flank_mean = np.where(flank_mean == 0, flank_mean.mean(), flank_mean)
    return (center / TSS_CENTER) / flank_mean
