"""Training batches cut from counts that stay on the GPU: scvi-tools' data loading without its copies.

scvi-tools' own loader slices a host AnnData per step and copies each batch to the device,
which leaves a GPU mostly waiting (scvi-tools #1058, #3176). Here the registered counts, batch
and label codes go to the device once; each epoch shuffles indices there and each step
gathers its rows by indexing, so a step is the model's arithmetic alone. The counts stay
dense when they fit comfortably in the device's free memory, else as CSR, whose rows are
gathered and densified per step.

The module is torch-only and device-agnostic (the tests run it on CPU tensors); the model
code in :mod:`omicsprep.rna.latent` decides when to use it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from scipy import sparse

if TYPE_CHECKING:
    from collections.abc import Iterator

DENSE_SHARE_OF_FREE_MEMORY = 0.25
"""Counts go dense on the device when that takes at most this share of its free memory."""

VALIDATION_SHARE = 0.1
"""Cells held out for the validation loss (early stopping), as scvi-tools' default split."""


class ResidentCounts:
    """Cells x genes counts on a device, dense or CSR, with rows gathered as a dense batch."""

    def __init__(self, counts: sparse.csr_matrix | np.ndarray, *, device: torch.device, dense: bool) -> None:
        self.n_genes = counts.shape[1]
        self.dense: torch.Tensor | None = None
        if dense:
            self.dense = _dense_on(counts, device=device)
            return
        csr = sparse.csr_matrix(counts)
        self.indptr = torch.from_numpy(csr.indptr.astype(np.int64)).to(device)
        self.indices = torch.from_numpy(csr.indices.astype(np.int64)).to(device)
        self.values = torch.from_numpy(csr.data.astype(np.float32, copy=False)).to(device)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The rows ``index`` as a dense float32 matrix."""
        if self.dense is not None:
            return self.dense[index]
        starts, ends = self.indptr[index], self.indptr[index + 1]
        lengths = ends - starts
        batch_row = torch.repeat_interleave(torch.arange(index.numel(), device=index.device), lengths)
        first_of_row = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        source = torch.repeat_interleave(starts, lengths) + torch.arange(batch_row.numel(), device=index.device)
        source -= first_of_row
        out = torch.zeros(index.numel(), self.n_genes, dtype=torch.float32, device=index.device)
        out[batch_row, self.indices[source]] = self.values[source]
        return out


def _dense_on(counts: sparse.csr_matrix | np.ndarray, *, device: torch.device, rows: int = 65_536) -> torch.Tensor:
    """Counts densified on ``device`` a block of rows at a time (the host holds one dense block at most)."""
    out = torch.empty(counts.shape, dtype=torch.float32, device=device)
    for start in range(0, counts.shape[0], rows):
        block = counts[start : start + rows]
        dense = sparse.csr_matrix(block).toarray() if sparse.issparse(block) else np.asarray(block)
        out[start : start + rows] = torch.from_numpy(dense.astype(np.float32, copy=False)).to(device)
    return out


def fits_dense(n_cells: int, n_genes: int, *, device: torch.device) -> bool:
    """Whether dense float32 counts take at most :data:`DENSE_SHARE_OF_FREE_MEMORY` of the device's free memory."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return n_cells * n_genes * 4 <= DENSE_SHARE_OF_FREE_MEMORY * free


class ResidentBatches:
    """An epoch's batches of ``indices`` (shuffled or in order) as scvi-tools' tensor dicts.

    With ``labelled`` (indices of cells with a known label), each step yields scvi-tools'
    semi-supervised pair: the batch, and as many labelled cells taken in turn from a
    shuffled cycle of them.
    """

    def __init__(
        self,
        counts: ResidentCounts,
        codes: dict[str, torch.Tensor],
        indices: torch.Tensor,
        *,
        batch_size: int,
        generator: torch.Generator | None,
        labelled: torch.Tensor | None = None,
    ) -> None:
        self.counts, self.codes, self.indices = counts, codes, indices
        self.batch_size, self.generator, self.labelled = batch_size, generator, labelled

    def __len__(self) -> int:
        return len(self._starts())

    def _starts(self) -> range:
        # In training, a last batch of fewer than 3 cells is dropped, as scvi-tools does (BatchNorm
        # in training mode needs more than one); in order (validation, inference) every cell counts.
        n = self.indices.numel()
        small = n % self.batch_size < 3 and n >= self.batch_size and self.generator is not None
        return range(0, n - n % self.batch_size if small else n, self.batch_size)

    def _tensors(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"X": self.counts.rows(rows), **{key: codes[rows] for key, codes in self.codes.items()}}

    def _shuffled(self, indices: torch.Tensor) -> torch.Tensor:
        return indices[torch.randperm(indices.numel(), device=indices.device, generator=self.generator)]

    def __iter__(self) -> Iterator[Any]:
        order = self.indices if self.generator is None else self._shuffled(self.indices)
        cycle = None if self.labelled is None else self._shuffled(self.labelled)
        for step, start in enumerate(self._starts()):
            rows = order[start : start + self.batch_size]
            if cycle is None:
                yield self._tensors(rows)
                continue
            taken = torch.arange(step * rows.numel(), (step + 1) * rows.numel(), device=rows.device) % cycle.numel()
            yield [self._tensors(rows), self._tensors(cycle[taken])]


class ResidentDataModule(LightningDataModule):
    """A scvi-tools model's registered data on a device, split into training and validation cells.

    Parameters
    ----------
    model
        A scvi-tools model set up on its AnnData (SCVI or SCANVI).
    batch_size
        Cells per step.
    seed
        Seed of the split and of the batches' order.
    device
        Where the data lives (the training's device).
    dense
        Dense counts on the device (else CSR); ``None``: dense when :func:`fits_dense`.
    labelled
        Codes of cells with a known label yield semi-supervised pairs (scANVI): the
        registry's label codes other than ``unlabelled_code``.
    unlabelled_code
        The label code of cells without a known label (scANVI's unlabelled category).
    """

    def __init__(
        self,
        model: Any,
        *,
        batch_size: int,
        seed: int,
        device: torch.device,
        dense: bool | None = None,
        labelled: bool = False,
        unlabelled_code: int | None = None,
    ) -> None:
        super().__init__()
        manager = model.adata_manager
        counts = manager.get_from_registry("X")
        n_cells, n_genes = counts.shape
        dense = fits_dense(n_cells, n_genes, device=device) if dense is None else dense
        self.counts = ResidentCounts(counts, device=device, dense=dense)
        self.codes = {
            key: torch.from_numpy(np.asarray(manager.get_from_registry(key)).astype(np.int64)).to(device)
            for key in ("batch", "labels")
        }
        order = np.random.default_rng(seed).permutation(n_cells)
        n_val = math.floor(VALIDATION_SHARE * n_cells)
        self.val_idx, self.train_idx, self.test_idx = np.sort(order[:n_val]), np.sort(order[n_val:]), np.array([], int)
        self.n_val, self.n_train, self.n_obs = n_val, n_cells - n_val, n_cells
        self.batch_size, self.device_, self.seed = batch_size, device, seed
        self.labelled: torch.Tensor | None = None
        if labelled:
            train = torch.from_numpy(self.train_idx).to(device)
            self.labelled = train[self.codes["labels"][train, 0] != unlabelled_code]

    def train_dataloader(self) -> ResidentBatches:
        """The training cells in a new order each epoch."""
        generator = torch.Generator(device=self.device_).manual_seed(self.seed)
        return ResidentBatches(
            self.counts, self.codes, torch.from_numpy(self.train_idx).to(self.device_),
            batch_size=self.batch_size, generator=generator, labelled=self.labelled,
        )  # fmt: skip

    def val_dataloader(self) -> ResidentBatches:
        """The validation cells in order."""
        indices = torch.from_numpy(self.val_idx).to(self.device_)
        return ResidentBatches(self.counts, self.codes, indices, batch_size=self.batch_size, generator=None)

    def every_cell(self, *, batch_size: int) -> ResidentBatches:
        """Every cell in order, for the trained model's latent means and predictions (``dataloader=``)."""
        indices = torch.arange(self.n_obs, device=self.device_)
        return ResidentBatches(self.counts, self.codes, indices, batch_size=batch_size, generator=None)
