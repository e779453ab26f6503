"""The backend seam: explicit choice, no silent fallback, recorded provenance."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import anndata as ad
import numpy as np
import pytest

from omicsprep.backend import dask_gpu_cluster, gpu_module, gpu_unavailable_reason, module_versions, resolve_backend
from omicsprep.errors import BackendUnavailableError


def test_cpu_is_always_available():
    assert resolve_backend("cpu") == "cpu"


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be"):
        resolve_backend("tpu")


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a GPU is present")
def test_explicit_gpu_without_one_fails_and_auto_falls_to_cpu():
    with pytest.raises(BackendUnavailableError, match="backend 'gpu' was requested but cannot be used"):
        resolve_backend("gpu")
    assert resolve_backend("auto") == "cpu"


def test_a_gpu_library_that_cannot_be_imported_is_a_clear_error(monkeypatch):
    # The RAPIDS libraries are imported when first used, not when the backend is chosen: one
    # that is installed and cannot be imported (a CUDA mismatch) still stops with one line.
    monkeypatch.setitem(sys.modules, "cuml", None)  # makes "import cuml" raise ImportError
    with pytest.raises(BackendUnavailableError, match=r"the GPU backend cannot import cuml \(ModuleNotFoundError"):
        gpu_module("cuml")


def test_only_cupy_is_imported_to_choose_the_backend():
    # Checked in a fresh process: choosing the backend must not import cuDF, cuML, cuGraph or
    # rapids-singlecell (about 15 s on the GPU machine); where a GPU is usable, CuPy is.
    code = (
        "import sys; from omicsprep.backend import resolve_backend; resolve_backend('auto'); "
        "print(sorted(m for m in ('cudf', 'cuml', 'pylibcugraph', 'rapids_singlecell') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.gpu
def test_preparing_the_gpu_overlaps_the_read_and_each_first_use_waits_for_its_module():
    # In a fresh process, as in a rule: the thread imports rapids-singlecell, then cuGraph,
    # while this one goes on; each first gpu_module call waits for its module only (one
    # the thread does not import waits for the whole thread), which is then imported once.
    code = """
import sys, threading
from omicsprep.backend import gpu_module, prepare_gpu, resolve_backend
backend = resolve_backend("gpu")
prepare_gpu(backend, modules=("rapids_singlecell", "pylibcugraph"))
preparing = [t for t in threading.enumerate() if t.name == "omicsprep-prepare-gpu"]
from omicsprep.backend import cupyx_sparse_linalg
print(cupyx_sparse_linalg() is sys.modules["cupyx.scipy.sparse.linalg"])
single_cell = gpu_module("rapids_singlecell")
print(single_cell is sys.modules["rapids_singlecell"], not getattr(single_cell.__spec__, "_initializing", False))
graph = gpu_module("pylibcugraph")
print(graph is sys.modules["pylibcugraph"], not getattr(graph.__spec__, "_initializing", False))
gpu_module("cuml")  # imported by rapids-singlecell already
gpu_module("tabnanny")  # imported by nothing before: waits for the whole thread
print(len(preparing), any(t.is_alive() for t in preparing))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True", "True", "True", "True", "1", "False"]


STAND_IN_MODULES = {
    # A CuPy with one device, and libraries whose import takes a while and imports CuPy's
    # parts too, as rapids-singlecell's does; each module records the thread that ran it.
    "cupy/__init__.py": "from types import SimpleNamespace\n"
    "cuda = SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1, free=lambda pointer: None))\n",
    "cupy/_core/__init__.py": "",
    "cupy/_core/_routines_linalg.py": "",
    "cupyx/__init__.py": "",
    "cupyx/scipy/__init__.py": "",
    "cupyx/scipy/sparse/__init__.py": "",
    "cupyx/scipy/sparse/linalg/__init__.py": "",
    "rapids_singlecell/__init__.py": "import time\ntime.sleep(0.5)\nimport cupyx.scipy.sparse.linalg\n",
    "cudf/__init__.py": "",
    "cuml/__init__.py": "",
    "pylibcugraph/__init__.py": "",
}


def test_cupys_parts_are_imported_by_the_gpu_start_up_thread_never_beside_it(tmp_path):
    # A step that needs CuPy's sparse matrices while the start-up thread imports a library
    # that imports them too waits for that thread's import instead of starting its own: two
    # threads in one import deadlocked a GPU rule on the H200.
    for name, text in STAND_IN_MODULES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "import threading\nIMPORTED_IN = threading.current_thread().name\n")
    code = """
import sys
from omicsprep.backend import CUPY_PARTS, cupyx_sparse, cupyx_sparse_linalg, gpu_module, prepare_gpu, resolve_backend
prepare_gpu(resolve_backend("gpu"), modules=("rapids_singlecell",))
cupyx_sparse_linalg(), cupyx_sparse(), gpu_module("cupy._core._routines_linalg")
print(*sorted({sys.modules[name].IMPORTED_IN for name in CUPY_PARTS}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["omicsprep-prepare-gpu"]


def test_a_library_two_threads_ask_for_at_once_reaches_both_whole(tmp_path, monkeypatch):
    # The second thread waits for the first's import: handed the half-imported module, two
    # threads asking for cuML at once met "partially initialized module 'cuml'" on an H100.
    (tmp_path / "slow_gpu_library.py").write_text("import time\ntime.sleep(0.5)\nneighbors = 'ready'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: gpu_module("slow_gpu_library").neighbors, range(2))
    assert first == second == "ready"


def test_a_dimension_beyond_32_bit_indices_is_refused_on_the_gpu(monkeypatch):
    # CuPy would wrap the index pointer of a matrix of 2^31 non-zeros or more: such a matrix
    # goes in row blocks (tests/test_gpu.py), a dimension that long is refused. The limit is
    # lowered here so that a small matrix crosses it, before anything touches a GPU.
    from scipy import sparse

    from omicsprep import backend

    monkeypatch.setattr(backend.placement, "GPU_SPARSE_MAX_ENTRIES", 4)
    matrix = sparse.random(5, 4, density=0.6, format="csr", dtype=np.float32, random_state=0)
    for refused in (matrix, matrix.tocsc()):
        with pytest.raises(BackendUnavailableError, match=r"5 x 4 matrix.*at most 4.*backend: cpu"):
            backend.to_device(ad.AnnData(refused), backend="gpu")


def test_row_blocks_hold_at_most_their_entries_or_one_row():
    from omicsprep.backend import row_block_bounds

    indptr = np.cumsum([0, 3, 0, 9, 2, 2, 1])  # rows of 3, 0, 9 (beyond 5 alone), 2, 2 and 1 entries
    assert row_block_bounds(indptr, max_entries=5) == [0, 2, 3, 6]
    assert row_block_bounds(indptr, max_entries=100) == [0, 6]
    assert row_block_bounds(np.zeros(1, dtype=np.int64), max_entries=5) == [0]


def test_preparing_the_cpu_backend_starts_nothing():
    import threading

    from omicsprep.backend import prepare_gpu

    before = threading.active_count()
    prepare_gpu("cpu")
    assert threading.active_count() == before


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a GPU is present")
def test_multi_gpu_without_gpus_fails():
    with (
        pytest.raises(BackendUnavailableError, match=re.escape("multi-GPU (Dask) was requested but cannot be used")),
        dask_gpu_cluster(2),
    ):
        pass


def test_versions_name_the_libraries_in_use():
    from importlib.metadata import version

    import scanpy  # noqa: F401

    versions = module_versions(backend="cpu")
    assert versions["scanpy"] == version("scanpy")
    assert "python" in versions


def test_a_cpu_rule_records_no_gpu_library_even_where_one_is_imported(monkeypatch):
    # As in a worker of the GPU pool, which imported the GPU libraries before it knew its job's backend.
    import types

    monkeypatch.setitem(sys.modules, "cuml", types.SimpleNamespace(__version__="26.10.0"))
    assert "cuml" not in module_versions(backend="cpu")
    assert module_versions(backend="gpu")["cuml"] == "26.10.0"


# Run in a fresh interpreter: a finder placed first on sys.meta_path sees every module asked
# for, installed or not, and answers for the GPU libraries as though they were absent (so a
# RAPIDS machine behaves as a CPU-only one: nothing caches them in sys.modules, where a
# second request would bypass the finders). It notes who asked: the innermost frame
# outside importlib.
GPU_IMPORT_PROBE = r"""
import importlib, json, os, pkgutil, sys
from dataclasses import replace

CUDA_KERNELS = (  # imported by the GPU path only
    "omicsprep.reads.umi_cuda", "omicsprep.cells.montecarlo_cuda", "omicsprep.rna.neighbors_cuda",
    "omicsprep.rna.pairs_cuda",
)
GPU = ("cupy", "cupyx", "cudf", "cuml", "cugraph", "pylibcugraph", "rapids_singlecell", "dask_cuda", "numba.cuda")
GPU += CUDA_KERNELS
IMPORTLIB = os.path.dirname(importlib.__file__)
asked = []


class RecordGpuImports:
    def find_spec(self, name, path=None, target=None):
        if any(name == gpu or name.startswith(gpu + ".") for gpu in GPU):
            frame = sys._getframe(1)
            while frame.f_code.co_filename.startswith(("<frozen", IMPORTLIB)):
                frame = frame.f_back
            asked.append([name, f"{frame.f_code.co_filename}:{frame.f_lineno}"])
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, RecordGpuImports())
import omicsprep
for module in pkgutil.walk_packages(omicsprep.__path__, prefix="omicsprep."):
    if module.name not in CUDA_KERNELS:
        importlib.import_module(module.name)
assert set(CUDA_KERNELS) <= {module.name for module in pkgutil.walk_packages(omicsprep.__path__, prefix="omicsprep.")}
from omicsprep import io
from omicsprep.backend import gpu_unavailable_reason, resolve_backend
from omicsprep.options import DoubletOptions, PcaOptions
from omicsprep.rna.pipeline import run_clustering, run_qc

sys.path.insert(0, sys.argv[1])
from conftest import CLUSTER_OPTIONS, PBMC_H5, QC_OPTIONS

backend = resolve_backend("cpu")
adata = io.read_counts(PBMC_H5)[:300].copy()
doublets = DoubletOptions(enabled=True, expected_rate=0.06, remove=True, max_cells_per_run=20000)
adata, metrics = run_qc(adata, options=QC_OPTIONS, doublet_options=doublets, seed=0, backend=backend)
options = replace(CLUSTER_OPTIONS, pca=PcaOptions(n_comps=20))
markers = run_clustering(adata, options=options, seed=0, backend=backend)
io.write_table(markers, os.path.join(sys.argv[2], "markers.tsv"))
io.write_h5ad(adata, os.path.join(sys.argv[2], "processed.h5ad"))
cpu_path = list(asked)
reason = gpu_unavailable_reason()  # a control: omicsprep asking for CuPy must be seen
print(json.dumps({"cpu_path": cpu_path, "control": asked[len(cpu_path):], "reason": reason,
                  "cells": adata.n_obs, "clusters": int(adata.obs["leiden_1.0"].nunique())}))
"""


def test_cpu_path_asks_for_no_gpu_library(tmp_path):
    """The CPU chain of rules qc and cluster, run for real, never imports a GPU library from omicsprep's code.

    Whether or not one is installed (anndata and zarr probe for CuPy themselves; that is theirs).
    """
    import json
    import subprocess
    import sys
    from pathlib import Path

    import omicsprep

    tests = Path(__file__).parent
    run = subprocess.run(
        [sys.executable, "-c", GPU_IMPORT_PROBE, str(tests), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    package = str(Path(omicsprep.__file__).parent) + "/"
    # the chain really ran
    assert 250 < seen["cells"] <= 300
    assert seen["clusters"] >= 2
    assert [[name, where] for name, where in seen["cpu_path"] if where.startswith(package)] == []
    # The recorder catches omicsprep asking for CuPy even where CuPy is absent.
    assert [name for name, where in seen["control"] if where.startswith(package + "backend/libraries.py")][:1] == [
        "cupy"
    ]
    assert seen["reason"].startswith("CuPy/CUDA unusable (ModuleNotFoundError")


def test_row_blocks_are_subset_and_gathered_as_one_matrix_would_be():
    """The helpers the GPU path uses on row blocks (CuPy's there), on SciPy blocks here."""
    from scipy import sparse

    from omicsprep import backend

    matrix = sparse.random(40, 9, density=0.4, format="csr", dtype=np.float32, random_state=0)
    blocks = backend.row_blocks([matrix[start:stop] for start, stop in ((0, 11), (11, 30), (30, 40))])
    rng = np.random.default_rng(0)
    cells, genes = rng.random(40) < 0.5, rng.random(9) < 0.6
    rows = np.flatnonzero(rng.random(40) < 0.3)

    def joined(blocked):
        return backend.take_rows(blocked, np.arange(blocked.shape[0]))

    assert backend.sparse_entries(blocks) == matrix.nnz
    assert (joined(backend.keep_rows(blocks, cells)) != matrix[cells]).nnz == 0
    assert (joined(backend.keep_columns(blocks, genes)) != matrix[:, genes]).nnz == 0
    assert (backend.take_rows(blocks, rows) != matrix[rows]).nnz == 0
    assert (backend.take_columns(blocks, 2, 7) != matrix[:, 2:7]).nnz == 0
    np.testing.assert_array_equal(backend.column_entries(blocks), matrix.getnnz(axis=0))
    assert (backend.joined_rows(blocks) != matrix).nnz == 0
    # The merge's: columns placed among more (here reversed into 12), then stacked by rows.
    positions = np.arange(9)[::-1] + 3
    placed = sparse.csr_matrix((matrix.shape[0], 12), dtype=np.float32)
    placed[:, positions] = matrix
    for whole_or_blocks in (matrix, blocks):
        moved = backend.with_columns_at(whole_or_blocks, positions, n_columns=12)
        assert (joined(moved) if backend.is_dask_array(moved) else moved).has_sorted_indices
        assert (backend.stacked_rows([moved, placed[:5]]) != sparse.vstack([placed, placed[:5]])).nnz == 0
