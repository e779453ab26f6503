"""Chromatin accessibility (scATAC): fragments counted into peaks or genome tiles, QC,
TF-IDF and LSI, on either backend.

Fragments arrive in chunks (:func:`omicsprep.io.fragment_chunks`), so memory follows the
chunk size and the output matrix, not the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend, array_module, asnumpy, cupyx_sparse
from omicsprep.errors import InputError

NUCLEOSOME_FREE = 147  # fragments shorter than one nucleosome's DNA (bp)
MONO_NUCLEOSOME = 294  # up to this length: one nucleosome


@dataclass
class _Tally:
    """What the chunks add up to: (cell, feature) counts and per-cell fragment counts."""

    n_cells: int
    pairs: list[pd.DataFrame] = field(default_factory=list)
    chromosomes: dict[str, int] = field(default_factory=dict)
    per_cell: dict[str, np.ndarray] = field(default_factory=dict)
    outside_cells: int = 0

    def add(self, name: str, cells: np.ndarray) -> None:
        counts = np.bincount(cells, minlength=self.n_cells)
        self.per_cell[name] = self.per_cell.get(name, 0) + counts


def count_fragments(
    chunks: Iterable[pd.DataFrame],
    *,
    barcodes: pd.Index,
    peaks: pd.DataFrame | None = None,
    tile_width: int = 5000,
) -> AnnData:
    """Cells x features counts of fragments: one per feature a fragment overlaps.

    Parameters
    ----------
    chunks
        Fragments (``chrom``, ``start``, ``end``, ``barcode``; 0-based, end exclusive).
    barcodes
        The cells; fragments of other barcodes are only counted (``uns``).
    peaks
        ``chrom``, ``start``, ``end`` of non-overlapping peaks; genome tiles of
        ``tile_width`` bp when ``None``.
    tile_width
        Tile size in bp.

    Returns
    -------
    Counts (CSR) with features named ``chrom:start-end``, sorted by chromosome name and
    start; ``obs`` holds ``n_fragments``,
    ``nucleosome_signal`` (mono-nucleosomal over nucleosome-free fragments) and
    ``frac_in_features`` (with peaks: the fraction of fragments in peaks, FRiP).

    Raises
    ------
    InputError
        Fragments whose end is not after their start, or with a negative start;
        overlapping peaks.
    """
    tally = _Tally(n_cells=len(barcodes))
    if peaks is not None:
        peaks = peaks.sort_values(["chrom", "start"], ignore_index=True)
        same_chrom = (peaks["chrom"].to_numpy()[1:] == peaks["chrom"].to_numpy()[:-1])
        overlapping = same_chrom & (peaks["start"].to_numpy()[1:] < peaks["end"].to_numpy()[:-1])
        if overlapping.any():
            first = peaks.iloc[int(np.flatnonzero(overlapping)[0])]
            raise InputError(f"{int(overlapping.sum())} peaks overlap the previous one (e.g. after "
                             f"{first['chrom']}:{first['start']}-{first['end']}); merge them first")
    for chunk in chunks:
        bad = (chunk["start"] < 0) | (chunk["end"] <= chunk["start"])
        if bad.any():
            row = chunk[bad].iloc[0]
            raise InputError(f"{int(bad.sum())} fragments with bad coordinates, e.g. "
                             f"{row['chrom']}:{row['start']}-{row['end']}")
        cell = barcodes.get_indexer(chunk["barcode"])
        tally.outside_cells += int((cell < 0).sum())
        chunk, cell = chunk[cell >= 0].reset_index(drop=True), cell[cell >= 0]
        length = (chunk["end"] - chunk["start"]).to_numpy()
        tally.add("n_fragments", cell)
        tally.add("nucleosome_free", cell[length < NUCLEOSOME_FREE])
        tally.add("mono_nucleosome", cell[(length >= NUCLEOSOME_FREE) & (length <= MONO_NUCLEOSOME)])
        if peaks is not None:
            fragment, feature = _overlapped_peaks(chunk, peaks)
        else:
            fragment, feature = _overlapped_tiles(chunk, tile_width, tally.chromosomes)
        tally.add("in_features", cell[np.unique(fragment)])
        pairs = pd.DataFrame({"cell": cell[fragment], "feature": feature})
        tally.pairs.append(pairs.groupby(["cell", "feature"]).size().rename("count").reset_index())
    return _to_anndata(tally, barcodes=barcodes, peaks=peaks, tile_width=tile_width)


def _overlapped_peaks(chunk: pd.DataFrame, peaks: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(fragment, peak) pairs that overlap; peaks sorted by chromosome and start."""
    fragments, features = [], []
    for chrom, rows in chunk.groupby("chrom", sort=False).indices.items():
        on_chrom = np.flatnonzero((peaks["chrom"] == chrom).to_numpy())
        if on_chrom.size == 0:
            continue
        starts, ends = peaks["start"].to_numpy()[on_chrom], peaks["end"].to_numpy()[on_chrom]
        first = np.searchsorted(ends, chunk["start"].to_numpy()[rows], side="right")
        last = np.searchsorted(starts, chunk["end"].to_numpy()[rows], side="left")
        n = np.maximum(last - first, 0)
        fragments.append(np.repeat(rows, n))
        features.append(on_chrom[np.repeat(first, n) + _ranks_within(n)])
    if not fragments:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(fragments), np.concatenate(features)


def _overlapped_tiles(
    chunk: pd.DataFrame, tile_width: int, chromosomes: dict[str, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(fragment, tile key) pairs; a key is the chromosome's number << 32 | tile."""
    for chrom in chunk["chrom"].unique():
        chromosomes.setdefault(chrom, len(chromosomes))
    first = chunk["start"].to_numpy() // tile_width
    n = (chunk["end"].to_numpy() - 1) // tile_width - first + 1
    fragment = np.repeat(np.arange(len(chunk)), n)
    tile = np.repeat(first, n) + _ranks_within(n)
    code = chunk["chrom"].map(chromosomes).to_numpy(np.int64)[fragment]
    return fragment, (code << 32) | tile


def _ranks_within(n: np.ndarray) -> np.ndarray:
    """0, 1, ..., n[i] - 1 for each i, concatenated."""
    ends = np.cumsum(n)
    return np.arange(ends[-1] if n.size else 0) - np.repeat(ends - n, n)


def _to_anndata(tally: _Tally, *, barcodes: pd.Index, peaks: pd.DataFrame | None, tile_width: int) -> AnnData:
    pairs = pd.concat(tally.pairs, ignore_index=True) if tally.pairs else pd.DataFrame(
        {"cell": [], "feature": [], "count": []}, dtype=np.int64)
    pairs = pairs.groupby(["cell", "feature"], sort=False)["count"].sum().reset_index()
    if peaks is not None:
        names = peaks["chrom"] + ":" + peaks["start"].astype(str) + "-" + peaks["end"].astype(str)
        column = pairs["feature"].to_numpy()
    else:
        keys = np.sort(pairs["feature"].unique())
        chrom_names = np.array(list(tally.chromosomes), dtype=object)[keys >> 32]
        tile = (keys & 0xFFFFFFFF) * tile_width
        names = pd.Series(chrom_names + ":" + tile.astype(str) + "-" + (tile + tile_width).astype(str))
        column = np.searchsorted(keys, pairs["feature"].to_numpy())
    counts = sparse.csr_matrix((pairs["count"].to_numpy(np.float32), (pairs["cell"].to_numpy(), column)),
                               shape=(len(barcodes), len(names)))
    per_cell = {name: tally.per_cell.get(name, np.zeros(len(barcodes))) for name in
                ("n_fragments", "nucleosome_free", "mono_nucleosome", "in_features")}
    obs = pd.DataFrame({
        "n_fragments": per_cell["n_fragments"],
        "nucleosome_signal": per_cell["mono_nucleosome"] / np.maximum(per_cell["nucleosome_free"], 1),
        "frac_in_features": per_cell["in_features"] / np.maximum(per_cell["n_fragments"], 1),
    }, index=pd.Index(barcodes, dtype=str))
    adata = AnnData(counts, obs=obs, var=pd.DataFrame(index=pd.Index(names.to_numpy(), dtype=str)))
    adata.uns["fragments"] = {"outside_cells": tally.outside_cells,
                              "features": "peaks" if peaks is not None else f"tiles of {tile_width} bp"}
    return adata


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
