"""scIB's integration metrics (Luecken et al. 2022) of each embedding, with scib-metrics.

Bio conservation (isolated labels, k-means NMI and ARI, label silhouette, cLISI) and batch
correction (BRAS, iLISI, kBET, graph connectivity, PCR comparison), their means and the total
(0.6 bio, 0.4 batch), computed by scib-metrics on the cells whose label is known. The
neighbours scib-metrics needs (90 per cell) are exact: scikit-learn's on the CPU, cuML's
brute-force search on the GPU (scib-metrics' own approximate search, pynndescent, is what
stalled for hours at 900k cells); scib-metrics' JAX metrics run on JAX's default device.
What they compile is kept on disk for later runs (:func:`omicsprep.jit_cache.cache_scib_compilations`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from anndata import AnnData

from omicsprep.backend import Backend, asnumpy
from omicsprep.errors import InputError
from omicsprep.jit_cache import cache_scib_compilations
from omicsprep.rna.embedding import exact_neighbors
from omicsprep.rna.latent import UNLABELLED, known_labels

AGGREGATES = ("Batch correction", "Bio conservation", "Total")


def scib_neighbors(embedding: np.ndarray, n_neighbors: int, *, backend: Backend) -> Any:
    """:func:`omicsprep.rna.embedding.exact_neighbors` as scib-metrics takes them (``NeighborsResults``)."""
    from scib_metrics.nearest_neighbors import NeighborsResults

    indices, distances = exact_neighbors(embedding, n_neighbors, backend=backend)
    return NeighborsResults(indices=np.asarray(asnumpy(indices), dtype=np.int64), distances=asnumpy(distances))


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
    cells = AnnData(
        obs=pd.DataFrame(
            {"batch": adata.obs[batch_key].astype(str).to_numpy()[known], "label": labels.to_numpy()[known]},
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
    benchmarker.prepare(neighbor_computer=lambda points, k: scib_neighbors(points, k, backend=backend))
    benchmarker.benchmark()
    return benchmarker


def scib_table(benchmarker: Any) -> pd.DataFrame:
    """A row per embedding (``embedding``), a column per metric and per aggregate, unscaled."""
    results = benchmarker.get_results(min_max_scale=False).drop(index="Metric Type")
    table = results.astype(float).rename_axis("embedding").reset_index()
    return table[["embedding", *(c for c in table.columns if c != "embedding" and c not in AGGREGATES), *AGGREGATES]]
