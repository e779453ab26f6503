"""scvi-tools' training plans with what a step logs handed to Lightning once per epoch.

scvi-tools logs the loss and each ELBO term at every step, and Lightning's ``self.log``
costs about half a millisecond of Python per call: some 3 ms a step, as long as the step's
arithmetic on a GPU with batches of 1,024 to 4,096 cells. The plans here run scvi-tools' own steps; the
values they log are summed on the device as Lightning would average them (weighted by the
batch's cells) and logged at the epoch's end, so the history, early stopping and learning-rate
schedule see the same epoch values. Values logged per step only (the KL weight) are dropped.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.data import extract_batch_size
from torchmetrics import Metric


class EpochLogging(LightningModule):
    """Mixin before a scvi-tools training plan (a LightningModule): its steps' logs held, logged per epoch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step_batch: Any = None
        self._stage = ""
        # Per stage (validation runs inside a training epoch): name -> (sum or Metric, cells, log settings).
        self._held: dict[str, dict[str, tuple[Any, Any, dict[str, Any]]]] = {"train": {}, "validation": {}}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """The plan's training step, its logged values held."""
        return self._holding_logs(super().training_step, batch, batch_idx, stage="train")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """The plan's validation step, its logged values held."""
        return self._holding_logs(super().validation_step, batch, batch_idx, stage="validation")

    def _holding_logs(self, step: Any, batch: Any, batch_idx: int, *, stage: str) -> Any:
        self._step_batch, self._stage = batch, stage
        try:
            return step(batch, batch_idx)
        finally:
            self._step_batch = None

    def log(self, name: str, value: Any, *args: Any, **settings: Any) -> None:
        """Within a step, hold ``value`` for the epoch's end (Lightning's weighted mean); else log it."""
        if self._step_batch is None or args:  # an epoch-end hook's own value (or settings by position)
            super().log(name, value, *args, **settings)
            return
        settings.pop("on_step", None)
        on_epoch, batch_size = settings.pop("on_epoch", None), settings.pop("batch_size", None)
        if not on_epoch:  # a value of the step alone (scvi-tools sets on_epoch in every log)
            return
        held = self._held[self._stage]
        if isinstance(value, Metric):  # updated by the step itself; Lightning would compute it at the end
            held[name] = (value, None, settings)
            return
        weight = batch_size if batch_size is not None else extract_batch_size(self._step_batch)
        value = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        total, cells, _ = held.get(name, (0.0, 0, settings))
        held[name] = (total + value.float() * weight, cells + weight, settings)

    def on_train_epoch_end(self) -> None:
        """Log the training steps' values, then the plan's own hook."""
        self._log_held("train")
        super().on_train_epoch_end()

    def on_validation_epoch_end(self) -> None:
        """Log the validation steps' values, then the plan's own hook."""
        self._log_held("validation")
        super().on_validation_epoch_end()

    def _log_held(self, stage: str) -> None:
        held, self._held[stage] = self._held[stage], {}
        # Every value before any reset: the ELBO metric is the sum of the others and resets them with it.
        values = {name: total.compute() if isinstance(total, Metric) else total / cells
                  for name, (total, cells, _) in held.items()}  # fmt: skip
        for name, (total, _, settings) in held.items():
            if isinstance(total, Metric):
                total.reset()
            super().log(name, values[name], on_step=False, on_epoch=True, **settings)


@cache
def logging_per_epoch(plan: type) -> type:
    """``plan`` (a scvi-tools training plan class) with :class:`EpochLogging` before it."""
    return type(f"{plan.__name__}LoggingPerEpoch", (EpochLogging, plan), {})
