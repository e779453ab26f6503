"""Neighbours, UMAP and Leiden from a stage's options: the embedding steps every modality shares."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    pass

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
    """Each row's ``n_neighbors`` nearest rows by Euclidean distance, by brute force (exact).

    A row is among its own neighbours (first, but among identical rows). On the GPU
    (cuML) the embedding may be a CuPy or NumPy array and the results are CuPy arrays; on the
    CPU (scikit-learn), NumPy arrays.

    Returns
    -------
    The neighbours' indices and their distances (float32), nearest first.
    """
    if backend == "gpu":
        model = cuml().neighbors.NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(embedding)
    else:
        from sklearn.neighbors import NearestNeighbors

        model = NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(embedding)
    distances, indices = model.kneighbors(embedding)
    xp = array_module(backend)
    return xp.asarray(indices), xp.asarray(distances, dtype=xp.float32)
