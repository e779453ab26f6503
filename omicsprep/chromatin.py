"""Chromatin accessibility (scATAC): fragments counted into peaks or genome tiles, QC,
TF-IDF and LSI, on either backend.

Fragments arrive in chunks (:func:`omicsprep.io.fragment_chunks`), so memory follows the
chunk size and the output matrix, not the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import ModuleType

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend, array_module, asnumpy, cudf, cupyx_sparse
from omicsprep.errors import InputError

NUCLEOSOME_FREE = 147  # fragments shorter than one nucleosome's DNA (bp)
MONO_NUCLEOSOME = 294  # up to this length: one nucleosome


FEATURE_BITS = 40  # (cell, tile) keys: cell << 40 | feature; a feature is chromosome << tile bits | tile
MAX_POSITION = 1 << 32  # positions are keyed chromosome << 32 + bp
PER_CELL = ("n_fragments", "nucleosome_free", "mono_nucleosome", "in_features", "tss_center", "tss_flank")
# TSS enrichment as ENCODE defines it and muon computes it: fragment coverage (weighted by
# reads) summed over windows of +-1 kb around every TSS; the mean over the central 1,001
# positions against the mean over the 100 positions at each end.
TSS_EXTEND = 1000
TSS_FLANK = 100
TSS_CENTER = 1001


class _PairCounts:
    """(cell, feature) keys and their counts, summed over chunks on the backend's device;
    merged whenever the unmerged part outgrows the merged one, so memory follows the
    output, not the input."""

    def __init__(self, xp: ModuleType) -> None:
        self.xp = xp
        self.keys, self.counts = xp.zeros(0, xp.int64), xp.zeros(0, xp.int64)
        self.pending: list = []
        self.pending_size = 0

    def add(self, keys, counts) -> None:  # noqa: ANN001
        self.pending.append((keys, counts))
        self.pending_size += keys.size
        if self.pending_size > max(self.keys.size, 1 << 20):
            self.merge()

    def merge(self) -> None:
        xp = self.xp
        keys = xp.concatenate([self.keys, *(k for k, _ in self.pending)])
        counts = xp.concatenate([self.counts, *(c for _, c in self.pending)])
        self.keys, where = xp.unique(keys, return_inverse=True)
        self.counts = _bincount(where.ravel(), weights=counts, minlength=self.keys.size, xp=xp)
        self.pending, self.pending_size = [], 0


def count_fragments(
    chunks: Iterable,
    *,
    barcodes: pd.Index,
    peaks: pd.DataFrame | None = None,
    tile_width: int = 5000,
    chrom_sizes: Mapping[str, int] | None = None,
    tss: pd.DataFrame | None = None,
    backend: Backend = "cpu",
) -> AnnData:
    """Cells x features counts of fragments: one per feature a fragment overlaps.

    Parameters
    ----------
    chunks
        Fragments (``chrom``, ``start``, ``end``, ``barcode``, and ``count`` (reads) for
        ``tss``; 0-based, end exclusive):
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
    backend
        ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy): where each chunk's overlaps and counts are
        computed; the (cell, feature) counts stay on that device until the end.

    Returns
    -------
    Counts (CSR) with features named ``chrom:start-end``, sorted by chromosome name and
    start; ``obs`` holds ``n_fragments``, ``nucleosome_signal`` (mono-nucleosomal over
    nucleosome-free fragments), ``frac_in_features`` (with peaks: the fraction of
    fragments in peaks, FRiP) and, with ``tss``, ``tss_enrichment``.

    Raises
    ------
    InputError
        Repeated barcodes; fragments whose end is not after their start, with a negative
        start or beyond 2**32 bp; more chromosomes than tile keys hold; with
        ``chrom_sizes``, fragments on an unknown chromosome or past its end; overlapping
        peaks.
    """
    xp = array_module(backend)
    index_type = cudf().Index if backend == "gpu" else pd.Index
    if not barcodes.is_unique:
        raise InputError(f"cell barcodes repeat, e.g. {barcodes[barcodes.duplicated()][0]!r}")
    if len(barcodes) >= 1 << (63 - FEATURE_BITS):
        raise InputError(f"{len(barcodes):,} cells: more than this count can key")
    tile_bits = (MAX_POSITION // tile_width).bit_length()
    cells = index_type(np.asarray(barcodes, dtype=str))
    per_cell = xp.zeros((len(PER_CELL), len(barcodes)), dtype=xp.int64)
    pairs, outside_cells = _PairCounts(xp), 0
    chromosomes: list[str] = []
    if peaks is not None:
        peaks = _checked_peaks(peaks)
        chromosomes, (peak_starts, peak_ends) = _keyed(peaks["chrom"], peaks["start"], peaks["end"], xp=xp)
    if tss is not None:
        tss = tss.sort_values(["chrom", "position"], ignore_index=True)
        tss_chromosomes, (windows,) = _keyed(tss["chrom"], tss["position"] - TSS_EXTEND, xp=xp)  # may start below 0
    for chunk in chunks:
        start, end = xp.asarray(chunk["start"].values, dtype=xp.int64), xp.asarray(chunk["end"].values, dtype=xp.int64)
        _check_coordinates(chunk, start=start, end=end, xp=xp)
        if chrom_sizes is not None:
            _check_genome(chunk, end=end, chrom_sizes=chrom_sizes, index_type=index_type, xp=xp)
        cell = xp.asarray(cells.get_indexer(chunk["barcode"]), dtype=xp.int64)
        if peaks is None:  # tiles: every chromosome seen so far gets a number
            seen = _host(chunk["chrom"].unique())
            known = set(chromosomes)
            chromosomes += [c for c in seen if c not in known]
            if len(chromosomes) >= 1 << (FEATURE_BITS - tile_bits):
                raise InputError(f"fragments on {len(chromosomes):,} chromosomes or contigs: at most "
                                 f"{(1 << (FEATURE_BITS - tile_bits)) - 1:,} with {tile_width} bp tiles; use larger "
                                 "tiles or peaks")
        chrom = xp.asarray(index_type(chromosomes).get_indexer(chunk["chrom"]), dtype=xp.int64)
        inside = cell >= 0
        outside_cells += int((~inside).sum())
        cell, chrom, start, end = cell[inside], chrom[inside], start[inside], end[inside]
        length = end - start
        for row, selected in enumerate([cell, cell[length < NUCLEOSOME_FREE],
                                        cell[(length >= NUCLEOSOME_FREE) & (length <= MONO_NUCLEOSOME)]]):
            per_cell[row] += _bincount(selected, minlength=len(barcodes), xp=xp)
        if peaks is not None:
            fragment, feature = _overlapped_peaks(chrom, start, end, peak_starts, peak_ends, xp=xp)
            key = cell[fragment] * len(peaks) + feature
        else:
            fragment, tile = _overlapped_tiles(start, end, tile_width, xp=xp)
            key = (cell[fragment] << FEATURE_BITS) | (chrom[fragment] << tile_bits) | tile
        in_feature = xp.zeros(cell.size, dtype=bool)
        in_feature[fragment] = True
        per_cell[3] += _bincount(cell[in_feature], minlength=len(barcodes), xp=xp)
        if tss is not None:
            reads = xp.asarray(chunk["count"].values, dtype=xp.int64)[inside]
            code = xp.asarray(index_type(tss_chromosomes).get_indexer(chunk["chrom"]), dtype=xp.int64)[inside]
            fragment, center, flank = _tss_coverage(code, start, end, windows, xp=xp)
            per_cell[4] += _bincount(cell[fragment], weights=center * reads[fragment], minlength=len(barcodes), xp=xp)
            per_cell[5] += _bincount(cell[fragment], weights=flank * reads[fragment], minlength=len(barcodes), xp=xp)
        pairs.add(*xp.unique(key, return_counts=True))
    pairs.merge()
    if tss is None:
        per_cell = per_cell[: len(PER_CELL) - 2]
    return _to_anndata(pairs, dict(zip(PER_CELL, asnumpy(per_cell))), barcodes=barcodes, peaks=peaks,
                       chromosomes=chromosomes, tile_width=tile_width, tile_bits=tile_bits,
                       outside_cells=outside_cells, backend=backend)


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


def _to_anndata(
    pairs: _PairCounts,
    per_cell: dict[str, np.ndarray],
    *,
    barcodes: pd.Index,
    peaks: pd.DataFrame | None,
    chromosomes: list[str],
    tile_width: int,
    tile_bits: int,
    outside_cells: int,
    backend: Backend,
) -> AnnData:
    """The counts as CSR, assembled on the device from the sorted keys, and the features'
    names and the QC metrics on the host."""
    xp = array_module(backend)
    sp = cupyx_sparse() if backend == "gpu" else sparse
    if peaks is not None:
        names = _interval_names(peaks["chrom"].to_numpy(str), peaks["start"].to_numpy(), peaks["end"].to_numpy())
        row, column = pairs.keys // len(peaks), pairs.keys % len(peaks)
    else:
        row, feature = pairs.keys >> FEATURE_BITS, pairs.keys & ((1 << FEATURE_BITS) - 1)
        features, column = xp.unique(feature, return_inverse=True)
        features = asnumpy(features)
        chrom, tile = features >> tile_bits, (features & ((1 << tile_bits) - 1)) * tile_width
        chromosome_names = np.array(chromosomes, dtype=str)
        order = np.lexsort((tile, np.argsort(np.argsort(chromosome_names))[chrom]))  # by chromosome name, then start
        column = xp.asarray(np.argsort(order))[column.ravel()]
        names = _interval_names(chromosome_names[chrom[order]], tile[order], tile[order] + tile_width)
    if pairs.keys.size >= 1 << 31:  # CSR indices are int32 (the only kind cupyx has)
        raise InputError(f"{pairs.keys.size:,} non-zero (cell, feature) counts: more than a CSR matrix holds here")
    indptr = xp.searchsorted(row, xp.arange(len(barcodes) + 1), side="left")  # keys are sorted by cell
    counts = sp.csr_matrix((pairs.counts.astype(xp.float32), column.astype(xp.int32), indptr.astype(xp.int32)),
                           shape=(len(barcodes), len(names)))
    counts.sort_indices()
    obs = pd.DataFrame({
        "n_fragments": per_cell["n_fragments"],
        "nucleosome_signal": per_cell["mono_nucleosome"] / np.maximum(per_cell["nucleosome_free"], 1),
        "frac_in_features": per_cell["in_features"] / np.maximum(per_cell["n_fragments"], 1),
    }, index=pd.Index(barcodes, dtype=str))
    if "tss_center" in per_cell:
        obs["tss_enrichment"] = _tss_enrichment(per_cell["tss_center"], per_cell["tss_flank"])
    adata = AnnData(asnumpy(counts), obs=obs, var=pd.DataFrame(index=pd.Index(names.astype(str), dtype=str)))
    adata.uns["fragments"] = {"outside_cells": outside_cells,
                              "features": "peaks" if peaks is not None else f"tiles of {tile_width} bp"}
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
    return pc.binary_join_element_wise(pa.array(chrom), position, ":").to_numpy(zero_copy_only=False)


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
