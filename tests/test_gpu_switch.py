"""The required-GPU switch (``--require-gpu`` or ``OMICSPREP_REQUIRE_GPU=1``).

Where no GPU is usable, the GPU tests fail, with the reason, instead of being skipped.

One real GPU test runs in a pytest subprocess with ``CUDA_VISIBLE_DEVICES`` empty, so that
no GPU is usable there even on a GPU machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, REQUIRE_GPU_ENV, import_for_gpu_test

GPU_TEST = "tests/test_gpu.py::test_auto_and_gpu_resolve_to_the_gpu"


def run_gpu_test(*options: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, int], str]:
    """Run the one GPU test without a visible GPU.

    Returns pytest's exit code, its summary counts (``{"skipped": 1}``) and its output.
    """
    environment = {key: value for key, value in os.environ.items() if key not in (REQUIRE_GPU_ENV, "PYTEST_ADDOPTS")}
    environment.update({"CUDA_VISIBLE_DEVICES": "", **(env or {})})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", GPU_TEST, "-p", "no:cacheprovider", *options],
        check=False,
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    summary = re.findall(r"^=+ (.+) in [\d.]+s", result.stdout, flags=re.MULTILINE)
    assert summary, output
    counts = {
        outcome.rstrip("s") if outcome == "errors" else outcome: int(n)
        for n, outcome in re.findall(r"(\d+) (\w+)", summary[-1])
    }
    return result.returncode, counts, output


def test_gpu_tests_skip_without_a_gpu_by_default():
    returncode, counts, output = run_gpu_test()
    assert returncode == 0, output
    assert counts == {"skipped": 1}, output
    assert "no usable GPU: " in output


@pytest.mark.parametrize(
    "switch", [{"options": ["--require-gpu"]}, {"env": {REQUIRE_GPU_ENV: "1"}}], ids=["option", "environment"]
)
def test_required_gpu_tests_fail_without_a_gpu(switch):
    returncode, counts, output = run_gpu_test(*switch.get("options", []), env=switch.get("env"))
    assert returncode == 1, output
    assert counts == {"error": 1}, output  # failed before its fixtures: pytest counts an error, never a skip
    assert "GPU tests are required (--require-gpu) but no GPU is usable: " in output


class Switch:
    """Stands in for ``pytest.Config``: only the switch is read."""

    def __init__(self, *, required: bool) -> None:
        self.required = required

    def getoption(self, name: str) -> bool:
        assert name == "require_gpu"
        return self.required


def test_a_missing_gpu_library_skips_unless_gpu_tests_are_required():
    with pytest.raises(pytest.skip.Exception, match="omicsprep_no_such_module"):
        import_for_gpu_test(Switch(required=False), "omicsprep_no_such_module")
    with pytest.raises(pytest.fail.Exception, match=r"required \(--require-gpu\) and omicsprep_no_such_module"):
        import_for_gpu_test(Switch(required=True), "omicsprep_no_such_module")
    assert import_for_gpu_test(Switch(required=True), "json") is json
