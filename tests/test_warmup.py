"""``omicsprep warm-kernels``: a fresh machine's kernels compiled once, before its first run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from omicsprep.warmup import generated_counts


def test_generated_sample_looks_like_read_counts():
    adata = generated_counts(n_cells=500, n_genes=400, seed=3)
    assert adata.shape == (500, 400)
    assert adata.X.dtype == np.float32 and adata.X.indices.dtype == np.int32
    assert np.array_equal(adata.X.data, np.round(adata.X.data)) and adata.X.data.min() > 0
    assert adata.var_names[0] == "MT-CO1" and adata.obs_names.is_unique and adata.var_names.is_unique
    counts = np.asarray(adata.X.sum(axis=1)).ravel()
    assert 100 < np.median(counts) < 10_000  # cells pass the usual QC thresholds
    assert np.array_equal(generated_counts(n_cells=500, n_genes=400, seed=3).X.toarray(), adata.X.toarray())


def warm(backend: str) -> None:
    """Run the command with the machine's kernel caches."""
    command = [sys.executable, "-m", "omicsprep.cli", "warm-kernels", "--backend", backend]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{backend} kernels of qc and cluster compiled and cached" in result.stderr


def test_cpu_kernels_are_compiled():
    # With the machine's caches, which earlier tests have filled (from empty ones, as on a
    # fresh machine, Numba's compilations take a minute on 2 cores).
    warm("cpu")


@pytest.mark.gpu
def test_gpu_kernels_are_cached():
    # With the machine's caches, which the GPU tests before this one have filled: the
    # command's run on a fresh machine is what benchmarks/e2e.py --cold --setup measures.
    warm("gpu")
    cache = Path(os.environ.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))
    assert sum(path.is_file() for path in cache.rglob("*")) >= 10  # rapids-singlecell's and CuPy's own kernels


def test_a_bad_configuration_file_is_named(tmp_path):
    missing = tmp_path / "missing.yaml"
    command = [sys.executable, "-m", "omicsprep.cli", "warm-kernels", "--backend", "cpu", "--configfile", str(missing)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"omicsprep error: file '{missing}': cannot be read (No such file or directory)"
    )


def test_a_configuration_that_breaks_the_schema_is_named_with_its_key(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("qc:\n  min_cells_left: many\n")
    command = [sys.executable, "-m", "omicsprep.cli", "warm-kernels", "--backend", "cpu", "--configfile", str(config)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"omicsprep error: file '{config}': qc.min_cells_left: 'many' is not of type 'integer'"
    )


def test_kernel_manifests_travel_between_installs_and_keep_each_kernel_once(tmp_path):
    from omicsprep.kernels import local_options, manifest_of, portable_options, read_manifest, write_manifest

    here = {"{cupy}": "/env/lib/site-packages/cupy", "{site}": "/env/lib/site-packages"}
    there = {"{cupy}": "/opt/py/site-packages/cupy", "{site}": "/opt/py/site-packages"}
    options = ["-I/env/lib/site-packages/cupy/_core/include", "--std=c++17", "-I/env/lib/site-packages/nvidia/include"]
    portable = portable_options(options, here)
    assert portable == ["-I{cupy}/_core/include", "--std=c++17", "-I{site}/nvidia/include"]
    assert local_options(portable, there) == (
        "-I/opt/py/site-packages/cupy/_core/include",
        "--std=c++17",
        "-I/opt/py/site-packages/nvidia/include",
    )
    headers = "#include <cupy/complex.cuh> " * 100
    requests = [
        {"arguments": {"source": "a", "options": portable, "extra_source": headers}, "seconds": 2.0},
        {"arguments": {"source": "b", "options": portable, "extra_source": headers}, "seconds": 0.5},
        {"arguments": {"source": "a", "options": portable, "extra_source": headers}, "seconds": 0.01},  # cached
    ]
    manifest = manifest_of(requests, cupy_version="14.2.0")
    assert manifest["texts"] == [headers]
    assert [(k["arguments"]["source"], k["arguments"]["extra_source"], k["seconds"]) for k in manifest["kernels"]] == [
        ("a", 0, 2.0),
        ("b", 0, 0.5),
    ]
    write_manifest(manifest, tmp_path / "kernels.json.gz")
    assert read_manifest(tmp_path / "kernels.json.gz") == manifest


def test_kernels_are_dealt_into_groups_of_about_equal_time():
    from omicsprep.kernels import balanced_groups

    kernels = [{"name": index, "seconds": seconds} for index, seconds in enumerate([3, 3, 2, 2, 1, 1, 0.5, 0.5])]
    groups = balanced_groups(kernels, n_groups=3)
    assert sorted(kernel["name"] for group in groups for kernel in group) == list(range(8))
    assert sorted(sum(kernel["seconds"] for kernel in group) for group in groups) == [4, 4.5, 4.5]
    assert len(balanced_groups(kernels[:2], n_groups=4)) == 2  # no empty groups


@pytest.mark.gpu
def test_shipped_kernels_compiled_ahead_leave_nothing_to_compile_in_the_steps(tmp_path):
    # A fresh machine (empty caches): the shipped manifest compiled ahead in processes, then
    # qc's and cluster's steps on the generated sample compile nothing more (but the 3 kernels
    # with name expressions, which are not shipped: CuPy compiles them in every process); a second start
    # finds the cache marked and starts no process.
    code = """
import os
from pathlib import Path
from omicsprep.backend import cupy
from omicsprep.cli import workflow_config
from omicsprep.kernels import start_compiling_ahead
from omicsprep.warmup import warm_kernels

cupy().cuda.runtime.free(0)
cache = Path(os.environ["CUPY_CACHE_DIR"])
ahead = start_compiling_ahead(processes=8)
print(len(ahead.processes), ahead.finish())
compiled = len(list(cache.glob("*.cubin")))
warm_kernels(workflow_config([]), backend="gpu")
print(compiled, len(list(cache.glob("*.cubin"))) - compiled, len(start_compiling_ahead(processes=8).processes))
"""
    caches = {name: str(tmp_path / name) for name in ("CUPY_CACHE_DIR", "NUMBA_CACHE_DIR", "CUDA_CACHE_PATH")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={**os.environ, **caches}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (processes, succeeded), (compiled_ahead, compiled_in_steps, second_start) = (
        line.split() for line in result.stdout.strip().splitlines()[-2:]
    )
    assert processes == "8" and succeeded == "True"
    print(f"MEASURE kernels compiled ahead: {compiled_ahead}; compiled in the steps after: {compiled_in_steps}")
    assert int(compiled_ahead) >= 100
    assert int(compiled_in_steps) <= 3  # those with name expressions, which CuPy compiles in every process
    assert second_start == "0"
