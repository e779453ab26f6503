"""The package's shape: no module imports one that imports it back, however indirectly; its command's help."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

import omicsprep
from omicsprep.cli import command_parser, main

PACKAGE = Path(omicsprep.__file__).parent


def module_names() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere: at the top, inside functions, for type checking."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other (strongly connected components of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while (other := stack.pop()) != module:
                group.append(other)
            if group:
                cycles.append(sorted([module, *group]))

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_itself_back():
    modules = module_names()
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 40 and graph["omicsprep.jobs"] >= {"omicsprep.pool", "omicsprep.errors"}
    assert import_cycles(graph) == []


def test_a_circle_of_imports_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_the_command_tells_its_version_and_every_option_its_meaning_and_default(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"omicsprep {omicsprep.__version__}"
    commands = next(a for a in command_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == {"count-umis", "coexpr", "warm-kernels"}
    for name, subparser in commands.choices.items():
        options = [a for a in subparser._actions if not isinstance(a, argparse._HelpAction)]
        assert all(action.help for action in options), (name, [a.dest for a in options if not a.help])
        text = subparser.format_help()
        assert "(default: CB)" in text if name == "count-umis" else "(default: auto)" in text
