"""scVI and scANVI (scvi-tools): batch-corrected latent spaces learnt from the counts.

scVI (Lopez et al. 2018) models each cell's counts of the highly variable genes as negative
binomial given a latent state and its batch; scANVI (Xu et al. 2021) adds the cell types
known for some cells and predicts the others'. Both train with scvi-tools on the backend's
device: on the GPU the counts go to the device as sparse tensors per batch of cells, with
TF32 matrix products and bf16 autocast where the GPU has it (a run whose loss leaves the
finite numbers is trained again in float32).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend, asnumpy
from omicsprep.errors import InputError
from omicsprep.options import ScanviOptions, ScviOptions

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger(__name__)

UNLABELLED = "Unknown"
"""The label of a cell whose type is not known (also given to missing and empty labels)."""


def known_labels(labels: pd.Series) -> pd.Series:
    """Labels as strings, missing and empty ones (and ``Unknown``) as :data:`UNLABELLED`."""
    text = labels.astype("string").fillna(UNLABELLED).str.strip()
    return text.mask(text.isin(["", "nan", "NaN", "None"]), UNLABELLED).astype(str)


def _hvg_counts(adata: AnnData, *, batch_key: str) -> AnnData:
    """The raw counts of the highly variable genes, with the batches in ``obs["batch"]``."""
    genes = np.asarray(adata.var["highly_variable"], dtype=bool)
    counts = adata.layers.get("counts", adata.X)
    obs = pd.DataFrame({"batch": adata.obs[batch_key].astype(str).to_numpy()}, index=adata.obs_names)
    matrix = sparse.csr_matrix(asnumpy(counts)[:, genes], dtype=np.float32)
    return AnnData(matrix, obs=obs, var=adata.var.loc[genes, []])


@contextmanager
def _tf32(backend: Backend) -> Iterator[None]:
    import torch

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if backend == "gpu":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _trainer_settings(backend: Backend) -> dict[str, Any]:
    """Where and how scvi-tools trains: the GPU with sparse batches and bf16 autocast, or the CPU."""
    if backend == "cpu":
        return {"accelerator": "cpu"}
    import torch

    settings: dict[str, Any] = {"accelerator": "gpu", "devices": 1, "load_sparse_tensor": True}
    if torch.cuda.is_bf16_supported():
        settings["precision"] = "bf16-mixed"
    return settings


def _train(
    model: Any, *, max_epochs: int | None, early_stopping: bool, backend: Backend, batch_size: int = 128
) -> None:
    """Trains ``model``; again in float32 if mixed precision made the loss non-finite."""
    settings = _trainer_settings(backend)
    common = {
        "max_epochs": max_epochs,
        "early_stopping": early_stopping,
        "batch_size": batch_size,
        "enable_progress_bar": False,
    }
    with _tf32(backend):
        model.train(**common, **settings)
        losses = np.asarray(model.history["elbo_train"], dtype=float)
        if "precision" in settings and not np.isfinite(losses).all():
            log.warning("the loss left the finite numbers under bf16 autocast: training again in float32")
            del settings["precision"]
            model.train(**common, **settings)
    log.info("trained %s for %d epochs", type(model).__name__, len(model.history["elbo_train"]))


def scvi(adata: AnnData, *, batch_key: str, options: ScviOptions, seed: int, backend: Backend) -> Any:
    """Train scVI on the highly variable genes' counts; its latent means into ``obsm["X_scvi"]``.

    Parameters
    ----------
    adata
        Cells with raw counts in ``layers["counts"]`` (else ``X``) and
        ``var["highly_variable"]``.
    batch_key
        The ``obs`` column of the batches scVI corrects for.
    options
        The network's size (``n_latent``, ``n_hidden``, ``n_layers``), the counts'
        likelihood, the epochs (``None``: scvi-tools' choice by the number of cells;
        ``early_stopping`` on held-out cells' loss) and the cells per training step.
    seed
        Seed of the weights, the held-out cells and the batches' order.
    backend
        ``"cpu"`` or ``"gpu"`` (trains on the GPU).

    Returns
    -------
    The trained ``scvi.model.SCVI`` (saved by the workflow with its ``save``).
    """
    import scvi as scvi_tools

    scvi_tools.settings.seed = seed
    counts = _hvg_counts(adata, batch_key=batch_key)
    scvi_tools.model.SCVI.setup_anndata(counts, batch_key="batch")
    model = scvi_tools.model.SCVI(
        counts,
        n_latent=options.n_latent,
        n_hidden=options.n_hidden,
        n_layers=options.n_layers,
        gene_likelihood=options.gene_likelihood,
    )
    _train(
        model,
        max_epochs=options.max_epochs,
        early_stopping=options.early_stopping,
        backend=backend,
        batch_size=options.batch_size,
    )
    adata.obsm["X_scvi"] = np.asarray(model.get_latent_representation(), dtype=np.float32)
    return model


def scanvi(
    adata: AnnData, *, scvi_model: Any, label_key: str, options: ScanviOptions, seed: int, backend: Backend
) -> Any:
    """Train scANVI from a scVI model and the known labels: ``obsm["X_scanvi"]`` and predicted labels.

    Parameters
    ----------
    adata
        The cells ``scvi_model`` was trained on, with the labels in ``obs[label_key]``
        (missing, empty or ``Unknown``: not known).
    scvi_model
        :func:`scvi`'s model.
    label_key
        The ``obs`` column of the known labels; the predictions go to
        ``obs["<label_key>_scanvi"]``.
    options
        Epochs (``None``: scvi-tools' choice) and early stopping.
    seed
        Seed of the training.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The trained ``scvi.model.SCANVI``.

    Raises
    ------
    InputError
        No cell has a known label.
    """
    import scvi as scvi_tools

    labels = known_labels(adata.obs[label_key])
    if (labels == UNLABELLED).all():
        raise InputError(f"scANVI needs known labels; obs[{label_key!r}] has none")
    scvi_tools.settings.seed = seed
    counts = scvi_model.adata
    counts.obs["label"] = labels.to_numpy()
    model = scvi_tools.model.SCANVI.from_scvi_model(scvi_model, unlabeled_category=UNLABELLED, labels_key="label")
    _train(model, max_epochs=options.max_epochs, early_stopping=options.early_stopping, backend=backend)
    adata.obsm["X_scanvi"] = np.asarray(model.get_latent_representation(), dtype=np.float32)
    adata.obs[f"{label_key}_scanvi"] = pd.Categorical(model.predict())
    return model
