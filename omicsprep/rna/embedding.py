"""Neighbours, UMAP and Leiden from a stage's options: the embedding steps every modality shares."""

from __future__ import annotations

import logging
from types import ModuleType
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
from omicsprep.rna.distances import squared_distances_to

log = logging.getLogger(__name__)


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
    """Each row's ``n_neighbors`` nearest rows by Euclidean distance, exactly.

    A row is among its own neighbours (first, but among identical rows). On the CPU a brute
    force search (scikit-learn) finds them; on the GPU each row's candidates are the rows within
    a bound of its ``n_neighbors``-th distance (:mod:`omicsprep.rna.neighbors_cuda`; cuML's
    brute force took 11-13 s for a million rows' 90 nearest on an H100). On both, the distances
    are computed again from the coordinates' differences in float64 and the neighbours ordered
    by them, ties by index: float32's |x|^2 + |y|^2 - 2xy loses digits, which scIB's kBET turned
    into differences of 0.03 between the backends. The embedding may be a CuPy or NumPy array on
    the GPU.

    Returns
    -------
    The neighbours' indices and their distances (float32), nearest first: CuPy arrays on the
    GPU, NumPy arrays on the CPU.
    """
    indices, distances, _ = exact_neighbors_and_label_sums(embedding, n_neighbors, labels=None, backend=backend)
    return indices, distances


def exact_neighbors_and_label_sums(
    embedding: Any, n_neighbors: int, *, labels: Any, backend: Backend
) -> tuple[Any, Any, Any]:
    """:func:`exact_neighbors`, and on the GPU each row's summed distance to each label's rows from the same pass.

    The GPU's search passes over all pairs of rows (:mod:`omicsprep.rna.pairs_cuda`); the
    silhouettes' sums per label ride along. ``labels``: each row's label code, ``0 ..``; None:
    no sums wanted.

    Returns
    -------
    The indices and distances of :func:`exact_neighbors`, and rows x labels of summed
    distances (float64, on the device), or None: on the CPU, without ``labels``, or for an
    embedding wider than the pass takes.
    """
    xp, sums = array_module(backend), None
    if backend == "gpu":
        from omicsprep.rna import neighbors_cuda

        # On the device first: a million cells' 90 neighbours' indices are 720 MB to copy.
        embedding = xp.asarray(embedding)
        codes, n_labels = None, 1
        if labels is not None:
            codes = xp.asarray(labels, dtype=xp.int32)
            n_labels = int(codes.max()) + 1
        candidates, sums = neighbors_cuda.neighbour_candidates(
            embedding, n_neighbors, xp=xp, cuml=cuml(), codes=codes, n_labels=n_labels
        )
        sums = None if labels is None else sums
    else:
        from sklearn.neighbors import NearestNeighbors

        candidates = (
            NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute")
            .fit(embedding)
            .kneighbors(embedding, return_distance=False)
        )
    return *nearest_by_exact_distances(embedding, candidates, n_neighbors, xp=xp), sums


def nearest_by_exact_distances(embedding: Any, candidates: Any, n_neighbors: int, *, xp: ModuleType) -> tuple[Any, Any]:
    """Each row's ``n_neighbors`` nearest ``candidates`` (-1: none) by float64 distances, ties by index.

    Returns
    -------
    Their indices (int64) and distances (float32), nearest first.
    """
    # In order of index, so that the stable order of distances breaks their ties by index.
    candidates = xp.sort(xp.asarray(candidates, dtype=xp.int64), axis=1)
    distances = xp.sqrt(squared_distances_to(xp.asarray(embedding), candidates, xp=xp))
    order = xp.argsort(distances, axis=1, kind="stable")[:, :n_neighbors]
    indices = xp.take_along_axis(candidates, order, axis=1)
    return indices, xp.take_along_axis(distances, order, axis=1).astype(xp.float32)
