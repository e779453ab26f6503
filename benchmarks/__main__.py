"""``python -m benchmarks SUITE [options]``: run one benchmark suite; ``--list`` names them all.

Only the chosen suite is imported, so that a suite's imports (scanpy, RAPIDS, PyTorch) do not
slow another's start; the list reads the suites' docstrings without importing them.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_SUITES = {"__init__", "__main__", "common", "peer_scanpy"}


def suites() -> dict[str, str]:
    """Each suite's name and the first line of its docstring."""
    found = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem not in NOT_SUITES:
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            found[path.stem] = docstring.strip().splitlines()[0] if docstring.strip() else ""
    return found


def main(argv: list[str] | None = None) -> int | None:
    argv = sys.argv[1:] if argv is None else argv
    known = suites()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        width = max(map(len, known))
        print(__doc__.splitlines()[0] + "\n")
        print("\n".join(f"  {name:<{width}}  {summary}" for name, summary in known.items()))
        return None if argv else 2
    name, *rest = argv
    if name not in known:
        print(f"python -m benchmarks: no suite {name!r}; --list names them", file=sys.stderr)
        return 2
    suite = importlib.import_module(f"benchmarks.{name}")
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}",
        description=suite.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suite.add_arguments(parser)
    return suite.run(parser.parse_args(rest))


if __name__ == "__main__":
    sys.exit(main())
