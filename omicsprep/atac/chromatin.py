"""Chromatin accessibility (scATAC): fragments counted into peaks or genome tiles, QC,
TF-IDF and LSI, on either backend.

Fragments arrive in chunks (:func:`omicsprep.io.fragment_chunks`), so memory follows the
chunk size and the output matrix, not the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend, array_module, asnumpy, cudf, cupyx_sparse
from omicsprep.errors import InputError

NUCLEOSOME_FREE = 147  # fragments shorter than one nucleosome's DNA (bp)
MONO_NUCLEOSOME = 294  # up to this length: one nucleosome


FEATURE_BITS = 40  # (feature, cell) keys: feature << 23 | cell; a tile is chromosome << tile bits | tile
CELL_BITS = 63 - FEATURE_BITS
MAX_POSITION = 1 << 32  # positions are keyed chromosome << 32 + bp
PER_CELL = ("n_fragments", "nucleosome_free", "mono_nucleosome", "in_features", "tss_center", "tss_flank")
# TSS enrichment as ENCODE defines it and muon computes it: fragment coverage (weighted by
# reads) summed over windows of +-1 kb around every TSS; the mean over the central 1,001
# positions against the mean over the 100 positions at each end.
TSS_EXTEND = 1000
TSS_FLANK = 100
TSS_CENTER = 1001
HOST_GROWTH = 1.25  # spare room of the growing host output: realloc grows it in place, so it is the only copy


class _Columns:
    """The output matrix in feature-major (CSC) order, a block of finished features at a
    time: the fragments are sorted, so once they have passed a feature its counts are
    final. Only the unfinished features' (feature, cell) counts wait for the next chunk."""

    def __init__(self, xp: ModuleType) -> None:
        self.xp = xp
        self.cells, self.counts, self.size = xp.zeros(0, xp.int32), xp.zeros(0, xp.float32), 0
        self.features: list[np.ndarray] = []  # each block's finished features, and their non-zeros
        self.lengths: list[np.ndarray] = []
        self.waiting_keys, self.waiting_counts = xp.zeros(0, xp.int64), xp.zeros(0, xp.int64)

    def add(self, keys, *, finished_below: int | None) -> None:  # noqa: ANN001
        """Count a chunk's ``feature << CELL_BITS | cell`` keys; features below
        ``finished_below`` (all when ``None``) are final after it."""
        xp = self.xp
        keys, counts = xp.unique(keys, return_counts=True)
        keys, counts = _merged(self.waiting_keys, self.waiting_counts, keys, counts.astype(xp.int64), xp=xp)
        cut = keys.size if finished_below is None else _position_in(keys, finished_below << CELL_BITS, xp=xp)
        self.waiting_keys, self.waiting_counts = keys[cut:], counts[cut:]
        keys, counts = keys[:cut], counts[:cut]
        features, lengths = _runs(keys >> CELL_BITS, xp=xp)
        self.features.append(asnumpy(features))
        self.lengths.append(asnumpy(lengths))
        self.cells = _appended(self.cells, self.size, (keys & ((1 << CELL_BITS) - 1)).astype(xp.int32), xp=xp)
        self.counts = _appended(self.counts, self.size, counts.astype(xp.float32), xp=xp)
        self.size += keys.size

    def csc(self, *, n_cells: int, n_features: int | None):  # noqa: ANN201
        """The counts as a SciPy CSC matrix, and its features; with ``n_features``, every
        feature number below it is a column (peaks), else only those with counts (tiles)."""
        if self.size >= 1 << 31:  # indices are int32 (the only kind cupyx has)
            raise InputError(f"{self.size:,} non-zero (cell, feature) counts: more than a sparse matrix holds here")
        features, lengths = np.concatenate([np.zeros(0, np.int64), *self.features]), np.concatenate(
            [np.zeros(0, np.int64), *self.lengths])
        columns = np.arange(n_features) if n_features is not None else features
        per_column = np.zeros(columns.size, dtype=np.int64)
        per_column[np.searchsorted(columns, features)] = lengths
        indptr = np.concatenate([[0], np.cumsum(per_column)]).astype(np.int32)
        cells, counts = _trimmed(self.cells, self.size), _trimmed(self.counts, self.size)
        matrix = sparse.csc_matrix((asnumpy(counts), asnumpy(cells), indptr), shape=(n_cells, columns.size))
        matrix.has_sorted_indices = True  # cells ascend within each feature
        return matrix, columns


def _merged(keys_a, counts_a, keys_b, counts_b, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """Two sorted arrays of unique keys as one, the counts of keys in both summed; by
    positions, without sorting again."""
    if keys_a.size == 0 or keys_b.size == 0:
        return (keys_b, counts_b) if keys_a.size == 0 else (keys_a, counts_a)
    keys = xp.empty(keys_a.size + keys_b.size, dtype=xp.int64)
    counts = xp.empty_like(keys)
    at_a = xp.arange(keys_a.size) + xp.searchsorted(keys_b, keys_a, side="left")
    at_b = xp.arange(keys_b.size) + xp.searchsorted(keys_a, keys_b, side="right")
    keys[at_a], keys[at_b], counts[at_a], counts[at_b] = keys_a, keys_b, counts_a, counts_b
    repeated = keys[1:] == keys[:-1]  # a key of both arrays: A's copy, then B's
    counts[:-1][repeated] += counts[1:][repeated]
    kept = xp.concatenate([xp.ones(1, dtype=bool), ~repeated])
    return keys[kept], counts[kept]


def _position_in(sorted_values, value: int, *, xp: ModuleType, side: str = "left") -> int:  # noqa: ANN001
    """Where ``value`` goes in ``sorted_values`` (CuPy searches arrays only)."""
    return int(xp.searchsorted(sorted_values, xp.asarray([value], dtype=xp.int64), side=side)[0])


def _runs(values, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """Each run of equal values in sorted ``values``: the value and its length."""
    starts = xp.flatnonzero(xp.concatenate([xp.ones(min(values.size, 1), dtype=bool), values[1:] != values[:-1]]))
    return values[starts], xp.diff(xp.concatenate([starts, xp.asarray([values.size])]))


def _appended(buffer, size: int, values, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """``buffer[:size]`` followed by ``values``, in a buffer with room to grow: on the
    host resized in place (realloc moves no pages), so the output never exists twice;
    on the device doubled."""
    needed = size + values.size
    if needed > buffer.size:
        capacity = max(needed, int(buffer.size * (HOST_GROWTH if xp is np else 2)))
        if xp is np:
            buffer.resize(capacity, refcheck=False)
        else:
            grown = xp.empty(capacity, dtype=buffer.dtype)
            grown[:size] = buffer[:size]
            buffer = grown
    buffer[size:needed] = values
    return buffer


def _trimmed(buffer, size: int):  # noqa: ANN001, ANN202
    """The first ``size`` elements: the host buffer shrunk in place, a view on the device."""
    if isinstance(buffer, np.ndarray):
        buffer.resize(size, refcheck=False)
        return buffer
    return buffer[:size]


class _PeakNumbers:
    """Peaks numbered as the sorted fragments reach their chromosome, so that the numbers
    ascend with the fragments; peaks on chromosomes without fragments come last."""

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
        """The first peak number a fragment starting at ``start`` (or later) on
        ``chromosome`` can overlap."""
        if chromosome not in self.chromosomes:
            return self.assigned
        code = self.chromosomes.index(chromosome)
        peak = _position_in(self.ends, _position_keys(code, start), side="right", xp=self.xp)
        return int(self.block[code] + peak - self.first[code])

    def order(self) -> np.ndarray:
        """The peaks (as sorted) in number order, the unreached ones numbered last."""
        self.reach(self.chromosomes)
        return np.argsort(asnumpy(self.numbers))


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
        overlapping peaks.
    """
    xp = array_module(backend)
    index_type = cudf().Index if backend == "gpu" else pd.Index
    if not barcodes.is_unique:
        raise InputError(f"cell barcodes repeat, e.g. {barcodes[barcodes.duplicated()][0]!r}")
    if len(barcodes) >= 1 << CELL_BITS:
        raise InputError(f"{len(barcodes):,} cells: more than this count can key")
    tile_bits = (MAX_POSITION // tile_width).bit_length()
    cells = index_type(np.asarray(barcodes, dtype=str))
    per_cell = xp.zeros((len(PER_CELL), len(barcodes)), dtype=xp.int64)
    columns, outside_cells, last_position = _Columns(xp), 0, -1
    chromosomes: list[str] = []  # in the fragments' order
    numbers = _PeakNumbers(_checked_peaks(peaks), xp) if peaks is not None else None
    if tss is not None:
        tss = tss.sort_values(["chrom", "position"], ignore_index=True)
        tss_chromosomes, (windows,) = _keyed(tss["chrom"], tss["position"] - TSS_EXTEND, xp=xp)  # may start below 0
    with _naming_errors(source):  # the loop's errors are the fragments'
        for chunk in chunks:
            if len(chunk) == 0:
                continue
            start = xp.asarray(chunk["start"].values, dtype=xp.int64)
            end = xp.asarray(chunk["end"].values, dtype=xp.int64)
            _check_coordinates(chunk, start=start, end=end, xp=xp)
            if chrom_sizes is not None:
                _check_genome(chunk, end=end, chrom_sizes=chrom_sizes, index_type=index_type, xp=xp)
            chromosomes += _new_chromosomes(chunk["chrom"], known=chromosomes, index_type=index_type, xp=xp)
            if peaks is None and len(chromosomes) >= 1 << (FEATURE_BITS - tile_bits):
                raise InputError(f"fragments on {len(chromosomes):,} chromosomes or contigs: at most "
                                 f"{(1 << (FEATURE_BITS - tile_bits)) - 1:,} with {tile_width} bp tiles; use larger "
                                 "tiles or peaks")
            chrom = xp.asarray(index_type(chromosomes).get_indexer(chunk["chrom"]), dtype=xp.int64)
            last_position = _check_sorted(chunk, _position_keys(chrom, start), after=last_position, xp=xp)
            last_start = int(start[-1])
            if numbers is not None:
                numbers.reach(chromosomes)
                finished_below = numbers.first_reachable(chromosomes[int(chrom[-1])], last_start)
            else:
                finished_below = (int(chrom[-1]) << tile_bits) | (last_start // tile_width)
            cell = xp.asarray(cells.get_indexer(chunk["barcode"]), dtype=xp.int64)
            inside = cell >= 0
            outside_cells += int((~inside).sum())
            cell, chrom, start, end = cell[inside], chrom[inside], start[inside], end[inside]
            length = end - start
            for row, selected in enumerate([cell, cell[length < NUCLEOSOME_FREE],
                                            cell[(length >= NUCLEOSOME_FREE) & (length <= MONO_NUCLEOSOME)]]):
                per_cell[row] += _bincount(selected, minlength=len(barcodes), xp=xp)
            if numbers is not None:
                peak_chrom = _recoded(chrom, source=chromosomes, target=numbers.chromosomes, xp=xp)
                fragment, peak = _overlapped_peaks(peak_chrom, start, end, numbers.starts, numbers.ends, xp=xp)
                feature = numbers.numbers[peak]
            else:
                fragment, tile = _overlapped_tiles(start, end, tile_width, xp=xp)
                feature = (chrom[fragment] << tile_bits) | tile
            columns.add((feature << CELL_BITS) | cell[fragment], finished_below=finished_below)
            in_feature = xp.zeros(cell.size, dtype=bool)
            in_feature[fragment] = True
            per_cell[3] += _bincount(cell[in_feature], minlength=len(barcodes), xp=xp)
            if tss is not None:
                reads = xp.asarray(chunk["count"].values, dtype=xp.int64)[inside]
                tss_chrom = _recoded(chrom, source=chromosomes, target=tss_chromosomes, xp=xp)
                fragment, center, flank = _tss_coverage(tss_chrom, start, end, windows, xp=xp)
                for row, covered in ((4, center), (5, flank)):
                    per_cell[row] += _bincount(cell[fragment], weights=covered * reads[fragment],
                                               minlength=len(barcodes), xp=xp)
    columns.add(xp.zeros(0, dtype=xp.int64), finished_below=None)
    if numbers is not None:
        order = numbers.order()
        matrix, _ = columns.csc(n_cells=len(barcodes), n_features=len(order))
        names = _interval_names(*(numbers.peaks[column].to_numpy()[order] for column in ("chrom", "start", "end")))
    else:
        matrix, tiles = columns.csc(n_cells=len(barcodes), n_features=None)
        first = (tiles & ((1 << tile_bits) - 1)) * tile_width
        names = _interval_names(np.array(chromosomes, dtype=str)[tiles >> tile_bits], first, first + tile_width)
    if tss is None:
        per_cell = per_cell[: len(PER_CELL) - 2]
    features = "peaks" if peaks is not None else f"tiles of {tile_width} bp"
    return _to_anndata(matrix, names, dict(zip(PER_CELL, asnumpy(per_cell))), barcodes=barcodes,
                       outside_cells=outside_cells, features=features)


def _bincount(values, *, minlength: int, xp: ModuleType, weights=None):  # noqa: ANN001, ANN202
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
        raise InputError(f"{int(overlapping.sum())} peaks overlap the previous one (e.g. after "
                         f"{first['chrom']}:{first['start']}-{first['end']}); merge them first")
    return peaks


def _check_coordinates(chunk, *, start, end, xp: ModuleType) -> None:  # noqa: ANN001
    bad = (start < 0) | (end <= start) | (end >= MAX_POSITION)
    n_bad = int(bad.sum())
    if n_bad:
        i = int(xp.argmax(bad))
        raise InputError(f"{n_bad} fragments with bad coordinates, e.g. "
                         f"{chunk['chrom'].iloc[i]}:{int(start[i])}-{int(end[i])}")


def _check_genome(chunk, *, end, chrom_sizes: Mapping[str, int], index_type, xp: ModuleType) -> None:  # noqa: ANN001
    code = xp.asarray(index_type(list(chrom_sizes)).get_indexer(chunk["chrom"]), dtype=xp.int64)
    unknown = code < 0
    if bool(unknown.any()):
        names = sorted(_host(chunk["chrom"][unknown].unique()))
        raise InputError(f"{int(unknown.sum())} fragments on chromosomes not in the genome's sizes: "
                         f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")
    past = end > xp.asarray(list(chrom_sizes.values()), dtype=xp.int64)[code]
    if bool(past.any()):
        i = int(xp.argmax(past))
        name = chunk["chrom"].iloc[i]
        raise InputError(f"{int(past.sum())} fragments end past their chromosome, e.g. {name}:...-{int(end[i])} "
                         f"({name} is {chrom_sizes[name]:,} bp)")


def _expanded(first, n, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """(i, first[i] + j) for j < n[i]: a fragment's consecutive features (n is small)."""
    fragments, features = [], []
    for j in range(int(n.max()) if n.size else 0):
        (selected,) = xp.nonzero(n > j)
        fragments.append(selected)
        features.append(first[selected] + j)
    if not fragments:
        return xp.zeros(0, dtype=xp.int64), xp.zeros(0, dtype=xp.int64)
    return xp.concatenate(fragments), xp.concatenate(features)


def _host(values):  # noqa: ANN001, ANN202
    """pandas values of a cuDF object; pandas and NumPy ones as they are."""
    return values.to_pandas() if hasattr(values, "to_pandas") else values


def _position_keys(code, position):  # noqa: ANN001, ANN202
    """Positions keyed by chromosome, ``code << 32 + bp``: sorted by chromosome, then
    position, so one sorted search over all chromosomes stays within each."""
    return (code << 32) + position


def _keyed(chrom: pd.Series, *positions: pd.Series, xp: ModuleType):  # noqa: ANN202
    """The chromosomes in order of appearance, and each positions column keyed by them
    (:func:`_position_keys`) on the device."""
    chromosomes = list(dict.fromkeys(chrom))
    code = pd.Index(chromosomes).get_indexer(chrom).astype(np.int64)
    return chromosomes, [xp.asarray(_position_keys(code, p.to_numpy(np.int64))) for p in positions]


def _in_sorted_range(code, first, last, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """(fragment, i) for first <= i < last, where the fragment's chromosome is known."""
    return _expanded(first, xp.where(code >= 0, xp.maximum(last - first, 0), 0), xp=xp)


def _overlapped_peaks(chrom, start, end, peak_starts, peak_ends, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """(fragment, peak) pairs that overlap; peaks do not overlap, so their ends are sorted
    too."""
    first = xp.searchsorted(peak_ends, _position_keys(chrom, start), side="right")
    last = xp.searchsorted(peak_starts, _position_keys(chrom, end), side="left")
    return _in_sorted_range(chrom, first, last, xp=xp)


def _tss_coverage(code, start, end, windows, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """Each (fragment, TSS window) overlap: the fragment, and how many of the window's
    central and flank positions it covers. Windows (keyed by their first bp) are sorted
    and equally long, so a fragment's windows are one sorted range. As muon fetches them,
    a window takes fragments that start before TSS + 1 kb."""
    width = 2 * TSS_EXTEND
    key_start, key_end = _position_keys(code, start), _position_keys(code, end)
    first = xp.searchsorted(windows, key_start - width, side="right")
    last = xp.searchsorted(windows, key_end, side="left")
    fragment, window = _in_sorted_range(code, first, last, xp=xp)
    offset = windows[window]
    low = xp.maximum(key_start[fragment] - offset, 0)
    high = xp.minimum(key_end[fragment] - offset, width + 1)  # positions -1000..+1000

    def covered(a: int, b: int):  # noqa: ANN202 - of the window's positions [a, b)
        return xp.maximum(xp.minimum(high, b) - xp.maximum(low, a), 0)

    margin = (width + 1 - TSS_CENTER) // 2
    center = covered(margin, margin + TSS_CENTER)
    flank = covered(0, TSS_FLANK) + covered(width + 1 - TSS_FLANK, width + 1)
    return fragment, center, flank


def _overlapped_tiles(start, end, tile_width: int, *, xp: ModuleType):  # noqa: ANN001, ANN202
    """(fragment, tile) pairs."""
    first = start // tile_width
    return _expanded(first, (end - 1) // tile_width - first + 1, xp=xp)


@contextmanager
def _naming_errors(source: str | Path | None) -> Iterator[None]:
    """Input errors raised within name ``source`` (unless they name a file already)."""
    try:
        yield
    except InputError as exc:
        if source is None or exc.path is not None:
            raise
        raise InputError(exc.problem, path=source, sample=exc.sample) from exc


def _new_chromosomes(chrom, *, known: list[str], index_type, xp: ModuleType) -> list[str]:  # noqa: ANN001
    """A chunk's chromosomes that are not ``known``, in order of first appearance."""
    seen = set(known)
    new = [name for name in _host(chrom.unique()).tolist() if name not in seen]
    if len(new) < 2:
        return new
    code = xp.asarray(index_type(new).get_indexer(chrom), dtype=xp.int64)
    runs, _ = _runs(code, xp=xp)
    return [new[i] for i in dict.fromkeys(asnumpy(runs).tolist()) if i >= 0]


def _recoded(code, *, source: list[str], target: list[str], xp: ModuleType):  # noqa: ANN001, ANN202
    """Chromosome codes into ``source`` as codes into ``target`` (-1: not there); the
    chunk's names are looked up once, in ``source``."""
    return xp.asarray(pd.Index(target).get_indexer(source), dtype=xp.int64)[code]


def _check_sorted(chunk, position, *, after: int, xp: ModuleType) -> int:  # noqa: ANN001
    """The chunk's last position, once its positions are found to ascend from ``after``."""
    earlier = xp.concatenate([xp.asarray([after], dtype=xp.int64), position[:-1]])
    unsorted = position < earlier
    if bool(unsorted.any()):
        i = int(xp.argmax(unsorted))
        raise InputError(f"fragments are not sorted by chromosome and start as 10x writes them (e.g. "
                         f"{chunk['chrom'].iloc[i]}:{int(position[i]) & (MAX_POSITION - 1)} comes after a later "
                         "position or another chromosome); sort them first (sort -k1,1 -k2,2n)")
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
    obs = pd.DataFrame({
        "n_fragments": per_cell["n_fragments"],
        "nucleosome_signal": per_cell["mono_nucleosome"] / np.maximum(per_cell["nucleosome_free"], 1),
        "frac_in_features": per_cell["in_features"] / np.maximum(per_cell["n_fragments"], 1),
    }, index=pd.Index(barcodes, dtype=str))
    if "tss_center" in per_cell:
        obs["tss_enrichment"] = _tss_enrichment(per_cell["tss_center"], per_cell["tss_flank"])
    adata = AnnData(matrix, obs=obs, var=pd.DataFrame(index=pd.Index(names, dtype=object)))
    adata.uns["fragments"] = {"outside_cells": outside_cells, "features": features}
    return adata


def _tss_enrichment(center: np.ndarray, flank: np.ndarray) -> np.ndarray:
    """Mean coverage per central position over mean per flank position; a cell without
    flank coverage gets the cells' mean flank instead (as muon does)."""
    flank_mean = flank / (2 * TSS_FLANK)
    flank_mean = np.where(flank_mean == 0, flank_mean.mean(), flank_mean)
    return (center / TSS_CENTER) / flank_mean


def _interval_names(chrom: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``chrom:start-end`` for each interval (built by Arrow: hundreds of thousands of
    tiles are common)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    position = pc.binary_join_element_wise(pc.cast(pa.array(start), pa.string()), pc.cast(pa.array(end), pa.string()),
                                           "-")
    return pc.binary_join_element_wise(pa.array(chrom, type=pa.string()), position, ":").to_numpy(zero_copy_only=False)


def tfidf(adata: AnnData, *, scale_factor: float = 1e4, backend: Backend) -> None:
    """TF-IDF of counts in ``X``, as muon's defaults (and Signac's method 1 with logs):
    ``log1p(x / cell total * scale_factor) * log1p(n_cells / feature total)``.

    Raw counts are kept in ``layers["counts"]``; features without counts get zeros.
    """
    xp = array_module(backend)
    sp = cupyx_sparse() if backend == "gpu" else sparse
    matrix = sp.csr_matrix(sparse.csr_matrix(adata.X, dtype=np.float64))
    cell_totals = xp.asarray(matrix.sum(axis=1)).ravel()
    feature_totals = xp.asarray(matrix.sum(axis=0)).ravel()
    idf = xp.log1p(adata.n_obs / xp.where(feature_totals > 0, feature_totals, xp.inf))
    term = (sp.diags(1 / xp.maximum(cell_totals, 1)) @ matrix).tocsr()
    term.data = xp.log1p(term.data * scale_factor)
    adata.layers["counts"] = adata.X
    adata.X = asnumpy((term @ sp.diags(idf)).tocsr())


def lsi(adata: AnnData, *, n_comps: int = 50, max_depth_correlation: float = 0.9, backend: Backend) -> None:
    """Latent semantic indexing: truncated SVD of the TF-IDF in ``X``.

    Components are ordered by singular value and scaled to zero mean and unit variance (as
    muon does); those whose correlation with log fragment depth exceeds
    ``max_depth_correlation`` in absolute value (usually the first) are dropped from
    ``obsm["X_lsi"]``. ``uns["lsi"]`` records each component's depth correlation and
    which were kept.
    """
    xp = array_module(backend)
    matrix = cupyx_sparse().csr_matrix(adata.X) if backend == "gpu" else sparse.csr_matrix(adata.X)
    n_comps = min(n_comps, min(adata.shape) - 1)
    if backend == "gpu":
        embedding, singular, _ = cupyx_sparse().linalg.svds(matrix, k=n_comps)
    else:
        from scipy.sparse.linalg import svds

        embedding, singular, _ = svds(matrix, k=n_comps, random_state=0)
    order = xp.argsort(-singular)
    embedding = embedding[:, order]
    embedding = (embedding - embedding.mean(axis=0)) / embedding.std(axis=0)
    depth = np.log1p(np.asarray(adata.layers["counts"].sum(axis=1)).ravel() if "counts" in adata.layers
                     else np.asarray(adata.X.sum(axis=1)).ravel())
    host = asnumpy(embedding)
    correlation = np.array([np.corrcoef(host[:, k], depth)[0, 1] for k in range(host.shape[1])])
    kept = np.abs(correlation) <= max_depth_correlation
    adata.obsm["X_lsi"] = host[:, kept]
    adata.uns["lsi"] = {"depth_correlation": correlation, "kept": kept}
