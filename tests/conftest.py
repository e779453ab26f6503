"""Shared fixtures: the bundled real datasets, and GPU detection for the `gpu` marker.

GPU tests are skipped without a usable GPU; failed instead under `--require-gpu` or
`OMICSPREP_REQUIRE_GPU=1`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import fields
from functools import partial
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
from anndata import AnnData
from scipy import sparse

from omicsprep import io
from omicsprep.backend import gpu_unavailable_reason
from omicsprep.options import (
    ClusteringOptions,
    DoubletOptions,
    EmbeddingOptions,
    FilterOptions,
    IntegrationOptions,
    MarkersOptions,
    MergeOptions,
    QcOptions,
    ScanviOptions,
    ScviOptions,
    from_config,
)
from omicsprep.rna.pipeline import run_clustering, run_qc
from omicsprep.testing.study import generate_study

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "config" / "schemas" / "config.schema.yaml"
DEMO = REPO / "resources" / "demo"
MULTIOME = DEMO / "multiome_pbmc"
CITESEQ = DEMO / "citeseq_dsb"
PBMC_H5 = DEMO / "pbmc_chr21" / "filtered_feature_bc_matrix.h5"
PBMC_MTX = DEMO / "pbmc_chr21" / "filtered_feature_bc_matrix"
MOUSE_ZARR = DEMO / "mouse_10k.zarr"
# Generated raw droplets (300 cells among 15,000 barcodes) and their truth per barcode.
DROPLETS_H5 = DEMO / "droplets" / "raw_feature_bc_matrix.h5"
DROPLETS_TRUTH = DEMO / "droplets" / "truth.parquet"

# Options for the one-chromosome demo matrices (few genes per cell): fixed QC limits only.
QC_OPTIONS = QcOptions(filter=FilterOptions(method="thresholds", min_genes=10))
NO_DOUBLETS = DoubletOptions(enabled=False, remove=False)
CLUSTER_OPTIONS = ClusteringOptions(markers=MarkersOptions(n_genes=10))


def widened(matrix: sparse.spmatrix) -> sparse.spmatrix:
    """``matrix`` with 64-bit indices and index pointers, as SciPy holds a matrix beyond 2^31 entries."""
    matrix = matrix.copy()
    matrix.indices, matrix.indptr = matrix.indices.astype(np.int64), matrix.indptr.astype(np.int64)
    return matrix


def shipped_config() -> dict:
    """The workflow's shipped ``config/config.yaml``."""
    import yaml

    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def embedding_options(config: dict) -> EmbeddingOptions:
    """The protein, chromatin and multiome rules' neighbours, UMAP and Leiden: their config sections."""
    return from_config(EmbeddingOptions, {option.name: config[option.name] for option in fields(EmbeddingOptions)})


def distinct_profiles(counts: AnnData) -> np.ndarray:
    """Cells with counts whose profile (counts over their total) no other cell shares.

    Identical embeddings make ties that neighbour searches break arbitrarily.
    """
    values = counts.X.toarray()
    totals = values.sum(axis=1, keepdims=True)
    profile = pd.DataFrame(np.round(values / np.maximum(totals, 1), 6))
    return (totals.ravel() > 0) & ~profile.duplicated(keep=False).to_numpy()


def multiome_rna() -> AnnData:
    """The demo Multiome cells' RNA with at least 5 of its 45 genes: log-normalized, scaled, 20 PCs."""
    import scanpy as sc

    rna = io.read_counts(MULTIOME / "rna.h5ad")
    sc.pp.filter_cells(rna, min_genes=5)
    sc.pp.normalize_total(rna, target_sum=1e4)
    sc.pp.log1p(rna)
    sc.pp.scale(rna)
    sc.tl.pca(rna, n_comps=20)
    return rna


REQUIRE_GPU_ENV = "OMICSPREP_REQUIRE_GPU"


# Snakemake's SLURM executor plugin runs `scontrol show config` when it is imported, which every
# snakemake command does; where SLURM's commands are installed (make test installs them for
# test_slurm.py) but no controller runs, that waits for the plugin's 10 s timeout: 10 s of each of
# the suite's many snakemake commands. Answered at once while no slurmctld runs.
SCONTROL_WITHOUT_CONTROLLER = """#!/bin/sh
if [ "$1 $2" = "show config" ] && ! pgrep -x slurmctld >/dev/null; then exit 1; fi
exec {scontrol} "$@"
"""


def pytest_configure(config: pytest.Config) -> None:
    """Put the quick ``scontrol`` (:data:`SCONTROL_WITHOUT_CONTROLLER`) first on the tests' ``PATH``."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return
    folder = Path(tempfile.mkdtemp(prefix="omicsprep-scontrol-"))
    config.add_cleanup(partial(shutil.rmtree, folder, ignore_errors=True))
    (folder / "scontrol").write_text(SCONTROL_WITHOUT_CONTROLLER.format(scontrol=scontrol))
    (folder / "scontrol").chmod(0o755)
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ['PATH']}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-gpu",
        action="store_true",
        default=os.environ.get(REQUIRE_GPU_ENV, "").strip() not in ("", "0", "false", "no"),
        help=f"the GPU tests must run: without a usable GPU they fail instead of being skipped, and so does a "
        f"GPU library they import (also set by {REQUIRE_GPU_ENV}=1)",
    )


def gpu_required(config: pytest.Config) -> bool:
    """Whether this run requires the GPU tests (``--require-gpu`` or ``OMICSPREP_REQUIRE_GPU=1``)."""
    return bool(config.getoption("require_gpu"))


def import_for_gpu_test(config: pytest.Config, module: str) -> ModuleType:
    """Import a module a GPU test needs: skip the test without it, unless the GPU tests are required.

    Where they are required, a missing module is a failure.
    """
    if not gpu_required(config):
        return pytest.importorskip(module)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"GPU tests are required (--require-gpu) and {module} does not import: {exc}", pytrace=False)


# The longest files first, in this order (make test's two processes take whole files in collection
# order): each process starts on one of the two longest, rather than one process finishing with
# test_workflow.py after the other has run out of files.
LONGEST_FILES = (
    "test_workflow.py",
    "test_atlas.py",
    "test_scib.py",
    "test_bad_input.py",
    "test_slurm.py",
    "test_schema_boundaries.py",
    "test_benchmarks.py",
    "test_umi.py",
    "test_protein.py",
    "test_cells.py",
    "test_faults.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept
    reason = gpu_unavailable_reason() if any("gpu" in item.keywords for item in items) else None
    if reason is None or gpu_required(config):  # required: pytest_runtest_setup fails them instead
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under --require-gpu, a GPU test without a usable GPU fails, giving the reason.

    pytest counts it as an error, since it fails before its fixtures are set up.
    """
    if "gpu" in item.keywords and gpu_required(item.config):
        reason = gpu_unavailable_reason()
        if reason is not None:
            pytest.fail(f"GPU tests are required (--require-gpu) but no GPU is usable: {reason}", pytrace=False)


@pytest.fixture
def pbmc():
    """10x chr21 PBMCs: 1,107 cells x 507 genes, raw counts (fresh copy per test)."""
    return io.read_counts(PBMC_H5)


@pytest.fixture(scope="session")
def mouse_path() -> Path:
    return MOUSE_ZARR


MERGE_OPTIONS = MergeOptions()
# Every integration method on the generated study (generated_study): its last batch's labels held out.
ATLAS_OPTIONS = MergeOptions(
    integration=IntegrationOptions(methods=("pca", "harmony", "scvi", "scanvi"), use="scvi", label_key="known_type"),
    scvi=ScviOptions(max_epochs=150, batch_size=256),
    scanvi=ScanviOptions(max_epochs=20),  # batches of 256 (scVI's), half the steps of scvi-tools' 10 epochs of 128
)


def train_celltypist_model(cells: AnnData, *, labels: str = "cell_type"):
    """A small CellTypist model (logistic regression by SGD, all genes) trained on ``cells``' raw counts and labels.

    (CellTypist's plain logistic regression passes ``multi_class``, which scikit-learn 1.8 removed.)
    """
    import celltypist

    from omicsprep.rna.annotation import log_cp10k

    expression = log_cp10k(cells)
    return celltypist.train(
        expression,
        labels=cells.obs[labels].astype(str).to_numpy(),
        check_expression=False,
        use_SGD=True,
        max_iter=200,
        n_jobs=1,
        random_state=0,
    )


@pytest.fixture(scope="module")
def generated_study():
    """Three generated batches with planted types (omicsprep.testing.study) through QC and clustering
    on the CPU; ``obs["known_type"]`` is the type, held out (empty) in the last batch."""
    processed = {}
    for name, batch in generate_study(n_batches=3, n_cells=800, n_genes=1500, seed=0).items():
        batch.obs["known_type"] = batch.obs["cell_type"].astype(str) if name != "batch2" else ""
        batch, _ = run_qc(batch, options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
        run_clustering(batch, options=CLUSTER_OPTIONS, seed=0, backend="cpu")
        processed[name] = batch
    return processed


@pytest.fixture(scope="session")
def pbmc_batches():
    """The chr21 PBMCs in two halves; the second half's counts scaled per gene (log-normal, sigma 1.5)."""
    counts = io.read_counts(PBMC_H5)
    halves = {"first": counts[::2].copy(), "second": counts[1::2].copy()}
    rng = np.random.default_rng(0)
    scale = rng.lognormal(0, 1.5, counts.n_vars)
    second = halves["second"].X.tocsc()
    second.data = np.round(second.data * np.repeat(scale, np.diff(second.indptr)))
    halves["second"].X = second.tocsr()
    halves["second"].X.eliminate_zeros()
    processed = {}
    for name, adata in halves.items():
        adata, _ = run_qc(adata, options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
        run_clustering(adata, options=CLUSTER_OPTIONS, seed=0, backend="cpu")
        processed[name] = adata
    return processed


def repeated_entries() -> tuple[np.ndarray, sparse.csr_matrix]:
    """A matrix, and a CSR form of it whose entries are split in two (not canonical)."""
    dense = np.random.default_rng(4).gamma(1.0, size=(50, 8)).astype(np.float32)
    columns = np.tile(np.arange(8), (50, 2))  # each row lists every column twice
    halves = np.tile(dense / 2, 2)
    split = sparse.csr_matrix((halves.ravel(), columns.ravel(), np.arange(0, 50 * 16 + 1, 16)), shape=dense.shape)
    assert split.nnz == 2 * dense.size
    return dense, split


OMICSPREP_CLI = [sys.executable, "-c", "from omicsprep.cli import main; main()"]


@contextlib.contextmanager
def pool_running(*, n_workers: int, cwd: Path | None = None) -> Iterator[dict[str, str]]:
    """A pool of warm processes (omicsprep.pool) in a runtime folder of its own, its workers ready,
    started from ``cwd`` (by default this one); yields the environment whose jobs it runs (the
    workflow then starts none of its own).

    The folder is short (under /tmp): a socket's path has at most 107 bytes.
    """
    from omicsprep import pool

    env = {**os.environ, "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="pool-", dir="/tmp")}
    code = f"from omicsprep import pool; print(pool.start(n_workers={n_workers}, idle_seconds=300))"
    started = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=cwd)
    env[pool.POOL] = started.stdout.strip()
    deadline = time.monotonic() + 300
    while (state := pool.status(Path(env[pool.POOL]))) is None or "ready" not in state["workers"]:
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    try:
        yield env
    finally:
        pool.stop(Path(env[pool.POOL]))
        shutil.rmtree(env["XDG_RUNTIME_DIR"], ignore_errors=True)
