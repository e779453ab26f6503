"""Many samples as one: concatenation, batch correction (Harmony, scVI, scANVI) and integration metrics."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import anndata as ad
import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse
from sklearn.metrics import adjusted_rand_score

from omicsprep.backend import Backend, matrix_to_device, rapids_singlecell, stacked_rows, with_columns_at
from omicsprep.errors import InputError
from omicsprep.options import parse_cluster_key

log = logging.getLogger(__name__)


def concatenate_samples(samples: Mapping[str, AnnData], *, labels: str | None = None, backend: Backend) -> AnnData:
    """One AnnData of every sample's cells: raw counts, genes joined outer, ``obs["sample"]``.

    A gene absent from a sample counts zero there. Barcodes become ``<sample>:<barcode>``,
    unique across samples. Every per-cell column of the samples is kept (sheet metadata,
    the input's own columns, QC metrics, doublets, ambient fractions; missing where a sample
    lacks it); each sample's own clusters become ``sample_<key>`` (``sample_leiden_1.0``),
    their labels prefixed with the sample, so that the merged clusters take the plain names.
    Of ``var``, the columns that describe a gene alike in every sample that has it (gene ids,
    feature types, gene groups) are kept; per-sample statistics are not. On the GPU each
    sample's counts go to the device as the sample is taken from ``samples``: with a mapping
    that reads each when asked (:class:`omicsprep.io.H5adSamples`), host memory holds one
    sample's counts at a time.

    Parameters
    ----------
    samples
        Sample name to its cells, raw counts in ``layers["counts"]`` when present, else
        in ``X``; taken once each, in order.
    labels
        A per-sample ``obs`` column to keep as ``obs["sample_clusters"]`` (prefixed with
        the sample), e.g. each sample's own clusters for the label-conservation metric.
    backend
        ``"cpu"`` (the counts in host memory) or ``"gpu"`` (on the GPU: one CuPy matrix, or
        row blocks beyond its 32-bit indices, :func:`omicsprep.backend.to_device`).

    Returns
    -------
    Cells x genes, CSR counts (float32); ``uns["merge"]["genes_missing"]`` counts, per sample,
    the genes it lacks.

    Raises
    ------
    InputError
        The samples share no gene (other species, or genes named otherwise).
    """
    parts, counts, gene_tables = {}, {}, []
    for name, adata in samples.items():
        obs = adata.obs.drop(columns=["sample"], errors="ignore")
        clusters = [key for key in obs if parse_cluster_key(key)]
        if labels is not None:
            obs["sample_clusters"] = name + ":" + adata.obs[labels].astype(str)
        obs = obs.rename(columns={key: f"sample_{key}" for key in clusters})
        for key in clusters:
            obs[f"sample_{key}"] = pd.Categorical(name + ":" + obs[f"sample_{key}"].astype(str))
        parts[name] = AnnData(obs=obs, var=pd.DataFrame(index=adata.var_names))
        gene_tables.append(adata.var)
        matrix = sparse.csr_matrix(adata.layers.get("counts", adata.X), dtype=np.float32)
        counts[name] = matrix_to_device(matrix) if backend == "gpu" else matrix
        del adata, matrix  # before the next sample is read
    shared = set.intersection(*(set(part.var_names) for part in parts.values()))
    if len(parts) > 1 and not shared:
        sizes = ", ".join(f"{name} {part.n_vars} (e.g. {part.var_names[0]!r})" for name, part in parts.items())
        raise InputError(
            f"the samples share no gene ({sizes}): a merge of them would mean nothing; check that they are "
            "of one species and name their genes alike (symbols or ids)"
        )
    merged = ad.concat(parts, join="outer", label="sample", index_unique=":")  # cells and genes; counts below
    merged.obs_names = [
        f"{sample}:{barcode.rsplit(':', 1)[0]}"
        for sample, barcode in zip(merged.obs["sample"], merged.obs_names, strict=True)
    ]
    merged.X = stacked_rows(
        [
            with_columns_at(counts.pop(name), merged.var_names.get_indexer(part.var_names), n_columns=merged.n_vars)
            for name, part in parts.items()
        ]
    )
    merged.var = shared_gene_columns(gene_tables, genes=merged.var_names)
    merged.uns["merge"] = {"genes_missing": {name: int(merged.n_vars - part.n_vars) for name, part in parts.items()}}
    log.info(
        "merged %d samples: %d cells x %d genes, %d of them in every sample; genes missing per sample %s",
        len(parts),
        merged.n_obs,
        merged.n_vars,
        len(shared),
        merged.uns["merge"]["genes_missing"],
    )
    return merged


# Statistics of one sample's cells that scanpy and rapids-singlecell keep in var: not a merged gene's.
PER_SAMPLE_GENE_STATISTICS = frozenset(
    {
        "n_cells",
        "n_cells_by_counts",
        "mean_counts",
        "log1p_mean_counts",
        "pct_dropout_by_counts",
        "total_counts",
        "log1p_total_counts",
        "highly_variable",
        "highly_variable_rank",
        "highly_variable_nbatches",
        "highly_variable_intersection",
        "means",
        "variances",
        "variances_norm",
        "dispersions",
        "dispersions_norm",
        "mean",
        "std",
    }
)


def shared_gene_columns(tables: list[pd.DataFrame], *, genes: pd.Index) -> pd.DataFrame:
    """The samples' ``var`` columns that describe a gene alike in every sample that has it, for ``genes``.

    Gene ids, feature types and gene-group flags are kept; statistics of each sample's cells
    (:data:`PER_SAMPLE_GENE_STATISTICS`, or any column two samples give differently for one
    gene) are left out.
    """
    stacked = pd.concat(tables)
    kept = {}
    for column in stacked.columns.difference(PER_SAMPLE_GENE_STATISTICS, sort=False):
        values = stacked[column].dropna()
        per_gene = values.groupby(level=0, sort=False)
        if not values.empty and per_gene.nunique().max() <= 1:
            kept[column] = per_gene.first()
    return pd.DataFrame(kept, index=genes) if kept else pd.DataFrame(index=genes)


def harmony(adata: AnnData, *, key: str, theta: float, max_iter: int, seed: int, backend: Backend) -> None:
    """Harmony (Korsunsky et al. 2019) on ``obsm["X_pca"]`` into ``obsm["X_harmony"]``.

    rapids-singlecell's ``harmony_integrate`` on the GPU, harmonypy on the CPU.

    Parameters
    ----------
    adata
        Cells with ``obsm["X_pca"]`` and the batches in ``obs[key]``.
    key
        The ``obs`` column to correct for.
    theta
        Diversity penalty (higher: more mixing).
    max_iter
        Harmony iterations at most.
    seed
        Seed of Harmony's k-means.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    if backend == "gpu":
        rapids_singlecell().pp.harmony_integrate(
            adata, key, basis="X_pca", adjusted_basis="X_harmony", theta=theta, max_iter_harmony=max_iter, rng=seed
        )
        return
    import harmonypy

    result = harmonypy.run_harmony(
        np.asarray(adata.obsm["X_pca"]),
        adata.obs[[key]],
        [key],
        theta=theta,
        max_iter_harmony=max_iter,
        random_state=seed,
    )
    adata.obsm["X_harmony"] = np.asarray(result.Z_corr, dtype=np.float32)  # cells x PCs (harmonypy 2)


def batch_mixing(adata: AnnData, *, key: str) -> float:
    """Mean entropy of the batches among each cell's neighbours, relative to the batches' overall shares.

    The neighbours are those of ``obsp["distances"]``. 1 when every neighbourhood mixes the
    batches as the whole data does, 0 when none mixes.
    """
    batches = pd.Categorical(adata.obs[key])
    graph = sparse.csr_matrix(adata.obsp["distances"])
    rows = np.repeat(np.arange(adata.n_obs), np.diff(graph.indptr))
    counts = sparse.csr_matrix(
        (np.ones(graph.nnz), (rows, batches.codes[graph.indices])), shape=(adata.n_obs, len(batches.categories))
    ).toarray()
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    entropy = -(share * np.log(np.where(share > 0, share, 1))).sum(axis=1)
    overall = np.bincount(batches.codes) / len(batches.codes)
    expected = -(overall * np.log(overall)).sum()
    return float(entropy.mean() / expected) if expected > 0 else 1.0


def label_conservation(adata: AnnData, *, clusters: str, labels: str = "sample_clusters") -> float:
    """Mean over samples of the adjusted Rand index between the merged clusters and the sample's own.

    How much of each sample's structure survives integration.
    """
    scores = [
        adjusted_rand_score(group[labels], group[clusters]) for _, group in adata.obs.groupby("sample", observed=True)
    ]
    return float(np.mean(scores))
