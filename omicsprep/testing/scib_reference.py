"""scib-metrics' own benchmark, given exact neighbours: the reference that ours is compared with."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from anndata import AnnData


def brute_force_neighbors(points: np.ndarray, n_neighbors: int) -> Any:
    """Exact neighbours by scikit-learn's brute force, as scib-metrics takes them (``NeighborsResults``).

    The distances come from the coordinates' differences in float64 (not scikit-learn's
    |x|^2 + |y|^2 - 2xy), nearest first: kBET (a diffusion map and pynndescent inside
    scib-metrics) moves by 0.002-0.005 when the distances differ in the 7th digit. Written apart
    from :func:`omicsprep.rna.embedding.exact_neighbors`, the search ours gives scib-metrics, which
    this reference checks.
    """
    from scib_metrics.nearest_neighbors import NeighborsResults
    from sklearn.neighbors import NearestNeighbors

    indices = NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(points).kneighbors(points)[1]
    distances = np.linalg.norm(points[indices] - points[:, None, :].astype(np.float64), axis=2)
    order = np.argsort(distances, axis=1, kind="stable")
    indices, distances = np.take_along_axis(indices, order, axis=1), np.take_along_axis(distances, order, axis=1)
    return NeighborsResults(indices=indices, distances=distances.astype(np.float32))  # as ours and pynndescent's


@contextmanager
def stationary_eigenvalues_as_one() -> Iterator[None]:
    """scib-metrics' diffusion maps (kBET's) with eigenvalues near 1 taken as 1, as ours.

    (:data:`omicsprep.rna.integration_scores.STATIONARY_EIGENVALUE_TOLERANCE` says why.)
    """
    from scib_metrics.utils import _diffusion_nn

    from omicsprep.rna.integration_scores import stationary_as_one

    compute_eigen = _diffusion_nn._compute_eigen  # noqa: SLF001

    def rounded(*args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        values, vectors = compute_eigen(*args, **kwargs)
        return stationary_as_one(values, xp=np), vectors

    _diffusion_nn._compute_eigen = rounded  # noqa: SLF001
    try:
        yield
    finally:
        _diffusion_nn._compute_eigen = compute_eigen  # noqa: SLF001


def scib_metrics_own(cells: AnnData, *, batch_key: str, label_key: str, embeddings: Sequence[str]) -> pd.DataFrame:
    """scib-metrics' ``Benchmarker`` on ``embeddings`` of ``cells`` (``X_pca`` the unintegrated one), unscaled.

    Its kBET's diffusion maps take eigenvalues near 1 as 1 (:func:`stationary_eigenvalues_as_one`).

    Returns
    -------
    A row per embedding, a column per metric and aggregate.
    """
    from scib_metrics.benchmark import Benchmarker

    own = Benchmarker(
        cells,
        batch_key=batch_key,
        label_key=label_key,
        embedding_obsm_keys=list(embeddings),
        pre_integrated_embedding_obsm_key="X_pca",
        progress_bar=False,
    )
    own.prepare(neighbor_computer=brute_force_neighbors)
    with stationary_eigenvalues_as_one():
        own.benchmark()
    return own.get_results(min_max_scale=False).drop(index="Metric Type").astype(float)
