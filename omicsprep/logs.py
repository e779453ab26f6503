"""The root logger's handlers and level, taken before code that replaces them and given back after."""

from __future__ import annotations

import logging


def root_logging() -> tuple[list[logging.Handler], int]:
    """The root logger's handlers and level now, for :func:`restore_root_logging`."""
    root = logging.getLogger()
    return list(root.handlers), root.level


def restore_root_logging(handlers: list[logging.Handler], level: int) -> None:
    """Give the root logger back ``handlers`` and ``level``; close the handlers added since."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
