"""``python -m omicsprep.pool serve N IDLE_SECONDS`` (the server) or ``worker FD`` (one worker)."""

from __future__ import annotations

import logging
import sys

from omicsprep.pool.server import serve
from omicsprep.pool.worker import serve_jobs


def main(argv: list[str]) -> None:
    """Run the server or a worker, logging to standard error (the pool's log)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if argv[0] == "serve":
        serve(n_workers=int(argv[1]), idle_seconds=float(argv[2]))
    elif argv[0] == "worker":
        serve_jobs(int(argv[1]))


main(sys.argv[1:])
