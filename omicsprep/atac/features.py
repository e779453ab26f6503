"""The features fragments are counted into (peaks, genome tiles) and TSS windows, and their overlaps.

Positions are keyed ``chromosome << 32 + bp`` (:func:`position_keys`), so one sorted search
over all chromosomes finds a fragment's features; fragments and features are sorted alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

import numpy as np
import pandas as pd

from omicsprep.atac.columns import FEATURE_BITS, FeatureColumns, position_in
from omicsprep.backend import asnumpy
from omicsprep.errors import InputError

MAX_POSITION = 1 << 32  # positions are keyed chromosome << 32 + bp
# TSS enrichment as ENCODE defines it and muon computes it: fragment coverage (weighted by
# reads) summed over windows of +-1 kb around every TSS; the mean over the central 1,001
# positions against the mean over the 100 positions at each end.
TSS_EXTEND = 1000
TSS_FLANK = 100
TSS_CENTER = 1001


class Peaks:
    """Peaks numbered as the sorted fragments reach their chromosome.

    The numbers thus ascend with the fragments; peaks on chromosomes without fragments come last.
    """

    def __init__(self, peaks: pd.DataFrame, xp: ModuleType) -> None:
        peaks = _checked_peaks(peaks)
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
        peak = position_in(self.ends, position_keys(code, start), side="right", xp=self.xp)
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


class Tiles:
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


class TssWindows:
    """Windows of +-``TSS_EXTEND`` bp around transcription start sites, in sorted order.

    Keyed by their first bp (:func:`position_keys`; they may start below 0).
    """

    def __init__(self, tss: pd.DataFrame, xp: ModuleType) -> None:
        tss = tss.sort_values(["chrom", "position"], ignore_index=True)
        self.chromosomes, (self.starts,) = _keyed(tss["chrom"], tss["position"] - TSS_EXTEND, xp=xp)
        self.xp = xp

    def coverage(self, chrom, start, end, *, chromosomes: list[str]):
        """:func:`_tss_coverage` of fragments whose ``chrom`` codes into ``chromosomes``."""
        tss_chrom = _recoded(chrom, source=chromosomes, target=self.chromosomes, xp=self.xp)
        return _tss_coverage(tss_chrom, start, end, self.starts, xp=self.xp)


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


def position_keys(code, position):
    """Positions keyed by chromosome, ``code << 32 + bp``.

    Sorted by chromosome, then position, so one sorted search over all chromosomes stays
    within each.
    """
    return (code << 32) + position


def _keyed(chrom: pd.Series, *positions: pd.Series, xp: ModuleType):
    """The chromosomes in order of appearance, and each positions column keyed by them.

    The keys (:func:`position_keys`) are on the device.
    """
    chromosomes = list(dict.fromkeys(chrom))
    code = pd.Index(chromosomes).get_indexer(chrom).astype(np.int64)
    return chromosomes, [xp.asarray(position_keys(code, p.to_numpy(np.int64))) for p in positions]


def _in_sorted_range(code, first, last, *, xp: ModuleType):
    """(fragment, i) for first <= i < last, where the fragment's chromosome is known."""
    return _expanded(first, xp.where(code >= 0, xp.maximum(last - first, 0), 0), xp=xp)


def _overlapped_peaks(chrom, start, end, peak_starts, peak_ends, *, xp: ModuleType):
    """(fragment, peak) pairs that overlap; peaks do not overlap, so their ends are sorted too."""
    first = xp.searchsorted(peak_ends, position_keys(chrom, start), side="right")
    last = xp.searchsorted(peak_starts, position_keys(chrom, end), side="left")
    return _in_sorted_range(chrom, first, last, xp=xp)


def _tss_coverage(code, start, end, windows, *, xp: ModuleType):
    """Each (fragment, TSS window) overlap.

    The fragment, and how many of the window's central and flank positions it covers.
    Windows (keyed by their first bp) are sorted and equally long, so a fragment's windows
    are one sorted range. As muon fetches them, a window takes fragments that start before
    TSS + 1 kb.
    """
    width = 2 * TSS_EXTEND
    key_start, key_end = position_keys(code, start), position_keys(code, end)
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


def _recoded(code, *, source: list[str], target: list[str], xp: ModuleType):
    """Chromosome codes into ``source`` as codes into ``target`` (-1: not there).

    The chunk's names are looked up once, in ``source``.
    """
    return xp.asarray(pd.Index(target).get_indexer(source), dtype=xp.int64)[code]


def _interval_names(chrom: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``chrom:start-end`` for each interval (built by Arrow: hundreds of thousands of tiles are common)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    position = pc.binary_join_element_wise(
        pc.cast(pa.array(start), pa.string()), pc.cast(pa.array(end), pa.string()), "-"
    )
    return pc.binary_join_element_wise(pa.array(chrom, type=pa.string()), position, ":").to_numpy(zero_copy_only=False)
