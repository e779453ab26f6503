"""Plumbing shared by the workflow's scripts: logging to the rule's log, clear errors."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from omicsprep.errors import BackendUnavailableError, InputError

log = logging.getLogger("omicsprep")


def run_script(main: Callable[[], None], *, log_path: str | Path, sample: str | None = None) -> None:
    """Run a rule's script body with logging to ``log_path`` and one-line user errors.

    Everything the libraries print goes to the log. Bad input and an unusable backend end
    the rule with a single message naming the sample, the file and the problem, on the
    console and in the log; anything else keeps its traceback, in the log.
    """
    console = sys.__stderr__
    log_file = open(log_path, "w", buffering=1)  # noqa: SIM115 - lives as long as the process
    sys.stderr = log_file
    logging.basicConfig(
        stream=log_file, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    logging.captureWarnings(True)
    try:
        main()
    except (InputError, BackendUnavailableError) as exc:
        if isinstance(exc, InputError) and exc.sample is None and sample is not None:
            exc = exc.for_sample(sample)
        log.error("%s", exc)
        print(f"omicsprep error: {exc}", file=console)
        sys.exit(1)
    except Exception:
        log.exception("failed")
        raise
