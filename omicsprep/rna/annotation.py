"""Cell types by CellTypist (Domínguez Conde et al. 2022): a linear model over log-normalized counts.

A CellTypist model is a logistic regression (one score per type) over its genes, the
expression scaled by the model's own means and standard deviations (and capped at 10) first.
On the CPU this runs CellTypist itself; on the GPU the same arithmetic runs on the device
in float64 (as CellTypist's does, NumPy's), in blocks of cells, and gives its labels. A
cell's label is its best-scoring type, or with majority voting the type most of its cluster
(the workflow's own Leiden clusters) was given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import scanpy as sc
from anndata import AnnData
from scipy import sparse
from scipy.special import expit

from omicsprep.backend import Backend, asnumpy, cupy, matrix_to_device
from omicsprep.errors import InputError

log = logging.getLogger(__name__)

GPU_BLOCK_CELLS = 50_000
"""Cells scored at once on the GPU (a dense float64 block of the model's genes)."""


def log_cp10k(adata: AnnData) -> AnnData:
    """The cells' raw counts (``layers["counts"]``, else ``X``) as CellTypist reads them: log1p of counts per 10,000."""
    counts = sparse.csr_matrix(asnumpy(adata.layers.get("counts", adata.X)), dtype=np.float32)
    expression = AnnData(counts, obs=pd.DataFrame(index=adata.obs_names), var=pd.DataFrame(index=adata.var_names))
    sc.pp.normalize_total(expression, target_sum=1e4)
    sc.pp.log1p(expression)
    return expression


def majority_vote(labels: pd.Series, clusters: pd.Series) -> pd.Series:
    """Each cell's cluster's most frequent label (ties: the first label in sorted order, as CellTypist)."""
    votes = pd.crosstab(labels.to_numpy(), clusters.to_numpy())
    majority = votes.idxmax(axis=0).astype(str)
    return pd.Series(majority.loc[clusters.to_numpy()].to_numpy(), index=labels.index)


def _gpu_scores(expression: AnnData, model: Any) -> np.ndarray:
    """CellTypist's decision scores (cells x types), computed on the GPU in float64."""
    cp = cupy()
    classifier, scaler = model.classifier, model.scaler
    shared = np.isin(expression.var_names, classifier.features)
    columns = pd.Index(classifier.features).get_indexer(expression.var_names[shared])
    means = cp.asarray(scaler.mean_[columns] if scaler.with_mean else np.zeros(columns.size))
    scales = cp.asarray(scaler.scale_[columns])
    coef = cp.asarray(classifier.coef_[:, columns], dtype=cp.float64)
    intercept = cp.asarray(classifier.intercept_, dtype=cp.float64)
    kept = cp.asarray(np.flatnonzero(shared))
    matrix = sparse.csr_matrix(expression.X)
    scores = np.empty((expression.n_obs, coef.shape[0]))
    # Each block sparse to the device, dense there: the host neither densifies nor selects genes.
    for start in range(0, expression.n_obs, GPU_BLOCK_CELLS):
        block = matrix_to_device(matrix[start : start + GPU_BLOCK_CELLS]).toarray()[:, kept].astype(cp.float64)
        scaled = cp.minimum((block - means) / scales, 10.0)
        scores[start : start + GPU_BLOCK_CELLS] = asnumpy(scaled @ coef.T + intercept)
    return scores


def celltypist(
    adata: AnnData, *, model: Any, clusters: str | None, backend: Backend, key_added: str = "cell_type"
) -> None:
    """Label the cells with a CellTypist model: ``obs[key_added]``, its confidence and each cell's own label.

    Parameters
    ----------
    adata
        Cells with raw counts in ``layers["counts"]`` (else ``X``), genes named as the
        model's (symbols, usually); log-normalized here as CellTypist expects.
    model
        A ``celltypist.models.Model`` (``Model.load(path)``).
    clusters
        An ``obs`` column of clusters for majority voting, or ``None`` for each cell's own
        best label.
    backend
        ``"cpu"`` (CellTypist's ``annotate``) or ``"gpu"`` (its arithmetic on the device).
    key_added
        The ``obs`` column of the types, and the start of its two companions' names.

    Raises
    ------
    InputError
        The cells share no gene with the model.

    Notes
    -----
    Writes ``obs[f"{key_added}_predicted"]`` (each cell's best-scoring type),
    ``obs[f"{key_added}_confidence"]`` (that type's probability, CellTypist's ``conf_score``) and
    ``obs[key_added]`` (the majority of the cell's cluster, or its own label).
    """
    expression = log_cp10k(adata)
    n_shared = int(np.isin(expression.var_names, model.classifier.features).sum())
    if n_shared == 0:
        raise InputError(
            f"the cells share no gene with the CellTypist model ({len(model.classifier.features)} genes, e.g. "
            f"{model.classifier.features[0]!r}; the cells' e.g. {expression.var_names[0]!r})"
        )
    log.info("CellTypist: %d of the model's %d genes in the data", n_shared, len(model.classifier.features))
    if backend == "gpu":
        scores = _gpu_scores(expression, model)
        predicted = pd.Series(model.classifier.classes_[scores.argmax(axis=1)], index=adata.obs_names)
        confidence = expit(scores.max(axis=1))
    else:
        import celltypist as celltypist_package

        result = celltypist_package.annotate(expression, model=model, majority_voting=False)
        predicted = result.predicted_labels["predicted_labels"].astype(str)
        confidence = result.probability_matrix.to_numpy().max(axis=1)
    predicted = predicted.astype(str)
    adata.obs[f"{key_added}_predicted"] = pd.Categorical(predicted.to_numpy())
    adata.obs[f"{key_added}_confidence"] = np.asarray(confidence, dtype=np.float32)
    voted = predicted if clusters is None else majority_vote(predicted, adata.obs[clusters].astype(str))
    adata.obs[key_added] = pd.Categorical(voted.to_numpy())


def add_sample_cell_types(merged: AnnData, tables: Mapping[str, pd.DataFrame]) -> None:
    """Each sample's own cell types into the merged cells' ``obs``, as ``sample_<column>``.

    Parameters
    ----------
    merged
        Merged cells named ``<sample>:<barcode>`` (:func:`omicsprep.rna.integration.concatenate_samples`).
    tables
        Sample to its cell types table (rule annotate's: indexed by barcode, ``cell_type``,
        ``cell_type_confidence``, ``cell_type_predicted``); a cell absent from its sample's
        table gets none.
    """
    stacked = pd.concat(dict(tables), names=["sample", "barcode"])
    stacked.index = [f"{sample}:{barcode}" for sample, barcode in stacked.index]
    joined = stacked.reindex(merged.obs_names)
    for column in joined:
        values = joined[column]
        merged.obs[f"sample_{column}"] = values.to_numpy() if values.dtype.kind == "f" else pd.Categorical(values)
