"""A generated study of several batches with planted cell types and a technical batch effect.

Each batch draws its cells from the same cell types as :mod:`omicsprep.testing.generate`
(12 types over a heavy-tailed baseline, damaged cells and doublets included), with its own
per-gene capture efficiency (log-normal, ``batch_sigma``): the same cell type then differs
between batches in every gene, as between 10x runs or chemistries. One batch can lack a
type altogether, which catches an integration that forces every batch onto every type
(over-correction). The labels are in ``obs["cell_type"]`` (a doublet's first type).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.testing.generate import CHUNK, N_CLUSTERS, chunk_counts, profiles
from omicsprep.testing.genes import gene_names

TYPES = [f"type{t:02d}" for t in range(N_CLUSTERS)]


def generate_study(
    *,
    n_batches: int = 3,
    n_cells: int = 2_000,
    n_genes: int = 2_000,
    batch_sigma: float = 0.5,
    missing_type: int | None = 0,
    seed: int = 0,
    jobs: int = 1,
) -> dict[str, AnnData]:
    """Batches of raw counts with planted cell types, ``batch<i>`` to its cells.

    Parameters
    ----------
    n_batches
        Batches of the study.
    n_cells
        Cells drawn per batch (the last batch has fewer when it lacks a type).
    n_genes
        Genes, named as :func:`omicsprep.testing.genes.gene_names` names them.
    batch_sigma
        Standard deviation of each batch's log capture efficiency per gene.
    missing_type
        A cell type (0 to 11) the last batch lacks; ``None``: every batch has every type.
    seed
        Seed of the types' profiles and of each batch's draw.
    jobs
        Processes drawing the cells, in chunks of :data:`omicsprep.testing.generate.CHUNK`
        per batch (the same cells for any ``jobs``).

    Returns
    -------
    Each batch's cells x genes counts (CSR, float32 holding integers), barcodes
    ``<batch>-<i>``, ``obs["cell_type"]`` (``type00`` ...) and ``obs["batch"]``.
    """
    rng = np.random.default_rng(seed)
    cdfs = profiles(n_genes, rng)
    shares = np.diff(cdfs, prepend=0.0, axis=1)  # each profile's gene probabilities
    names = gene_names(n_genes)
    tasks, layout = [], []
    for index in range(n_batches):
        batch_rng = np.random.default_rng([seed, index])
        efficiency = batch_rng.lognormal(0.0, batch_sigma, n_genes)
        weighted = shares * efficiency
        batch_cdfs = np.cumsum(weighted / weighted.sum(axis=1, keepdims=True), axis=1)
        for chunk, start in enumerate(range(0, n_cells, CHUNK)):
            # The first chunk goes on with the batch's own generator (a small batch is one chunk).
            rng = batch_rng if chunk == 0 else np.random.default_rng([seed, index, chunk])
            tasks.append((min(CHUNK, n_cells - start), n_genes, batch_cdfs, rng))
            layout.append(index)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            chunks = list(pool.map(_chunk, tasks))
    else:
        chunks = [_chunk(task) for task in tasks]
    batches = {}
    for index in range(n_batches):
        batch = f"batch{index}"
        mine = [chunks[i] for i, owner in enumerate(layout) if owner == index]
        counts = sparse.vstack([part for part, _ in mine], format="csr")
        types = np.concatenate([part_types for _, part_types in mine])
        kept = np.ones(n_cells, dtype=bool)
        if missing_type is not None and index == n_batches - 1:
            kept = types != missing_type
        obs = pd.DataFrame(
            {
                "cell_type": pd.Categorical([f"type{t:02d}" for t in types[kept]], categories=TYPES),
                "batch": batch,
            },
            index=[f"{batch}-{i}" for i in np.flatnonzero(kept)],
        )
        batches[batch] = AnnData(counts[kept], obs=obs, var=pd.DataFrame(index=names))
    return batches


def _chunk(task: tuple[int, int, np.ndarray, np.random.Generator]) -> tuple[sparse.csr_matrix, np.ndarray]:
    n_cells, n_genes, cdfs, rng = task
    return chunk_counts(n_cells, n_genes, cdfs, rng)
