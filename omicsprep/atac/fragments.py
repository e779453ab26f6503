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

from omicsprep.atac.columns import CELL_BITS, FEATURE_BITS, FeatureColumns, position_in, runs
from omicsprep.backend import Backend, array_module, asnumpy, cudf
from omicsprep.errors import InputError, naming_file

NUCLEOSOME_FREE = 147  # fragments shorter than one nucleosome's DNA (bp)
MONO_NUCLEOSOME = 294  # up to this length: one nucleosome
MAX_POSITION = 1 << 32  # positions are keyed chromosome << 32 + bp
PER_CELL = ("n_fragments", "nucleosome_free", "mono_nucleosome", "in_features", "tss_center", "tss_flank")
# TSS enrichment as ENCODE defines it and muon computes it: fragment coverage (weighted by
# reads) summed over windows of +-1 kb around every TSS; the mean over the central 1,001
# positions against the mean over the 100 positions at each end.
TSS_EXTEND = 1000
TSS_FLANK = 100
TSS_CENTER = 1001
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
    features = _Peaks(_checked_peaks(peaks), xp) if peaks is not None else _Tiles(tile_width, xp)
    windows = _TssWindows(tss, xp) if tss is not None else None
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
        features: _Peaks | _Tiles,
        chrom_sizes: Mapping[str, int] | None,
        tss: _TssWindows | None,
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
        self.last_position = _check_sorted(chunk, _position_keys(chrom, start), after=self.last_position, xp=xp)
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
        if isinstance(self.features, _Peaks) and self.chromosomes and self.features.chromosomes:
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


class _Peaks:
    """Peaks numbered as the sorted fragments reach their chromosome.

    The numbers thus ascend with the fragments; peaks on chromosomes without fragments come last.
    """

    def __init__(self, peaks: pd.DataFrame, xp: ModuleType) -> None:
        self.xp, self.peaks = xp, peaks
        self.chromosomes, (self.starts, self.ends) = _keyed(peaks["chrom"], peaks["start"], peaks["end"], xp=xp)
        codes = pd.Index(self.chromosomes).get_indexer(peaks["chrom"])  # ascending: peaks are sorted
        self.first = np.searchsorted(codes, np.arange(len(self.chromosomes) + 1))
        self.numbers = xp.full(len(peaks), -1, dtype=xp.int64)
        self.block = np.full(len(self.chromosomes), -1)  # each chromosome's first number
        self.assigned = 0

    def reach(self, chromosomes: Iterable[str]) -> None:
        """Number the peaks of chromosomes the fragments have reached, in that order."""
        for code in pd.Index(self.chromosomes).get_indexer(list(chromosomes)):
            if code >= 0 and self.block[code] < 0:
                first, last = self.first[code], self.first[code + 1]
                self.block[code] = self.assigned
                self.numbers[first:last] = self.xp.arange(self.assigned, self.assigned + last - first)
                self.assigned += last - first

    def first_reachable(self, chromosome: str, start: int) -> int:
        """The first peak number a fragment starting at ``start`` (or later) on ``chromosome`` can overlap."""
        if chromosome not in self.chromosomes:
            return self.assigned
        code = self.chromosomes.index(chromosome)
        peak = position_in(self.ends, _position_keys(code, start), side="right", xp=self.xp)
        return int(self.block[code] + peak - self.first[code])

    def order(self) -> np.ndarray:
        """The peaks (as sorted) in number order, the unreached ones numbered last."""
        self.reach(self.chromosomes)
        return np.argsort(asnumpy(self.numbers))

    description = "peaks"

    def finished_below(self, chromosomes: list[str], code: int, start: int) -> int:
        """The first peak number that fragments after one at ``start`` can still reach.

        The fragment is on chromosome ``code`` (into ``chromosomes``).
        """
        return self.first_reachable(chromosomes[code], start)

    def overlaps(self, chrom, start, end, *, chromosomes: list[str]):
        """(fragment, peak number) pairs that overlap; ``chrom`` codes into ``chromosomes``."""
        peak_chrom = _recoded(chrom, source=chromosomes, target=self.chromosomes, xp=self.xp)
        fragment, peak = _overlapped_peaks(peak_chrom, start, end, self.starts, self.ends, xp=self.xp)
        return fragment, self.numbers[peak]

    def matrix(self, columns: FeatureColumns, *, n_cells: int, chromosomes: list[str]):
        """The counts (CSC) with a column per peak, in number order, and the peaks' names."""
        order = self.order()
        matrix, _ = columns.csc(n_cells=n_cells, n_features=len(order))
        return matrix, _interval_names(*(self.peaks[column].to_numpy()[order] for column in ("chrom", "start", "end")))


class _Tiles:
    """Genome tiles of ``width`` bp, numbered ``chromosome << bits | tile`` to ascend with the fragments."""

    def __init__(self, width: int, xp: ModuleType) -> None:
        self.width, self.xp = width, xp
        self.bits = (MAX_POSITION // width).bit_length()
        self.description = f"tiles of {width} bp"

    def reach(self, chromosomes: list[str]) -> None:
        """Check that the tile numbers can key the chromosomes the fragments have reached."""
        if len(chromosomes) >= 1 << (FEATURE_BITS - self.bits):
            raise InputError(
                f"fragments on {len(chromosomes):,} chromosomes or contigs: at most "
                f"{(1 << (FEATURE_BITS - self.bits)) - 1:,} with {self.width} bp tiles; use larger "
                "tiles or peaks"
            )

    def finished_below(self, chromosomes: list[str], code: int, start: int) -> int:
        """The tile of a fragment at ``start`` on chromosome ``code``: later ones reach no tile below it."""
        return (code << self.bits) | (start // self.width)

    def overlaps(self, chrom, start, end, *, chromosomes: list[str]):
        """(fragment, tile number) pairs."""
        fragment, tile = _overlapped_tiles(start, end, self.width, xp=self.xp)
        return fragment, (chrom[fragment] << self.bits) | tile

    def matrix(self, columns: FeatureColumns, *, n_cells: int, chromosomes: list[str]):
        """The counts (CSC) with a column per tile with counts, in number order, and the tiles' names."""
        matrix, tiles = columns.csc(n_cells=n_cells, n_features=None)
        first = (tiles & ((1 << self.bits) - 1)) * self.width
        return matrix, _interval_names(np.array(chromosomes, dtype=str)[tiles >> self.bits], first, first + self.width)


class _TssWindows:
    """Windows of +-``TSS_EXTEND`` bp around transcription start sites, in sorted order.

    Keyed by their first bp (:func:`_position_keys`; they may start below 0).
    """

    def __init__(self, tss: pd.DataFrame, xp: ModuleType) -> None:
        tss = tss.sort_values(["chrom", "position"], ignore_index=True)
        self.chromosomes, (self.starts,) = _keyed(tss["chrom"], tss["position"] - TSS_EXTEND, xp=xp)
        self.xp = xp

    def coverage(self, chrom, start, end, *, chromosomes: list[str]):
        """:func:`_tss_coverage` of fragments whose ``chrom`` codes into ``chromosomes``."""
        tss_chrom = _recoded(chrom, source=chromosomes, target=self.chromosomes, xp=self.xp)
        return _tss_coverage(tss_chrom, start, end, self.starts, xp=self.xp)


def _bincount(values, *, minlength: int, xp: ModuleType, weights=None):
    """Integer counts (weighted sums) per value; CuPy's ``bincount`` refuses empty input."""
    if values.size == 0:
        return xp.zeros(minlength, dtype=xp.int64)
    return xp.bincount(values, weights=weights, minlength=minlength).astype(xp.int64)


def _checked_peaks(peaks: pd.DataFrame) -> pd.DataFrame:
    """Peaks sorted by chromosome and start; overlapping peaks refused."""
    peaks = peaks.sort_values(["chrom", "start"], ignore_index=True)
    same_chrom = peaks["chrom"].to_numpy()[1:] == peaks["chrom"].to_numpy()[:-1]
    overlapping = same_chrom & (peaks["start"].to_numpy()[1:] < peaks["end"].to_numpy()[:-1])
    if overlapping.any():
        first = peaks.iloc[int(np.flatnonzero(overlapping)[0])]
        raise InputError(
            f"{int(overlapping.sum())} peaks overlap the previous one (e.g. after "
            f"{first['chrom']}:{first['start']}-{first['end']}); merge them first"
        )
    return peaks


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


def _expanded(first, n, *, xp: ModuleType):
    """(i, first[i] + j) for j < n[i]: a fragment's consecutive features (n is small)."""
    fragments, features = [], []
    for j in range(int(n.max()) if n.size else 0):
        (selected,) = xp.nonzero(n > j)
        fragments.append(selected)
        features.append(first[selected] + j)
    if not fragments:
        return xp.zeros(0, dtype=xp.int64), xp.zeros(0, dtype=xp.int64)
    return xp.concatenate(fragments), xp.concatenate(features)


def _host(values):
    """The pandas values of a cuDF object; pandas and NumPy ones as they are."""
    return values.to_pandas() if hasattr(values, "to_pandas") else values


def _position_keys(code, position):
    """Positions keyed by chromosome, ``code << 32 + bp``.

    Sorted by chromosome, then position, so one sorted search over all chromosomes stays
    within each.
    """
    return (code << 32) + position


def _keyed(chrom: pd.Series, *positions: pd.Series, xp: ModuleType):
    """The chromosomes in order of appearance, and each positions column keyed by them.

    The keys (:func:`_position_keys`) are on the device.
    """
    chromosomes = list(dict.fromkeys(chrom))
    code = pd.Index(chromosomes).get_indexer(chrom).astype(np.int64)
    return chromosomes, [xp.asarray(_position_keys(code, p.to_numpy(np.int64))) for p in positions]


def _in_sorted_range(code, first, last, *, xp: ModuleType):
    """(fragment, i) for first <= i < last, where the fragment's chromosome is known."""
    return _expanded(first, xp.where(code >= 0, xp.maximum(last - first, 0), 0), xp=xp)


def _overlapped_peaks(chrom, start, end, peak_starts, peak_ends, *, xp: ModuleType):
    """(fragment, peak) pairs that overlap; peaks do not overlap, so their ends are sorted too."""
    first = xp.searchsorted(peak_ends, _position_keys(chrom, start), side="right")
    last = xp.searchsorted(peak_starts, _position_keys(chrom, end), side="left")
    return _in_sorted_range(chrom, first, last, xp=xp)


def _tss_coverage(code, start, end, windows, *, xp: ModuleType):
    """Each (fragment, TSS window) overlap.

    The fragment, and how many of the window's central and flank positions it covers.
    Windows (keyed by their first bp) are sorted and equally long, so a fragment's windows
    are one sorted range. As muon fetches them, a window takes fragments that start before
    TSS + 1 kb.
    """
    width = 2 * TSS_EXTEND
    key_start, key_end = _position_keys(code, start), _position_keys(code, end)
    first = xp.searchsorted(windows, key_start - width, side="right")
    last = xp.searchsorted(windows, key_end, side="left")
    fragment, window = _in_sorted_range(code, first, last, xp=xp)
    offset = windows[window]
    low = xp.maximum(key_start[fragment] - offset, 0)
    high = xp.minimum(key_end[fragment] - offset, width + 1)  # positions -1000..+1000

    def covered(a: int, b: int):
        return xp.maximum(xp.minimum(high, b) - xp.maximum(low, a), 0)

    margin = (width + 1 - TSS_CENTER) // 2
    center = covered(margin, margin + TSS_CENTER)
    flank = covered(0, TSS_FLANK) + covered(width + 1 - TSS_FLANK, width + 1)
    return fragment, center, flank


def _overlapped_tiles(start, end, tile_width: int, *, xp: ModuleType):
    """(fragment, tile) pairs."""
    first = start // tile_width
    return _expanded(first, (end - 1) // tile_width - first + 1, xp=xp)


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


def _recoded(code, *, source: list[str], target: list[str], xp: ModuleType):
    """Chromosome codes into ``source`` as codes into ``target`` (-1: not there).

    The chunk's names are looked up once, in ``source``.
    """
    return xp.asarray(pd.Index(target).get_indexer(source), dtype=xp.int64)[code]


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


def _interval_names(chrom: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``chrom:start-end`` for each interval (built by Arrow: hundreds of thousands of tiles are common)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    position = pc.binary_join_element_wise(
        pc.cast(pa.array(start), pa.string()), pc.cast(pa.array(end), pa.string()), "-"
    )
    return pc.binary_join_element_wise(pa.array(chrom, type=pa.string()), position, ":").to_numpy(zero_copy_only=False)
