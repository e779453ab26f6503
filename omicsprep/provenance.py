"""What produced an output: backend, library versions, parameters and step timings."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from anndata import AnnData

from omicsprep.backend import Backend, module_versions, synchronize
from omicsprep.timings import phase_seconds

log = logging.getLogger(__name__)


class StepTimer:
    """Times named steps of a rule; waits for the GPU so device time is counted."""

    def __init__(self, *, backend: Backend) -> None:
        self.backend = backend
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the enclosed block as step ``name`` and log it.

        A GPU library imported by its first use inside the step is left out: those seconds
        are the rule's ``gpu_import`` phase (:mod:`omicsprep.timings`).
        """
        imports_before = phase_seconds().get("gpu_import", 0.0)
        start = time.perf_counter()
        yield
        synchronize(backend=self.backend)
        imported = phase_seconds().get("gpu_import", 0.0) - imports_before
        self.seconds[name] = round(time.perf_counter() - start - imported, 4)
        log.info("step %-12s %8.3f s", name, self.seconds[name])


def record_provenance(
    adata: AnnData,
    *,
    rule: str,
    backend: Backend,
    params: Mapping[str, Any],
    timings: Mapping[str, float],
    adapted: Mapping[str, Any] | None = None,
) -> None:
    """Store, under ``uns["omicsprep"][rule]``, how this rule produced ``adata``.

    Parameters
    ----------
    adata
        The rule's output.
    rule
        The rule's name.
    backend
        The backend that ran.
    params
        The configuration the rule used (stored as JSON text).
    timings
        Seconds per step, from :class:`StepTimer`.
    adapted
        Settings the data made the rule change, each with the value asked and the one used
        (``params`` holds the one used); stored as JSON text.
    """
    record = {
        "backend": backend,
        "versions": module_versions(backend=backend),
        "params": json.dumps(params, sort_keys=True, default=str),
        "timings": dict(timings),
        "adapted": json.dumps(adapted or {}, sort_keys=True, default=str),
    }
    adata.uns.setdefault("omicsprep", {})[rule] = record
