"""The rules' memory and disk from the size of their inputs (omicsprep.resources)."""

from __future__ import annotations

import re

import h5py
import pytest
from conftest import PBMC_MTX, REPO

from omicsprep import resources


def test_every_rule_that_reads_data_sizes_itself_from_its_inputs():
    rules = "".join(path.read_text() for path in (REPO / "rules").glob("*.smk"))
    sized = set(re.findall(r'mem_mb=memory_for\("(\w+)"\)', rules))
    assert sized == set(re.findall(r'disk_mb=disk_for\("(\w+)"\)', rules)) == set(resources.MODELS)
    # Every rule that may use the GPU reads a matrix, reads or fragments.
    assert set(re.findall(r'backend_for\("(\w+)"\)', rules)) <= sized


def test_memory_grows_with_the_inputs_and_each_retry():
    small, large = (resources.memory_mb("qc", inputs_mb=size) for size in (10, 10_000))
    model = resources.MODELS["qc"]
    assert large - small == pytest.approx(model.memory_per_input_mb * 9_990, abs=1)
    assert resources.memory_mb("qc", inputs_mb=10_000, attempt=2) == 2 * large
    assert resources.disk_mb("qc", inputs_mb=10_000) > resources.disk_mb("qc", inputs_mb=10)


def test_a_matrix_rule_on_the_gpu_asks_for_less_host_memory_and_still_what_it_used():
    # qc and cluster in one process on the H200 at 3,000,000 cells: 29,300 MB of counts' values,
    # a 30.4 GB peak (benchmarks/RESULTS.md, "Atlas scale"); on the CPU the model asks 3x.
    on_gpu = resources.memory_mb("qc", inputs_mb=29_300, backend="gpu")
    assert 30_400 < on_gpu < resources.memory_mb("qc", inputs_mb=29_300, backend="cpu")
    assert resources.memory_mb("qc", inputs_mb=29_300, backend="auto") == resources.memory_mb("qc", inputs_mb=29_300)
    assert resources.memory_mb("atac", inputs_mb=1_000, backend="gpu") == resources.memory_mb("atac", inputs_mb=1_000)


def test_small_gpu_jobs_share_a_local_gpu_and_ask_one_thread():
    # 10,000 cells hold about 60 MB, 1,000,000 about 7 GB: on a cluster each job has its own GPU.
    assert resources.gpus(backend="auto", inputs_mb=60, local=True) == 0
    assert resources.gpus(backend="gpu", inputs_mb=7_000, local=True) == 1
    assert resources.gpus(backend="auto", inputs_mb=60, local=False) == 1
    assert resources.gpus(backend="cpu", inputs_mb=7_000, local=False) == 0
    assert resources.threads("cluster", backend="auto", on_gpu=True) == 1
    assert resources.threads("cluster", backend="auto", on_gpu=False) == resources.CPU_THREADS["cluster"] == 4
    assert resources.threads("cluster", backend="cpu", on_gpu=True) == 4
    assert resources.threads("protein", backend="cpu", on_gpu=True) == 1
    assert 1 <= resources.pool_workers(cores=16) <= 8 and resources.pool_workers(cores=1) == 1


def test_the_pool_workers_can_be_set(monkeypatch):
    monkeypatch.setenv(resources.POOL_WORKERS, "12")
    assert resources.pool_workers(cores=16) == 12
    for wrong in ("0", "four"):
        monkeypatch.setenv(resources.POOL_WORKERS, wrong)
        with pytest.raises(ValueError, match=f"OMICSPREP_POOL_WORKERS='{wrong}': give a whole number"):
            resources.pool_workers(cores=16)


def test_folders_count_their_files_and_a_missing_input_is_named_as_given():
    # A MatrixMarket folder: its three files.
    expected = sum(path.stat().st_size for path in PBMC_MTX.iterdir() if path.is_file()) / resources.MB
    assert resources.paths_mb([str(PBMC_MTX)]) == pytest.approx(expected)
    missing = "results/nowhere/qc.h5ad"
    with pytest.raises(FileNotFoundError) as raised:  # Snakemake then waits for the input to size the job
        resources.paths_mb([str(PBMC_MTX), missing])
    assert raised.value.filename == missing


def test_a_compressed_h5ad_counts_its_values_uncompressed(tmp_path, pbmc):
    """Memory follows the values read: a gzip .h5ad (a fifth on disk) asks as its uncompressed twin."""
    from omicsprep import io

    pbmc.layers["counts"] = pbmc.X.copy()
    io.write_h5ad(pbmc, tmp_path / "plain.h5ad")
    io.write_h5ad(pbmc, tmp_path / "gzip.h5ad", compression="gzip")
    plain, compressed = (tmp_path / name for name in ("plain.h5ad", "gzip.h5ad"))
    assert compressed.stat().st_size < plain.stat().st_size / 2
    matrices = pbmc.X.data.nbytes * 2 + pbmc.X.indices.nbytes + pbmc.X.indptr.nbytes  # counts share X's indices
    assert matrices / resources.MB < resources.paths_mb([str(compressed)]) <= plain.stat().st_size / resources.MB
    assert resources.paths_mb([str(plain)]) == pytest.approx(plain.stat().st_size / resources.MB)
    with h5py.File(compressed, "a") as handle:  # an empty dataset (anndata writes some in uns) has no size
        handle["uns/empty"] = h5py.Empty("f")
    assert resources.paths_mb([str(compressed)]) > matrices / resources.MB
    (tmp_path / "not.h5").write_text("text")  # named as HDF5, is not: its size
    assert resources.paths_mb([str(tmp_path / "not.h5")]) == pytest.approx(4 / resources.MB)
