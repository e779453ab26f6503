"""Neighbours, UMAP and Leiden from a stage's options: the embedding steps every modality shares."""

from __future__ import annotations

import logging
from typing import Any

from anndata import AnnData

from omicsprep.backend import Backend, array_module, cuml
from omicsprep.options import (
    EmbeddingOptions,
    LeidenOptions,
    NeighborsOptions,
    UmapOptions,
)
from omicsprep.provenance import StepTimer
from omicsprep.rna import clustering

log = logging.getLogger(__name__)

DIFFERENCES_BYTES = 1 << 28
"""The most memory the neighbours' coordinate differences take at once (rows in blocks)."""


def neighbor_graph(adata: AnnData, *, options: NeighborsOptions, use_rep: str, backend: Backend) -> None:
    """The neighbour graph on ``obsm[use_rep]``, with the ``neighbors`` options."""
    clustering.neighbors(
        adata,
        n_neighbors=options.n_neighbors,
        n_pcs=options.n_pcs,
        metric=options.metric,
        use_rep=use_rep,
        backend=backend,
    )


def embed_and_cluster(
    adata: AnnData, *, use_rep: str, options: EmbeddingOptions, seed: int, backend: Backend, timer: StepTimer
) -> None:
    """Neighbours on an embedding, UMAP and Leiden at each configured resolution."""
    with timer.step("neighbors"):
        neighbor_graph(adata, options=options.neighbors, use_rep=use_rep, backend=backend)
    umap_and_leiden(adata, umap=options.umap, leiden=options.leiden, seed=seed, backend=backend, timer=timer)


def umap_and_leiden(
    adata: AnnData, *, umap: UmapOptions, leiden: LeidenOptions, seed: int, backend: Backend, timer: StepTimer
) -> None:
    """UMAP and Leiden at each configured resolution, on the neighbour graph in ``obsp``."""
    with timer.step("umap"):
        clustering.umap(adata, min_dist=umap.min_dist, seed=seed, backend=backend)
    with timer.step("leiden"):
        clustering.cluster_graph(adata, algorithm="leiden", resolutions=leiden.resolutions, seed=seed, backend=backend)


def exact_neighbors(embedding: Any, n_neighbors: int, *, backend: Backend) -> tuple[Any, Any]:
    """Each row's ``n_neighbors`` nearest rows by Euclidean distance, by brute force (exact).

    A row is among its own neighbours (first, but among identical rows). On the GPU
    (cuML) the embedding may be a CuPy or NumPy array and the results are CuPy arrays; on the
    CPU (scikit-learn), NumPy arrays. The neighbours' distances are computed again from the
    coordinates' differences in float64 and the neighbours ordered by them: cuML's float32
    distances (|x|^2 + |y|^2 - 2xy) lose digits, which scIB's kBET turned into differences of
    0.03 from the CPU's.

    Returns
    -------
    The neighbours' indices and their distances (float32), nearest first.
    """
    xp = array_module(backend)
    if backend == "gpu":
        # On the device first: cuML returns what it is given, and a million cells' 90 neighbours'
        # indices are 720 MB to copy to the host and back.
        embedding = xp.asarray(embedding)
        model = cuml().neighbors.NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(embedding)
    else:
        from sklearn.neighbors import NearestNeighbors

        model = NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(embedding)
    indices = xp.asarray(model.kneighbors(embedding, return_distance=False))
    points = xp.asarray(embedding, dtype=xp.float64)
    distances = xp.empty(indices.shape, dtype=xp.float64)
    block = max(DIFFERENCES_BYTES // (8 * indices.shape[1] * points.shape[1]), 1)
    for start in range(0, indices.shape[0], block):
        differences = points[indices[start : start + block]] - points[start : start + block, None, :]
        distances[start : start + block] = xp.sqrt((differences * differences).sum(axis=2))
    order = xp.argsort(distances, axis=1, kind="stable")
    indices = xp.take_along_axis(indices, order, axis=1)
    return indices, xp.take_along_axis(distances, order, axis=1).astype(xp.float32)
