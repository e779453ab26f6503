"""scVI and scANVI (scvi-tools): batch-corrected latent spaces learnt from the counts.

scVI (Lopez et al. 2018) models each cell's counts of the highly variable genes as negative
binomial given a latent state and its batch; scANVI (Xu et al. 2021) adds the cell types
known for some cells and predicts the others'. Both train with scvi-tools on the backend's
device. On the CPU with scvi-tools' own data loading and settings. On the GPU the counts go
to the device once (:mod:`omicsprep.rna.resident_batches`), in batches of 4096 cells (from
100,000 cells on) with the learning rate scaled to them, TF32 matrix products and bf16 autocast
where the GPU has it (a run whose loss leaves the finite numbers is trained again in float32). On both, what a
step logs reaches Lightning once per epoch (:mod:`omicsprep.rna.epoch_logging`).
"""

from __future__ import annotations

import logging
import math
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


def hvg_counts(adata: AnnData, *, batch_key: str) -> AnnData:
    """What scVI trains on: the highly variable genes' raw counts (CSR float32), the batches in ``obs["batch"]``."""
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


GPU_BATCH_SIZE, GPU_BATCH_FROM_CELLS = 4096, 100_000
"""Cells per step on the GPU when ``batch_size`` is not set, from this many cells on
(scvi-tools' 128 on the CPU and for fewer cells, whose epochs are short anyway). A step's
time is the host launching small kernels, 14-18 ms on an H100 from 1,024 to 4,096 cells: at
a million cells 4,096 trained in 31 s where 1,024 took 114 s, with a held-out ELBO as good as
scvi-tools' defaults' (benchmarks/RESULTS.md, the atlas steps)."""

INFERENCE_BATCH_SIZE = 8192
"""Cells per step of the trained models' latent means and predictions (scvi-tools' 128 makes
thousands of small steps at a million cells; the result does not depend on it)."""

REFERENCE_BATCH_SIZE, REFERENCE_LEARNING_RATE = 128, 1e-3
"""scvi-tools' defaults, which the learning rate of other batch sizes is scaled from."""


def training_steps(options: ScviOptions, *, n_cells: int, backend: Backend) -> tuple[int, float]:
    """Cells per step and Adam's learning rate: ``options``' or chosen by backend and cells.

    The batch size defaults to scvi-tools' 128, and on the GPU to :data:`GPU_BATCH_SIZE`
    from :data:`GPU_BATCH_FROM_CELLS` cells on; the learning rate to 1e-3 x sqrt(batch size
    / 128), Adam's square-root scaling rule (Malladi et al. 2022), which keeps the epochs of
    scvi-tools' choice fitting.
    """
    large = backend == "gpu" and n_cells >= GPU_BATCH_FROM_CELLS
    batch_size = options.batch_size or (GPU_BATCH_SIZE if large else REFERENCE_BATCH_SIZE)
    learning_rate = options.learning_rate or REFERENCE_LEARNING_RATE * math.sqrt(batch_size / REFERENCE_BATCH_SIZE)
    return batch_size, learning_rate


def _train(
    model: Any,
    *,
    max_epochs: int | None,
    early_stopping: bool,
    steps: tuple[int, float],
    seed: int,
    backend: Backend,
    unlabelled_code: int | None = None,
) -> dict[str, Any]:
    """Trains ``model``; on the GPU from device-resident data, again in float32 if bf16 made the loss non-finite.

    Either way with scvi-tools' training plan logging per epoch rather than per step (the same
    history; a step's logging costs as long as its arithmetic on a GPU). Returns the keyword
    arguments that give the trained model's latent means and predictions every cell in order:
    on the GPU, batches of the data already on the device.
    """
    from omicsprep.rna.epoch_logging import logging_per_epoch

    # scvi-tools' way to choose a model's plan: its class attribute (an instance's shadows it here).
    model._training_plan_cls = logging_per_epoch(type(model)._training_plan_cls)  # noqa: SLF001
    batch_size, learning_rate = steps
    common: dict[str, Any] = {
        "max_epochs": max_epochs,
        "early_stopping": early_stopping,
        "plan_kwargs": {"lr": learning_rate},
        "enable_progress_bar": False,
    }
    if backend == "cpu":
        model.train(**common, batch_size=batch_size, accelerator="cpu")
        _log_trained(model)
        return {"batch_size": INFERENCE_BATCH_SIZE}
    import torch

    from omicsprep.rna.resident_batches import ResidentDataModule

    data = ResidentDataModule(
        model, batch_size=batch_size, seed=seed, device=torch.device("cuda"),
        labelled=unlabelled_code is not None, unlabelled_code=unlabelled_code,
    )  # fmt: skip
    settings: dict[str, Any] = {"accelerator": "gpu", "devices": 1, "datamodule": data}
    if torch.cuda.is_bf16_supported():
        settings["precision"] = "bf16-mixed"
    with _tf32(backend):
        model.train(**common, **settings)
        losses = np.asarray(model.history["elbo_train"], dtype=float)
        if "precision" in settings and not np.isfinite(losses).all():
            log.warning("the loss left the finite numbers under bf16 autocast: training again in float32")
            del settings["precision"]
            model.train(**common, **settings)
    _log_trained(model)
    return {"dataloader": data.every_cell(batch_size=INFERENCE_BATCH_SIZE)}


def _log_trained(model: Any) -> None:
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
        ``early_stopping`` on held-out cells' loss), the cells per training step and the
        learning rate (:func:`training_steps`).
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
    counts = hvg_counts(adata, batch_key=batch_key)
    scvi_tools.model.SCVI.setup_anndata(counts, batch_key="batch")
    model = scvi_tools.model.SCVI(
        counts,
        n_latent=options.n_latent,
        n_hidden=options.n_hidden,
        n_layers=options.n_layers,
        gene_likelihood=options.gene_likelihood,
    )
    every_cell = _train(
        model,
        max_epochs=options.max_epochs,
        early_stopping=options.early_stopping,
        steps=training_steps(options, n_cells=adata.n_obs, backend=backend),
        seed=seed,
        backend=backend,
    )
    latent_means = model.get_latent_representation(**every_cell)
    adata.obsm["X_scvi"] = np.asarray(latent_means, dtype=np.float32)
    return model


def scanvi(
    adata: AnnData,
    *,
    scvi_model: Any,
    label_key: str,
    options: ScanviOptions,
    steps: tuple[int, float],
    seed: int,
    backend: Backend,
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
    steps
        Cells per step and learning rate, as scVI's (:func:`training_steps`).
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
    # The scVI model's counts with the labels beside, leaving the scVI model's own AnnData as it was.
    counts = AnnData(scvi_model.adata.X, obs=scvi_model.adata.obs.assign(label=labels.to_numpy()))
    counts.var_names = scvi_model.adata.var_names
    model = scvi_tools.model.SCANVI.from_scvi_model(
        scvi_model, adata=counts, unlabeled_category=UNLABELLED, labels_key="label"
    )
    categories = list(model.adata_manager.get_state_registry("labels").categorical_mapping)
    every_cell = _train(
        model,
        max_epochs=options.max_epochs,
        early_stopping=options.early_stopping,
        steps=steps,
        seed=seed,
        backend=backend,
        unlabelled_code=categories.index(UNLABELLED),
    )
    adata.obsm["X_scanvi"] = np.asarray(model.get_latent_representation(**every_cell), dtype=np.float32)
    adata.obs[f"{label_key}_scanvi"] = pd.Categorical(model.predict(**every_cell))
    return model
