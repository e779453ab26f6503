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
    # command's run on a fresh machine is what benchmarks/run.py --cold --setup measures.
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
