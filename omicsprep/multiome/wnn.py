"""Modalities of one sample joined by cell barcode into a MuData, and their weighted nearest neighbours (WNN)."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import BLOCK_BYTES, Backend, array_module, asnumpy, cupyx_sparse
from omicsprep.errors import InputError
from omicsprep.jit_cache import cache_umap_kernels
from omicsprep.rna.embedding import exact_neighbors

if TYPE_CHECKING:
    from mudata import MuData


def join_modalities(modalities: dict[str, AnnData], *, min_overlap: float) -> tuple[MuData, dict[str, float]]:
    """Keep the cells every modality has, in the first modality's order, as one MuData.

    Parameters
    ----------
    modalities
        Name (``rna``, ``protein``, ``atac``) to cells x features; at least two.
    min_overlap
        Smallest accepted share of each modality's cells found in all the others.

    Returns
    -------
    The MuData, and each modality's share of cells kept (also in ``uns["overlap"]``).

    Raises
    ------
    InputError
        A modality shares less than ``min_overlap`` of its cells with the others (the
        message gives every modality's share).
    """
    import mudata

    names = list(modalities)
    common = modalities[names[0]].obs_names
    for name in names[1:]:
        common = common.intersection(modalities[name].obs_names, sort=False)
    overlap = {name: round(len(common) / max(adata.n_obs, 1), 4) for name, adata in modalities.items()}
    if min(overlap.values()) < min_overlap:
        shares = ", ".join(f"{name} {share:.1%} of {modalities[name].n_obs}" for name, share in overlap.items())
        raise InputError(
            f"modalities share {len(common)} cell barcodes ({shares}); at least {min_overlap:.0%} of each is required"
        )
    joined = mudata.MuData({name: adata[common].copy() for name, adata in modalities.items()})
    joined.uns["overlap"] = overlap
    return joined, overlap


def weighted_nearest_neighbors(
    mdata: MuData,
    *,
    representations: Mapping[str, str],
    n_dims: Mapping[str, int] | None = None,
    n_neighbors: int = 20,
    n_bandwidth_neighbors: int = 20,
    n_candidates: int = 200,
    eps: float = 1e-4,
    backend: Backend,
) -> None:
    """Weighted nearest neighbours (WNN; Hao et al. 2021) over the modalities' embeddings.

    The method of Seurat's ``FindMultiModalNeighbors`` as muon implements it, with exact
    neighbour searches (scikit-learn or cuML, brute force) where muon uses NN-descent:

    1. Each embedding's rows are scaled to unit length; each cell's ``n_neighbors - 1``
       nearest other cells per modality are found, and its ``n_candidates`` nearest as
       candidates.
    2. A cell's kernel width in a modality is its mean distance to the
       ``n_bandwidth_neighbors`` cells whose neighbour sets overlap its own least (and
       not at all excluded), the farther first among equals.
    3. A modality's affinity for a cell compares how well the cell is predicted by the
       mean of its neighbours in that modality against its neighbours in the others; the
       cell's modality weights are the softmax of these ratios.
    4. Every candidate's similarity is the weighted sum over modalities of
       ``exp(-distance / width)``; the ``n_neighbors - 1`` most similar become the
       cell's joint neighbours (distance ``sqrt((1 - similarity) / 2)``).

    Parameters
    ----------
    mdata
        Cells shared by all modalities (:func:`join_modalities`).
    representations
        Modality to the ``obsm`` key of its embedding (e.g. ``{"rna": "X_pca",
        "atac": "X_lsi"}``); at least two.
    n_dims
        Leading dimensions used per modality (all when absent).
    n_neighbors
        Joint neighbours per cell, the cell included (scanpy's convention); also the
        per-modality neighbourhood size of steps 2 and 3.
    n_bandwidth_neighbors
        Cells averaged for the kernel width.
    n_candidates
        Nearest cells per modality considered as joint neighbours.
    eps
        Keeps the affinity ratios finite.
    backend
        ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    InputError
        Fewer than two modalities or three cells.

    Returns
    -------
    Nothing; ``mdata`` gains ``obs["<modality>:mod_weight"]``, ``obsp["distances"]`` and
    ``obsp["connectivities"]`` (UMAP's fuzzy union, as scanpy's neighbours),
    ``obsm["X_wnn_input"]`` (the scaled embeddings side by side, for UMAP's
    initialisation) and ``uns["neighbors"]``.
    """
    if len(representations) < 2 or mdata.n_obs < 3:
        raise InputError(
            f"weighted nearest neighbours need two modalities or more and 3 cells or more "
            f"(got {list(representations)}, {mdata.n_obs} cells)"
        )
    xp = array_module(backend)
    names = list(representations)
    n_dims = n_dims or {}
    embeddings = {
        name: _unit_rows(xp.asarray(mdata.mod[name].obsm[key][:, : n_dims.get(name)], dtype=xp.float32), xp=xp)
        for name, key in representations.items()
    }
    n_cells = mdata.n_obs
    k = min(n_neighbors - 1, n_cells - 1)
    nearest = {
        name: _nearest(embedding, min(max(n_candidates, k), n_cells - 1), backend=backend)
        for name, embedding in embeddings.items()
    }
    widths, ratios = {}, []
    for name in names:
        embedding, (_, distances) = embeddings[name], nearest[name]
        closest = distances[:, 0]
        # A cell whose width is 0 (identical neighbours) keeps a finite kernel.
        widths[name] = xp.maximum(
            _kernel_width(embedding, nearest[name][0][:, :k], n_bandwidth_neighbors, xp=xp), 1e-12
        )
        affinity = {
            other: _affinity(embedding, nearest[other][0][:, :k], closest, widths[name], xp=xp) for other in names
        }
        best_other = xp.max(xp.stack([affinity[other] for other in names if other != name]), axis=0)
        ratios.append(affinity[name] / (best_other + eps))
    ratios = xp.stack(ratios, axis=1)
    weights = xp.exp(ratios - ratios.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    indices, distances = _joint_neighbors(embeddings, nearest, weights, widths, k=k, xp=xp)
    for i, name in enumerate(names):
        mdata.obs[f"{name}:mod_weight"] = asnumpy(weights[:, i])
    _store_graph(mdata, asnumpy(indices), asnumpy(distances), n_neighbors=k + 1)
    mdata.obsm["X_wnn_input"] = asnumpy(xp.concatenate([embeddings[name] for name in names], axis=1))
    mdata.uns["neighbors"]["params"]["use_rep"] = "X_wnn_input"


def _unit_rows(values, *, xp: ModuleType):
    norms = xp.linalg.norm(values, axis=1, keepdims=True)
    return values / xp.where(norms > 0, norms, 1)


def _nearest(embedding, k: int, *, backend: Backend):
    """Each cell's ``k`` nearest other cells, exact: (indices, Euclidean distances), nearest first."""
    indices, distances = exact_neighbors(embedding, k + 1, backend=backend)
    xp = array_module(backend)
    # Drop the cell itself (first, except among identical cells), else the farthest.
    self_at = xp.argmax(indices == xp.arange(indices.shape[0])[:, None], axis=1)
    found = indices[xp.arange(indices.shape[0]), self_at] == xp.arange(indices.shape[0])
    drop = xp.where(found, self_at, k)
    keep = xp.arange(k + 1)[None, :] != drop[:, None]
    return indices[keep].reshape(-1, k), distances[keep].reshape(-1, k)


def _row_blocks(n_rows: int, row_bytes: int) -> list[slice]:
    step = max(1, BLOCK_BYTES // max(row_bytes, 1))
    return [slice(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]


def _distances_to(embedding, cells, others, *, xp: ModuleType):
    """Euclidean distances from cell ``cells[i]`` to each of ``others[i, :]``, a block of rows at a time.

    The rows are of unit length: the distance is ``sqrt(2 - 2 cos)``.
    """
    out = xp.empty(others.shape, dtype=xp.float32)
    for rows in _row_blocks(others.shape[0], 4 * others.shape[1] * embedding.shape[1]):
        cosine = xp.einsum("rcd,rd->rc", embedding[others[rows]], embedding[cells[rows]])
        out[rows] = xp.sqrt(xp.maximum(2 - 2 * cosine, 0))
    return out


def _kernel_width(embedding, neighbors, n_bandwidth: int, *, xp: ModuleType):
    """Mean distance to the ``n_bandwidth`` cells whose neighbour sets overlap a cell's own least.

    The overlap is the Jaccard index, above zero; among equals the farther cell comes first.
    """
    sp = cupyx_sparse() if xp.__name__ == "cupy" else sparse
    n_cells, k = neighbors.shape
    membership = sp.csr_matrix(
        (
            xp.ones(neighbors.size, dtype=xp.float32),
            neighbors.ravel().astype(xp.int32),
            xp.arange(0, neighbors.size + 1, k, dtype=xp.int32),
        ),
        shape=(n_cells, n_cells),
    )
    shared = (membership @ membership.T).tocoo()
    other = shared.row != shared.col
    row, col, overlap = shared.row[other], shared.col[other], shared.data[other]
    jaccard = overlap / (2 * k - overlap)
    distance = _distances_to(embedding, row, col[:, None], xp=xp).ravel()
    order = xp.lexsort(xp.stack([-distance.astype(xp.float64), jaccard.astype(xp.float64), row.astype(xp.float64)]))
    row, distance = row[order], distance[order]
    rank = xp.arange(row.size) - xp.searchsorted(row, row, side="left")
    chosen = rank < n_bandwidth
    total = xp.bincount(row[chosen], weights=distance[chosen], minlength=n_cells)
    return (total / xp.maximum(xp.bincount(row[chosen], minlength=n_cells), 1)).astype(xp.float32)


def _affinity(embedding, neighbors, closest, width, *, xp: ModuleType):
    """How well each cell is predicted by the mean of its ``neighbors`` in this modality's embedding.

    The ``neighbors`` are of some modality; the affinity is
    ``exp(-max(d - d_nearest, 0) / (width - d_nearest))``.
    """
    predicted = xp.empty_like(embedding)
    for rows in _row_blocks(neighbors.shape[0], 4 * neighbors.shape[1] * embedding.shape[1]):
        predicted[rows] = embedding[neighbors[rows]].mean(axis=1)
    distance = xp.linalg.norm(embedding - predicted, axis=1)
    return xp.exp(-xp.maximum(distance - closest, 0) / xp.maximum(width - closest, 1e-12))


def _joint_neighbors(embeddings, nearest, weights, widths, *, k: int, xp: ModuleType):
    """The ``k`` candidates of highest weighted similarity per cell: (indices, distances)."""
    candidates = xp.sort(xp.concatenate([nearest[name][0] for name in embeddings], axis=1), axis=1)
    repeated = xp.zeros(candidates.shape, dtype=bool)
    repeated[:, 1:] = candidates[:, 1:] == candidates[:, :-1]
    cells = xp.arange(candidates.shape[0])
    similarity = xp.zeros(candidates.shape, dtype=xp.float32)
    for i, (name, embedding) in enumerate(embeddings.items()):
        distance = _distances_to(embedding, cells, candidates, xp=xp)
        similarity += weights[:, i, None] * xp.exp(-distance / widths[name][:, None])
    joint = xp.sqrt(xp.maximum(0.5 * (1 - similarity), 0))
    joint[repeated] = xp.inf
    best = xp.argsort(joint, axis=1)[:, :k]
    return xp.take_along_axis(candidates, best, axis=1), xp.take_along_axis(joint, best, axis=1)


def _store_graph(mdata: MuData, indices: np.ndarray, distances: np.ndarray, *, n_neighbors: int) -> None:
    """Joint neighbours as scanpy stores them: distances, and UMAP connectivities."""
    cache_umap_kernels()  # before umap-learn's import, which it caches
    from umap.umap_ import fuzzy_simplicial_set

    n_cells = indices.shape[0]
    with_self = np.concatenate([np.arange(n_cells)[:, None], indices], axis=1)
    with_zero = np.concatenate([np.zeros((n_cells, 1), np.float32), distances], axis=1)
    connectivities, _, _ = fuzzy_simplicial_set(
        sparse.coo_matrix((n_cells, 1)), n_neighbors, None, None, knn_indices=with_self, knn_dists=with_zero
    )
    mdata.obsp["distances"] = sparse.csr_matrix(
        (distances.ravel(), indices.ravel(), np.arange(0, indices.size + 1, indices.shape[1])), shape=(n_cells, n_cells)
    )
    mdata.obsp["connectivities"] = connectivities.tocsr()
    mdata.uns["neighbors"] = {
        "connectivities_key": "connectivities",
        "distances_key": "distances",
        "params": {"n_neighbors": n_neighbors, "method": "umap", "metric": "euclidean"},
    }
