"""The backend seam: explicit choice, no silent fallback, recorded provenance."""

from __future__ import annotations

import pytest

from omicsprep.backend import gpu_unavailable_reason, gpu_workers, module_versions, resolve_backend
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


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a GPU is present")
def test_multi_gpu_without_gpus_fails():
    with pytest.raises(BackendUnavailableError, match="multi-GPU .Dask. was requested but cannot be used"), \
            gpu_workers(2):
        pass


def test_versions_name_the_libraries_in_use():
    import scanpy  # noqa: F401

    versions = module_versions()
    assert versions["scanpy"] == scanpy.__version__
    assert "python" in versions


def test_analysis_modules_import_no_gpu_library():
    import subprocess
    import sys

    code = (
        "import sys, omicsprep.pipeline, omicsprep.plotting, omicsprep.io, omicsprep.timings;"
        "print(sorted(m for m in ('cupy','cudf','cuml','cugraph','rapids_singlecell') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
