"""The pinned CPU environment installs on a fresh machine as `make setup` runs it."""

from __future__ import annotations

import re

from omicsprep.testing import CHECKOUT


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_pins_leave_out_what_make_setup_builds_without_isolation():
    """A package the Makefile installs with --no-build-isolation (umi-tools: its setup.py downloads
    setuptools when isolated) must not be pinned in requirements/cpu.txt, which pip installs first,
    isolated: `pip freeze` puts it back there when the pins are regenerated."""
    makefile = (CHECKOUT / "Makefile").read_text()
    built_apart = {normalized(name) for name in re.findall(r"--no-build-isolation\s+([A-Za-z0-9_.-]+)==", makefile)}
    assert built_apart == {"umi-tools"}
    pins = (CHECKOUT / "requirements" / "cpu.txt").read_text().splitlines()
    pinned = {normalized(line.split("==")[0]) for line in pins if "==" in line and not line.startswith("#")}
    assert not built_apart & pinned
