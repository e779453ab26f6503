"""The CPU image (envs/containers/build.sh cpu) runs the bundled demo as the host does.

Outside CI (5-8 minutes on two cores; docs/containers.md): `make test-image`, as root with
debootstrap and buildah.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from omicsprep import __version__
from omicsprep.testing import CHECKOUT, snakemake_command

pytestmark = pytest.mark.skipif(
    os.environ.get("OMICSPREP_TEST_IMAGE") != "1" or shutil.which("buildah") is None,
    reason="builds the CPU image: make test-image (root, debootstrap and buildah)",
)

IMAGE = f"localhost/omicsprep-cpu:{__version__}"
DEMO_SAMPLES = ["pbmc_chr21", "mouse_10k", "multiome_pbmc", "droplets"]


def _run(*command: str | Path) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def container() -> str:
    """A working container of the freshly built image."""
    _run(CHECKOUT / "envs" / "containers" / "build.sh", "cpu")
    name = _run("buildah", "from", IMAGE).stdout.strip()
    yield name
    subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


def test_the_image_holds_star_and_writes_an_oci_archive(container: str) -> None:
    star = _run("buildah", "run", "--isolation", "chroot", container, "--", "STAR", "--version")
    assert star.stdout.strip() == "2.7.10b"
    assert (CHECKOUT / "build" / "containers" / "omicsprep-cpu.tar").stat().st_size > 500_000_000


def test_the_image_runs_the_demo_as_the_host_does(container: str, tmp_path: Path) -> None:
    """The demo in the image (its own workflow copy, `snakemake --cores 2`) and on the host give the
    same summary and the same clusters."""
    inside = tmp_path / "image_results"
    inside.mkdir()
    _run(
        *("buildah", "run", "--isolation", "chroot", "--volume", f"{inside}:/opt/omicsprep/results", container, "--"),
        *("snakemake", "--cores", "2", "--configfile", "resources/demo/config.yaml"),
    )
    host = tmp_path / "host"
    shutil.copytree(CHECKOUT / "resources", host / "resources")
    demo_config = host / "resources" / "demo" / "config.yaml"
    _run(
        *snakemake_command(
            "--cores", "2", "--configfile", CHECKOUT / "config" / "config.yaml", demo_config, "--directory", host
        )
    )
    summaries = [
        pd.read_csv(results / "summary.tsv", sep="\t", index_col="sample") for results in (inside, host / "results")
    ]
    assert list(summaries[0].index) == DEMO_SAMPLES
    pd.testing.assert_frame_equal(*(summary.drop(columns="seconds") for summary in summaries))
    for sample in DEMO_SAMPLES:
        pd.testing.assert_frame_equal(
            pd.read_parquet(inside / sample / "obs.parquet"), pd.read_parquet(host / "results" / sample / "obs.parquet")
        )
    assert (inside / "multiqc" / "multiqc_report.html").is_file()
