"""``omicsprep warm-kernels``: a fresh machine's kernels compiled once, before its first run."""

from __future__ import annotations

import os
import subprocess
import sys

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


def warm(tmp_path, backend: str) -> dict[str, list[str]]:
    """Run the command with every cache in empty folders under ``tmp_path``; what each cache holds after."""
    caches = {name: tmp_path / name.lower() for name in ("CUPY_CACHE_DIR", "NUMBA_CACHE_DIR", "CUDA_CACHE_PATH")}
    env = {**os.environ, **{name: str(path) for name, path in caches.items()}}
    command = [sys.executable, "-m", "omicsprep.cli", "warm-kernels", "--backend", backend]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{backend} kernels of qc and cluster compiled and cached" in result.stderr
    return {name: [p.name for p in path.rglob("*") if p.is_file()] for name, path in caches.items() if path.exists()}


def test_cpu_kernels_are_cached(tmp_path):
    cached = warm(tmp_path, "cpu")
    assert any(name.endswith(".nbi") for name in cached["NUMBA_CACHE_DIR"])  # umap-learn's, among others


@pytest.mark.gpu
def test_gpu_kernels_are_cached(tmp_path):
    cached = warm(tmp_path, "gpu")
    assert len(cached["CUPY_CACHE_DIR"]) >= 10  # rapids-singlecell's and CuPy's own kernels


def test_a_bad_configuration_file_is_named(tmp_path):
    missing = tmp_path / "missing.yaml"
    command = [sys.executable, "-m", "omicsprep.cli", "warm-kernels", "--backend", "cpu", "--configfile", str(missing)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"omicsprep error: file '{missing}': cannot be read (No such file or directory)"
    )
