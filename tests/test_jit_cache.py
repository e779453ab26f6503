"""Numba's on-disk caches of omicsprep's functions follow every module of the package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omicsprep import jit_cache

CALLER = """
import sys
from pathlib import Path

if sys.argv[1:] == ["tracked"]:
    from omicsprep.jit_cache import track_sources

    track_sources(Path(__file__).parent)
import numba
from kernel import value


@numba.njit(cache=True)
def caller():
    return value()


print(caller())
"""
KERNEL = "import numba\n\n\n@numba.njit(cache=True)\ndef value():\n    return {}\n"


def run_after_editing_the_kernel(folder: Path, mode: str) -> list[str]:
    """What a cached function calling another module's kernel returns, before and after the kernel's edit.

    Each run is a fresh process with the same cache folder, as a rule's is.
    """
    folder.mkdir()
    (folder / "caller.py").write_text(CALLER)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(folder / "cache")}
    printed = []
    for returned in (1, 2):
        (folder / "kernel.py").write_text(KERNEL.format(returned))
        run = subprocess.run(
            [sys.executable, "caller.py", mode], cwd=folder, capture_output=True, text=True, env=env, check=True
        )
        printed.append(run.stdout.strip())
    assert any((folder / "cache").rglob("*caller*.nbi"))  # the caller's machine code was cached and looked up
    return printed


def test_an_edited_kernel_is_compiled_anew_in_a_tracked_caller(tmp_path):
    # Numba alone keeps the caller's old machine code: its own file did not change.
    assert run_after_editing_the_kernel(tmp_path / "numba", "plain") == ["1", "1"]
    assert run_after_editing_the_kernel(tmp_path / "tracked", "tracked") == ["1", "2"]


def test_the_package_modules_are_tracked():
    from numba.core import caching

    import omicsprep.reads.umi  # noqa: F401 - its kernels' caches are keyed as it imports

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    roots = [getattr(locator, "tracked_root", None) for locator in impl._locator_classes]
    assert roots[: len(jit_cache.LOCATORS)] == [jit_cache.PACKAGE.resolve()] * len(jit_cache.LOCATORS)
    assert len(jit_cache.sources_digest(jit_cache.PACKAGE)) == 64
