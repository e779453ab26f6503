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


def test_what_scib_metrics_compiles_is_kept_in_the_users_cache(tmp_path):
    """JAX's programs go to omicsprep's folder of the user's cache, however short their compile;
    umap-learn's kernels to Numba's cache. A later process loads them."""
    code = (
        "import jax, jax.numpy as jnp\n"
        "from omicsprep.jit_cache import cache_scib_compilations\n"
        "kernels = cache_scib_compilations()\n"
        "jax.jit(lambda x: x * 2.0 + 1.0)(jnp.arange(3.0)).block_until_ready()\n"
        "print(kernels, jax.config.jax_compilation_cache_dir)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    kernels, folder = result.stdout.split()
    assert int(kernels) > 10  # umap-learn's
    assert Path(folder) == tmp_path / "omicsprep" / "jax"
    assert any(Path(folder).iterdir())  # a program of milliseconds, kept
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "chosen")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split()[1] == str(tmp_path / "chosen")  # the user's folder wins


def test_umap_learn_and_pynndescent_compile_their_import_time_kernels_once_for_later_processes(tmp_path):
    """Both compile kernels as they are imported (pynndescent's distances among them: 5.5 s of each
    process on a 2-core vm); imported through cache_umap_kernels, a later process loads them from
    Numba's cache, and Numba's decorators are Numba's own again after the import."""
    code = (
        "import numba\n"
        "from omicsprep.jit_cache import cache_umap_kernels\n"
        "cache_umap_kernels()\n"
        "from pynndescent import distances\n"
        "kernel = distances.squared_euclidean\n"
        "print(type(kernel._cache).__name__, sum(kernel._cache_hits.values()), numba.njit.__module__)\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
        for _ in range(2)
    ]
    assert runs[0] == ["FunctionCache", "0", "numba.core.decorators"]  # compiled, and written to the cache
    assert runs[1][:2] == ["FunctionCache", "2"]  # both of its signatures loaded
    assert any((tmp_path / "numba").glob("pynndescent*/distances.squared_euclidean-*.nbi"))


def test_fast_array_utils_kernels_over_sparse_matrices_compile_once_for_later_processes(tmp_path):
    """fast-array-utils' classes typing SciPy's sparse matrices for Numba claim the module ``abc``:
    Numba's cache index kept them by value and a new process never found its signature again
    (7.1 s compiling in each GPU pool worker's first co-expression job). After
    name_sparse_matrix_types a second process loads the kernel; without it, it compiles again."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from scipy import sparse\n"
        "from omicsprep.jit_cache import name_sparse_matrix_types\n"
        "if sys.argv[1] == 'fixed':\n"
        "    name_sparse_matrix_types()\n"
        "from fast_array_utils import stats\n"
        "matrix = sparse.random(50, 20, density=0.3, format='csr', dtype=np.float32, random_state=0)\n"
        "means, variances = stats.mean_var(matrix, axis=1)\n"
        "assert np.allclose(means, matrix.toarray().mean(axis=1))\n"
    )
    saves = {}
    for case in ("unfixed", "fixed"):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / case), "NUMBA_DEBUG_CACHE": "1"}
        saves[case] = [
            subprocess.run(
                [sys.executable, "-c", code, case], env=env, capture_output=True, text=True, check=True
            ).stdout.count("data saved")
            for _ in range(2)
        ]
    assert saves["unfixed"][0] > 0
    assert saves["unfixed"][1] == saves["unfixed"][0]  # fast-array-utils' own: compiled again
    assert saves["fixed"] == [saves["unfixed"][0], 0]  # loaded from the cache


def test_sparse_matrix_types_are_named_only_where_scanpy_uses_fast_array_utils(monkeypatch):
    """The rules' call names the types where scanpy requires fast-array-utils (1.12), and imports nothing elsewhere."""
    import importlib.metadata

    from omicsprep import jit_cache

    for requirements, named in (
        (["fast-array-utils[accel,sparse]>=1.4", "numba>=0.57"], True),
        (["numba>=0.57"], False),
    ):
        monkeypatch.setattr(importlib.metadata, "requires", lambda name, given=requirements: given)
        jit_cache.cache_sparse_matrix_kernels.cache_clear()
        assert jit_cache.cache_sparse_matrix_kernels() is named
    jit_cache.cache_sparse_matrix_kernels.cache_clear()
    from fast_array_utils._plugins import numba_sparse

    assert all(getattr(numba_sparse, kind.__qualname__) is kind for kind in numba_sparse.TYPES)
