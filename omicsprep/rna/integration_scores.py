"""scIB's integration metrics (Luecken et al. 2022) of each embedding, with scib-metrics.

Bio conservation (isolated labels, k-means NMI and ARI, label silhouette, cLISI) and batch
correction (BRAS, iLISI, kBET, graph connectivity, PCR comparison), their means and the total
(0.6 bio, 0.4 batch), computed by scib-metrics on the cells whose label is known. The
neighbours scib-metrics needs (90 per cell) are exact: scikit-learn's on the CPU; on the GPU the
cells within an approximate search's bound, found in the pass over all pairs that also sums the
silhouettes' distances, kept for the label silhouette and isolated labels (:func:`scib_neighbors`)
(scib-metrics' own approximate search, pynndescent, is what stalled for hours at 900k cells);
scib-metrics' JAX metrics run on JAX's default device.
What they compile is kept on disk for later runs (:func:`omicsprep.jit_cache.cache_scib_compilations`).

Five of scib-metrics' steps cost seconds to hours at a million cells, and are computed here
instead while its ``Benchmarker`` runs (:func:`_steps_on_backend`), the first three on the backend
(on the GPU, kBET's graph, the neighbours' UMAP connectivities, comes from cuML too):

- the silhouettes (label silhouette, isolated labels, BRAS): scib-metrics adds each block of
  256 cells' distances to every cell into per-label sums one by one (a scatter on the GPU, 3,900
  blocks at a million cells); here, on the CPU, a block's distances come from one matrix
  product and their sums per label from another, and on the GPU from a kernel that sums each
  cell's distances per label without writing them (:func:`silhouette_samples`);
- kBET per label (:func:`kbet_per_label`, scib-metrics' loop step for step), each label's part
  of the graph taken on the backend (on the GPU where cuML made the graph: scib-metrics
  copies it to the host and takes the parts there), and in it:
- kBET's neighbours in each label's diffusion map: scib-metrics finds them with pynndescent in
  one thread after an ARPACK eigendecomposition on the CPU; here the eigenvectors come from
  the backend's Lanczos solver and the neighbours from the exact search
  (:func:`diffusion_neighbors`). On 20,000 cells they are pynndescent's: kBET the same to
  the last digit;
- kBET's chi-square test of each label's neighbours, which scib-metrics' JAX compiles again for
  each label's size; here in NumPy (:func:`kbet`);
- the k-means clusters of NMI and ARI, whose JAX loop scib-metrics compiles again at every call
  and whose centroids it sums through a cells x clusters x features mask: its own start and
  steps, compiled once, with the centroids from one matrix product (:func:`kmeans_labels`).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from functools import cache, cached_property, partial, wraps
from types import ModuleType
from typing import Any, Literal
from unittest import mock

import numpy as np
import pandas as pd
import scipy.sparse.csgraph
import scipy.sparse.linalg
import scipy.special
from anndata import AnnData

from omicsprep.backend import (
    Backend,
    array_module,
    asnumpy,
    cuml,
    cupy,
    cupyx_sparse,
    cupyx_sparse_linalg,
    host_to_device,
    synchronize,
)
from omicsprep.errors import InputError
from omicsprep.jit_cache import cache_scib_compilations
from omicsprep.rna.embedding import exact_neighbors, exact_neighbors_and_label_sums
from omicsprep.rna.latent import UNLABELLED, known_labels

log = logging.getLogger(__name__)

AGGREGATES = ("Batch correction", "Bio conservation", "Total")
# The most bytes of one block of distances (cells of the block x all cells), float32.
DISTANCE_BLOCK_BYTES = 1 << 30
DIFFUSION_EPS = 1e-8  # scib-metrics' guard against eigenvalues of exactly 1
# scib-metrics keeps an eigenvalue of exactly 1 (a component's stationary vector) and scales the
# others by e / (1 - e), in float32. From transitions made in the graph's float32, the stationary
# eigenvalue comes out a few units of float32 off 1 or on it (1.000000063 on a label of the test
# study): off it, its vector is scaled by about 1e7, swamps the map, and that label's kBET jumps
# (0.836 against 0.008) with the graph's last bits, in which cuML's and umap-learn's differ.
# Eigenvalues this close to 1 are taken as 1, on both backends and in the reference
# (omicsprep.testing.scib_reference).
STATIONARY_EIGENVALUE_TOLERANCE = 1e-6
KMEANS_TOLERANCE = 1e-4  # scib-metrics' KMeans: of the features' mean variance
MIN_KMEANS_STEPS = 300  # scib-metrics' KMeans' max_iter, which its loop takes as a minimum
# CuPy's Lanczos stops when the norm of all the components' residuals is below this. Its default,
# machine epsilon, lies under the residuals' rounding: on a generated label of 80,000 cells it
# took 88 restarts where 1e-12 took 16, for the same eigenvalues (7e-11 from ARPACK's either way)
# and the same neighbours: counted with its algorithm ported to NumPy, not with CuPy itself
# (2026-12-06; 2.2 s a label on an H200 at the default).
LANCZOS_TOLERANCE = 1e-12


def scib_neighbors(
    embedding: np.ndarray,
    n_neighbors: int,
    *,
    backend: Backend,
    labels: Any = None,
    memory: SilhouetteMemory | None = None,
) -> Any:
    """:func:`omicsprep.rna.embedding.exact_neighbors` as scib-metrics takes them (``NeighborsResults``).

    On the GPU their UMAP connectivities (kBET's graph) come from cuML, as rapids-singlecell's:
    umap-learn's took 15 s or more a million cells on the CPU, for each embedding. With
    ``labels`` (codes) and ``memory``, the silhouettes of ``embedding`` against them that the
    GPU's search summed on its way are kept in ``memory`` for scib-metrics' label silhouette and
    isolated labels: one pass over all pairs of cells for both.
    """
    indices, distances, sums = exact_neighbors_and_label_sums(
        embedding, n_neighbors, labels=labels if memory is not None else None, backend=backend
    )
    if sums is not None and memory is not None:
        xp = array_module(backend)
        codes = xp.asarray(labels, dtype=xp.int64)
        silhouettes = silhouettes_from_sums(sums, codes, between_cluster_distances="nearest", xp=xp)
        memory.remember(embedding, labels, silhouettes)
    return _neighbors_on_host(indices, distances, backend=backend)


def _neighbors_on_host(indices: Any, distances: Any, *, backend: Backend) -> Any:
    """Neighbours found on ``backend`` as scib-metrics' ``NeighborsResults`` (NumPy, int64 indices)."""
    return _neighbors_results(backend)(
        indices=np.asarray(asnumpy(indices), dtype=np.int64), distances=asnumpy(distances)
    )


@cache
def _neighbors_results(backend: Backend) -> type:
    """scib-metrics' ``NeighborsResults``, its connectivities computed on ``backend``."""
    from scib_metrics.nearest_neighbors import NeighborsResults

    if backend == "cpu":
        return NeighborsResults

    class NeighborsOnGpu(NeighborsResults):
        """Neighbours whose connectivities (kBET's graph) cuML computes; subsets stay of this class."""

        @cached_property
        def connectivities_on_device(self) -> Any:
            """UMAP's connectivities on the device (:func:`umap_connectivities_on_gpu`), where kBET takes them."""
            return umap_connectivities_on_gpu(self.indices, self.distances)

        @cached_property
        def knn_graph_connectivities(self) -> scipy.sparse.csr_matrix:
            """The connectivities on the host, where scib-metrics' other metrics would take them."""
            return asnumpy(self.connectivities_on_device)

    return NeighborsOnGpu


def umap_connectivities_on_gpu(indices: np.ndarray, distances: np.ndarray) -> Any:
    """UMAP's fuzzy union of each cell's neighbours (umap-learn's ``fuzzy_simplicial_set``) by cuML.

    Parameters
    ----------
    indices, distances
        Each cell's neighbours, itself among them, nearest first.

    Returns
    -------
    The symmetric connectivities, a CuPy CSR matrix.
    """
    cp = cupy()
    n_cells = indices.shape[0]
    graph = cuml().manifold.umap.fuzzy_simplicial_set(
        cp.zeros((n_cells, 1), dtype=cp.float32),  # cuML asks for points, unused with neighbours
        indices.shape[1],
        random_state=0,  # the order of its sums fixed
        knn_indices=host_to_device(np.ascontiguousarray(indices, dtype=np.int64)),
        knn_dists=host_to_device(np.ascontiguousarray(distances, dtype=np.float32)),
    )
    # cuML's matrix takes its shape from the largest index it holds: set it.
    connectivities = cupyx_sparse().coo_matrix((graph.data, (graph.row, graph.col)), shape=(n_cells, n_cells)).tocsr()
    connectivities.eliminate_zeros()
    return connectivities


def scib_benchmarker(
    adata: AnnData, *, embeddings: Sequence[str], batch_key: str, label_key: str, backend: Backend
) -> Any:
    """scib-metrics' ``Benchmarker`` run on ``embeddings`` of the cells with a known label.

    Parameters
    ----------
    adata
        Cells with the embeddings and ``X_pca`` (the uncorrected baseline of PCR
        comparison) in ``obsm``.
    embeddings
        ``obsm`` keys to score.
    batch_key
        The ``obs`` column of the batches.
    label_key
        The ``obs`` column of the cell types; cells without one (missing, empty,
        ``Unknown``) are left out.
    backend
        Where the neighbours are searched.

    Returns
    -------
    The benchmarked ``scib_metrics.benchmark.Benchmarker`` (its ``get_results`` and
    ``plot_results_table``).

    Raises
    ------
    InputError
        Fewer than two known labels.
    """
    # JAX (scib-metrics) takes 75% of the GPU's memory when it starts unless told not to; the
    # process's CuPy, cuML and PyTorch hold theirs already.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from scib_metrics.benchmark import Benchmarker

    cache_scib_compilations()

    labels = known_labels(adata.obs[label_key])
    known = (labels != UNLABELLED).to_numpy()
    if labels[known].nunique() < 2:
        raise InputError(f"the scIB metrics need two known labels or more in obs[{label_key!r}]")
    # As codes in the names' sorted order (scib-metrics' order of labels): its metrics sort and
    # compare them as strings otherwise, 4 s of NMI and ARI a million cells.
    cells = AnnData(
        obs=pd.DataFrame(
            {
                "batch": pd.Categorical(adata.obs[batch_key].astype(str).to_numpy()[known]).codes,
                "label": pd.Categorical(labels.to_numpy()[known]).codes,
            },
            index=adata.obs_names[known],
        ),
        obsm={key: np.asarray(adata.obsm[key])[known] for key in {*embeddings, "X_pca"}},
    )
    benchmarker = Benchmarker(
        cells,
        batch_key="batch",
        label_key="label",
        embedding_obsm_keys=list(embeddings),
        pre_integrated_embedding_obsm_key="X_pca",
        progress_bar=False,
    )
    memory = SilhouetteMemory(backend)
    neighbours = partial(scib_neighbors, backend=backend, labels=cells.obs["label"].to_numpy(), memory=memory)
    with _steps_on_backend(backend, memory), _collecting_new_objects_only():
        benchmarker.prepare(neighbor_computer=_timed("neighbours", neighbours))
        benchmarker.benchmark()
    return benchmarker


@contextmanager
def _collecting_new_objects_only() -> Iterator[None]:
    """The objects alive now left out of garbage collection until the block ends (``gc.freeze``).

    scib-metrics collects garbage before each metric, ten an embedding, and a collection walks
    every object of the process: 0.18 s each with scanpy, scvi-tools, JAX and PyTorch imported
    (2 CPU cores), nearly nothing for the objects made since the freeze.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def _steps_on_backend(backend: Backend, silhouettes: SilhouetteMemory) -> Iterator[None]:
    """scib-metrics' silhouettes, kBET's diffusion neighbours and test, and k-means replaced by ours while it runs.

    Its metric functions look these helpers up in their modules' globals, which is where they
    are replaced (scib-metrics 0.5; a version without them fails here, by name). The
    silhouettes come from ``silhouettes``, which keeps those it computed or was given.
    """
    import scib_metrics
    from scib_metrics.benchmark import BatchCorrection, BioConservation
    from scib_metrics.metrics import _isolated_labels, _nmi_ari, _silhouette

    replacements = [
        (_silhouette, "silhouette_samples", silhouettes),
        (_isolated_labels, "silhouette_samples", silhouettes),
        (_nmi_ari, "_compute_clustering_kmeans", kmeans_labels),
    ]
    our_metrics: dict[str, Callable[..., Any]] = {"kbet_per_label": partial(kbet_per_label, backend=backend)}
    # Each metric timed in the log, as the Benchmarker looks it up by name.
    metrics = [*asdict(BioConservation()), *asdict(BatchCorrection())]
    replacements += [
        (scib_metrics, name, _timed(name, our_metrics.get(name) or getattr(scib_metrics, name))) for name in metrics
    ]
    with ExitStack() as stack:
        for module, name, replacement in replacements:
            stack.enter_context(mock.patch.object(module, name, replacement))
        yield


def _timed(step: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` logging its seconds: at a million cells scIB takes minutes, the log says where."""

    @wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            log.info("scIB %s: %.1f s", step, time.perf_counter() - start)

    return timed


class SilhouetteMemory:
    """:func:`silhouette_samples` that gives a result again when asked again for it.

    scib-metrics' isolated labels and label silhouette each ask for every cell's silhouette of
    the same embedding and labels: a pass over all pairs of cells, computed once, or given
    before (:meth:`remember`) by the GPU's neighbour search, which passes over the pairs too.
    An embedding is known by identity (scib-metrics passes the same array to each metric). What
    was given is kept; of what it computed, the last result only (BRAS asks for one per label).
    """

    Kept = tuple[Any, np.ndarray, tuple[str, str], np.ndarray]

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.given: list[SilhouetteMemory.Kept] = []
        self.last: list[SilhouetteMemory.Kept] = []

    def remember(self, X: Any, labels: Any, silhouettes: np.ndarray) -> None:
        """Keep ``silhouettes`` of ``X`` against ``labels``: Euclidean, against the nearest other label."""
        self.given.append((X, np.asarray(labels), ("euclidean", "nearest"), silhouettes))

    def __call__(
        self,
        X: Any,  # scib-metrics' names; it passes the settings by keyword, chunk_size (unused) too
        labels: Any,
        *,
        metric: Literal["euclidean", "cosine"] = "euclidean",
        between_cluster_distances: Literal["nearest", "mean_other"] = "nearest",
        **_: Any,
    ) -> np.ndarray:
        """scib-metrics' ``silhouette_samples(X, labels, ...)``: a copy of a kept result, or computed and kept."""
        labels, asked = np.asarray(labels), (metric, between_cluster_distances)
        for kept_X, kept_labels, kept_asked, silhouettes in self.given + self.last:
            if kept_X is X and kept_asked == asked and np.array_equal(kept_labels, labels):
                return silhouettes.copy()
        silhouettes = silhouette_samples(
            X, labels, metric=metric, between_cluster_distances=between_cluster_distances, backend=self.backend
        )
        self.last = [(X, labels, asked, silhouettes)]
        return silhouettes.copy()


def silhouette_samples(
    X: Any,  # scib-metrics' parameters, which its metrics pass by these names
    labels: Any,
    chunk_size: int = 256,
    metric: Literal["euclidean", "cosine"] = "euclidean",
    between_cluster_distances: Literal["nearest", "mean_other"] = "nearest",
    *,
    backend: Backend,
) -> np.ndarray:
    """Each cell's silhouette, as scib-metrics' ``silhouette_samples``: matrix products, or a CUDA kernel on the GPU.

    Each cell's summed distance to each label's cells comes from blocks of matrix products on
    the CPU (and on the GPU for embeddings of over 128 dimensions), else from
    :mod:`omicsprep.rna.pairs_cuda`'s kernel, which keeps the distances out of memory.

    Parameters
    ----------
    X
        Cells x coordinates.
    labels
        Each cell's cluster.
    chunk_size
        scib-metrics' block size, not used: blocks hold :data:`DISTANCE_BLOCK_BYTES`.
    metric
        ``"euclidean"`` or ``"cosine"`` (1 - cosine similarity, within [0, 2]).
    between_cluster_distances
        ``"nearest"``: the mean distance to the nearest other cluster (the silhouette);
        ``"mean_other"``: the mean distance to all cells of other clusters (BRAS).

    Returns
    -------
    The silhouettes, float32, 0 where undefined.
    """
    xp = array_module(backend)
    codes = xp.asarray(pd.Categorical(np.asarray(labels)).codes.astype(np.int64))
    points = xp.asarray(asnumpy(X), dtype=xp.float32)
    if metric == "cosine":
        points = points / xp.sqrt((points * points).sum(axis=1, keepdims=True))
    else:  # centred: smaller norms lose fewer digits in |x|^2 + |y|^2 - 2xy
        points = points - points.mean(axis=0)
    n_labels, cosine = int(codes.max()) + 1, metric == "cosine"
    sums = None
    if backend == "gpu":
        from omicsprep.rna import pairs_cuda

        if points.shape[1] <= pairs_cuda.MAX_DIMS:
            sums = pairs_cuda.pair_sums_gpu(points, codes, n_labels, cosine=cosine, xp=xp).sums
    if sums is None:
        sums = label_distance_sums(points, codes, n_labels, cosine=cosine, xp=xp)
    return silhouettes_from_sums(sums, codes, between_cluster_distances=between_cluster_distances, xp=xp)


def silhouettes_from_sums(
    sums: Any, codes: Any, *, between_cluster_distances: Literal["nearest", "mean_other"], xp: ModuleType
) -> np.ndarray:
    """Each cell's silhouette from its summed distance to each label's cells (scib-metrics' ``silhouette_samples``).

    Parameters
    ----------
    sums
        Cells x labels (NumPy or CuPy; overwritten).
    codes
        Each cell's label, ``0 ..``, in the array module of ``sums``.
    between_cluster_distances
        ``"nearest"``: the mean distance to the nearest other label (the silhouette);
        ``"mean_other"``: the mean distance to all cells of other labels (BRAS).
    xp
        NumPy or CuPy: the array module of ``sums`` and ``codes``.

    Returns
    -------
    The silhouettes, float32 on the host, 0 where undefined.
    """
    n_cells, n_labels = sums.shape
    sizes = xp.bincount(codes, minlength=n_labels).astype(sums.dtype)
    own = (xp.arange(n_cells), codes)
    within = sums[own]
    if between_cluster_distances == "nearest":
        sums[own] = xp.inf
        between = (sums / sizes).min(axis=1)
    else:
        sums[own] = 0
        between = sums.sum(axis=1) / (n_cells - sizes[codes])
    with np.errstate(divide="ignore", invalid="ignore"):  # a label of one cell: 0, as scib-metrics gives it
        within /= sizes[codes] - 1
        silhouettes = (between - within) / xp.maximum(within, between)
    return asnumpy(xp.nan_to_num(silhouettes)).astype(np.float32)


def label_distance_sums(points: Any, codes: Any, n_labels: int, *, cosine: bool, xp: ModuleType) -> Any:
    """Cells x labels: each cell's summed distance to each label's cells, from blocks of matrix products.

    Parameters
    ----------
    points
        Cells x coordinates, float32 (unit rows for ``cosine``; centred ones lose fewer digits).
    codes
        Each cell's label, ``0 .. n_labels - 1``.
    n_labels
        How many labels.
    cosine
        1 - cosine similarity instead of the Euclidean distance.
    xp
        NumPy or CuPy: the array module of ``points``.

    Returns
    -------
    The sums, float32, blocks of :data:`DISTANCE_BLOCK_BYTES` of distances at a time.
    """
    n_cells = points.shape[0]
    members = xp.zeros((n_cells, n_labels), dtype=xp.float32)
    members[xp.arange(n_cells), codes] = 1
    squares = (points * points).sum(axis=1)
    sums = xp.empty((n_cells, n_labels), dtype=xp.float32)
    block = max(DISTANCE_BLOCK_BYTES // (4 * n_cells), 1)
    for start in range(0, n_cells, block):
        rows = slice(start, min(start + block, n_cells))
        products = points[rows] @ points.T
        if cosine:
            distances = xp.clip(1 - products, 0, 2)
        else:
            distances = xp.sqrt(xp.maximum(squares[rows, None] + squares[None, :] - 2 * products, 0))
        sums[rows] = distances @ members
    return sums


def diffusion_neighbors(connectivities: Any, k: int, n_comps: int = 100, *, backend: Backend) -> Any:
    """Each cell's ``k + 1`` nearest cells in ``connectivities``' diffusion map, as scib-metrics' ``diffusion_nn``.

    The map is :func:`diffusion_map`'s; the neighbours come from the exact search
    (pynndescent's in scib-metrics, one thread).

    Returns
    -------
    ``NeighborsResults``: indices and distances, nearest first.
    """
    start = time.perf_counter()
    embedding = diffusion_map(connectivities, n_comps, backend=backend)
    synchronize(backend=backend)
    mapped = time.perf_counter()
    indices, distances = exact_neighbors(embedding, k + 1, backend=backend)
    synchronize(backend=backend)
    searched = time.perf_counter()
    result = _neighbors_on_host(indices, distances, backend=backend)
    log.info(
        "scIB kBET's diffusion map of %d cells %.2f s, its neighbours %.2f s (to the host %.2f s)",
        embedding.shape[0],
        mapped - start,
        searched - mapped,
        time.perf_counter() - searched,
    )
    return result


def diffusion_map(connectivities: Any, n_comps: int, *, backend: Backend) -> Any:
    """``connectivities``' diffusion map as scib-metrics computes it for kBET, on ``backend``.

    scanpy's density-normalized transitions, their ``n_comps`` eigenvectors of largest magnitude
    in float64 (from the backend's Lanczos solver; ARPACK's on the CPU, as scib-metrics), scaled
    by ``e / (1 - e)``, in float32; eigenvalues within :data:`STATIONARY_EIGENVALUE_TOLERANCE` of
    1 kept as 1 (scib-metrics keeps exactly 1 only).
    """
    xp = array_module(backend)
    transitions = _diffusion_transitions(connectivities, backend=backend)
    n_comps = min(transitions.shape[0] - 1, n_comps)
    # CuPy's Lanczos needs more vectors than components below the graph's size (ARPACK: as many).
    if backend == "gpu" and transitions.shape[0] > 2 * n_comps + 1:
        # CuPy's Lanczos starts from an unseeded random vector: a seeded one, so that a run's
        # eigenvectors, and kBET, are the next run's.
        start_vector = host_to_device(np.random.default_rng(0).random(transitions.shape[0]))
        values, vectors = cupyx_sparse_linalg().eigsh(
            transitions, k=n_comps, which="LM", v0=start_vector, tol=LANCZOS_TOLERANCE
        )
    else:
        values, vectors = scipy.sparse.linalg.eigsh(asnumpy(transitions), k=n_comps, which="LM")
    values, vectors = xp.asarray(values), xp.asarray(vectors)
    order = xp.argsort(values)[::-1]
    values = stationary_as_one(values[order].astype(xp.float32), xp=xp) + xp.float32(DIFFUSION_EPS)
    vectors = vectors[:, order].astype(xp.float32)
    with np.errstate(divide="ignore"):  # the eigenvalue 1, kept as it is
        return vectors * xp.where(values == 1, values, values / (1 - values))


def stationary_as_one(values: Any, *, xp: ModuleType) -> Any:
    """Float32 eigenvalues within :data:`STATIONARY_EIGENVALUE_TOLERANCE` of 1 set to exactly 1."""
    return xp.where(xp.abs(values - 1) <= STATIONARY_EIGENVALUE_TOLERANCE, xp.float32(1), values)


def _diffusion_transitions(connectivities: Any, *, backend: Backend) -> Any:
    """The symmetric transitions of a graph as scanpy builds them, density-normalized, in float64.

    Computed in the graph's precision and then cast, as scib-metrics does.
    """
    xp = array_module(backend)
    sparse = cupyx_sparse() if backend == "gpu" else scipy.sparse
    graph = sparse.csr_matrix(connectivities)
    density = sparse.diags(1.0 / xp.asarray(graph.sum(axis=0)).ravel())
    kernel = density @ graph @ density
    scale = sparse.diags(1.0 / xp.sqrt(xp.asarray(kernel.sum(axis=0)).ravel()))
    return (scale @ kernel @ scale).astype(np.float64)


def kbet_per_label(
    X: Any,  # scib-metrics' names; its Benchmarker passes these three by position
    batches: np.ndarray,
    labels: np.ndarray,
    *,
    alpha: float = 0.05,
    diffusion_n_comps: int = 100,
    return_df: bool = False,
    backend: Backend,
) -> float | tuple[float, pd.DataFrame]:
    """scib-metrics' ``kbet_per_label``, step for step, each label's graph taken on ``backend``.

    For each label: its cells' part of the neighbours' connectivities; its connected components
    (SciPy's, as scib-metrics'); unless too small or of one batch, the kBET (:func:`kbet`) of
    its diffusion neighbours (:func:`diffusion_neighbors`), on its largest components when they
    hold 75% of its cells (else 0). On the GPU the graph stays on the device, where cuML made
    it: scib-metrics takes each label's part on the host, 0.2 s a label at a million cells,
    after the graph's copy there.

    Returns
    -------
    The mean over labels, and with ``return_df`` each label's kBET.
    """
    batch_codes = np.asarray(pd.Categorical(batches).codes)
    labels = np.asarray(labels)
    graph = X.connectivities_on_device if backend == "gpu" else X.knn_graph_connectivities
    clusters = np.unique(labels)
    scores = []
    for cluster in clusters:
        members = np.flatnonzero(labels == cluster)
        label_batches = batch_codes[members]
        if members.size < 10 or np.unique(label_batches).size == 1:
            scores.append(np.nan)
            continue
        k0 = min(70, max(10, int(np.floor(np.mean(pd.Series(label_batches).value_counts()) / 4))))
        k0 = min(k0, (2**31 - 1) // members.size)  # scib-metrics' bound on k0 x cells
        subgraph = _rows_and_columns(graph, members, backend=backend)
        n_components, components = scipy.sparse.csgraph.connected_components(asnumpy(subgraph), connection="strong")
        if n_components > 1:
            sizes = pd.Series(components).value_counts()
            kept = np.flatnonzero(np.isin(components, sizes[sizes >= 3 * k0].index))
            if kept.size / components.size < 0.75:
                scores.append(0.0)
                continue
            subgraph, label_batches = _rows_and_columns(subgraph, kept, backend=backend), label_batches[kept]
        # As scib-metrics: the smaller number of components stays for the labels after this one.
        diffusion_n_comps = min(diffusion_n_comps, subgraph.shape[0] - 1)
        try:
            neighbours = diffusion_neighbors(subgraph, k=k0, n_comps=diffusion_n_comps, backend=backend)
            scores.append(kbet(neighbours, label_batches, alpha)[0])
        except ValueError:  # scib-metrics' "diffusion distance failed": every cell rejected
            scores.append(0.0)
    table = pd.DataFrame({"cluster": clusters, "kBET": scores})
    score = float(np.nanmean(table["kBET"]))
    return (score, table) if return_df else score


def _rows_and_columns(graph: Any, members: np.ndarray, *, backend: Backend) -> Any:
    """The part of ``graph`` among ``members`` (ascending), its indices sorted, as scib-metrics takes it."""
    members = array_module(backend).asarray(members)
    part = graph[members][:, members]
    part.sort_indices()
    return part


def kbet(X: Any, batches: np.ndarray, alpha: float = 0.05) -> tuple[float, np.ndarray, np.ndarray]:
    """One label's kBET (Büttner et al. 2018) as scib-metrics' ``kbet``, in NumPy: no compile per label.

    Each cell's neighbours' batches against the label's batch shares, by a chi-square test.
    scib-metrics jits the test for each label's shape: at 50,000 cells (12 labels) its 72
    compiles took 9.2 s of kBET's 43 s on the CPU, and a million cells' 4 embeddings ask for
    about 300.

    Parameters
    ----------
    X
        The label's neighbours (``NeighborsResults``; each cell's own among them).
    batches
        Each cell's batch.
    alpha
        A cell's test passes at a p-value of ``alpha`` or more.

    Returns
    -------
    The share of cells that pass, each cell's statistic and p-value.
    """
    codes = pd.Categorical(batches).codes
    n_batches = int(codes.max()) + 1
    neighbour_batches = codes[np.asarray(X.indices)]
    observed = np.stack([(neighbour_batches == batch).sum(axis=1) for batch in range(n_batches)], axis=1)
    expected = np.bincount(codes, minlength=n_batches) / codes.size * neighbour_batches.shape[1]
    statistics = (np.square(observed - expected) / expected).sum(axis=1)
    p_values = 1 - scipy.special.gammainc((n_batches - 1) / 2, statistics / 2)  # the chi-square's upper tail
    return float((p_values >= alpha).mean()), statistics, p_values


def kmeans_labels(X: np.ndarray, n_clusters: int) -> np.ndarray:
    """scib-metrics' k-means clusters (its ``KMeans(n_clusters)``, for NMI and ARI), compiled once.

    Its start (k-means++ from JAX's key 0 on the centred points) and its steps: at least
    :data:`MIN_KMEANS_STEPS` (its loop goes on while the inertia changes by more than its
    tolerance *or* fewer steps were taken), each cell to its nearest centroid by its own
    distances. Two things differ. Its loop is a method jitted with the instance static, so JAX
    compiles it again at every call; here one function compiled once per shape. And each
    centroid is summed from a product of the cells' cluster indicators with the points (float32
    at JAX's highest precision: the GPU's default TF32 would round the points), not through a
    cells x clusters x features mask. On 20,000 cells and 2 CPU cores: 3.8 s a call against 1.2.

    Parameters
    ----------
    X
        The embedding, a row per cell.
    n_clusters
        Clusters: scib-metrics asks for as many as labels.

    Returns
    -------
    Each cell's cluster.
    """
    import jax
    from scib_metrics.utils._kmeans import _initialize_plus_plus, _tolerance

    points = np.array(X, dtype=np.float32, order="C")
    tolerance = _tolerance(points, KMEANS_TOLERANCE)
    points -= points.mean(axis=0)
    key = jax.random.split(jax.random.PRNGKey(0), 1)[0]  # the key of its one start (n_init 1)
    start = _initialize_plus_plus(points, n_clusters, key)
    return np.asarray(_lloyd_steps()(points, start, np.float32(tolerance)))


@cache
def _lloyd_steps() -> Callable[..., Any]:
    """scib-metrics' k-means loop (its ``_kmeans_full_run`` after the start) as one jitted function."""
    import jax
    import jax.numpy as jnp
    from scib_metrics.utils._kmeans import _get_dist_labels

    @jax.jit
    def steps(points: Any, centroids: Any, tolerance: Any) -> Any:
        n_clusters = centroids.shape[0]

        def step(state: tuple[Any, ...]) -> tuple[Any, ...]:
            centroids, inertia, _, taken = state
            distances, clusters = _get_dist_labels(points, centroids)
            members = jax.nn.one_hot(clusters, n_clusters, dtype=points.dtype)
            counts = jnp.clip(jnp.bincount(clusters, length=n_clusters), min=1)
            sums = jnp.matmul(members.T, points, precision=jax.lax.Precision.HIGHEST)
            return sums / counts[:, None], jnp.sum(jnp.min(distances, axis=1)), inertia, taken + 1

        def going_on(state: tuple[Any, ...]) -> Any:
            _, new, old, taken = state
            return jnp.logical_or(jnp.abs(old - new) > tolerance, taken < MIN_KMEANS_STEPS)

        state = (centroids, jnp.float32(jnp.inf), jnp.float32(jnp.inf), jnp.int32(0))
        centroids = jax.lax.while_loop(going_on, step, state)[0]
        return _get_dist_labels(points, centroids)[1]

    return steps


def scib_table(benchmarker: Any) -> pd.DataFrame:
    """A row per embedding (``embedding``), a column per metric and per aggregate, unscaled."""
    results = benchmarker.get_results(min_max_scale=False).drop(index="Metric Type")
    table = results.astype(float).rename_axis("embedding").reset_index()
    return table[["embedding", *(c for c in table.columns if c != "embedding" and c not in AGGREGATES), *AGGREGATES]]
