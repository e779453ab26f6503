"""``python -m omicsprep.pool serve N IDLE_SECONDS``: the server, which forks its workers."""

from __future__ import annotations

import logging
import sys

from omicsprep.pool.server import serve


def main(argv: list[str]) -> None:
    """Run the server, logging to standard error (the pool's log, its workers' too)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if argv[0] == "serve":
        serve(n_workers=int(argv[1]), idle_seconds=float(argv[2]))


main(sys.argv[1:])
