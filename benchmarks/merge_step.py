"""The merge step alone at atlas scale: one GPU against Dask over several, in one process.

    python -m benchmarks merge_step --samples 10 --cells 100000 --modes gpu dask:2

Generates ``--samples`` x ``--cells`` cells (generate.py, split as merge.py does,
each sample with its own per-gene scale), keeps them in memory as the cluster rule's
outputs would be (raw counts, and the generated cluster of each cell as the sample's own
clusters; damaged cells and doublets are not removed), then runs
:func:`omicsprep.rna.pipeline.run_merge` once per mode: ``cpu``, ``gpu`` (one GPU) or
``dask:N`` (the GPU backend with ``merge.dask``, N GPUs). Per mode it reports the seconds
of each step (``start_workers`` is dask-cuda's start-up; the first GPU mode also pays for
compiling kernels in this process), the h5ad write and UMAP plot the rule would add, the
peak memory of each GPU (nvidia-smi, sampled every 0.2 s, all processes on it), and the
integration metrics. The table, with machine and date, is appended to ``--results``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import pandas as pd
from anndata import AnnData

from benchmarks.common import RESULTS, BackgroundThread, append_results, bench_settings, clustering_options
from benchmarks.merge import BATCH_SIGMA, batches
from omicsprep import io, plotting
from omicsprep.backend import resolve_backend
from omicsprep.options import MergeOptions, cluster_key, from_config
from omicsprep.rna.pipeline import run_merge
from omicsprep.testing.generate import generate_with_clusters
from omicsprep.testing.genes import gene_names

LABELS = cluster_key("leiden", 1.0)


class GpuMemorySampler(BackgroundThread):
    """Largest memory in use on each GPU (MB, as nvidia-smi reports) while it runs."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__()
        self.interval, self.peaks = interval, {}

    def _run(self) -> None:
        while not self._stop.is_set():
            result = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                check=False,
            )
            for line in result.stdout.splitlines():
                index, used = (int(value) for value in line.split(","))
                self.peaks[index] = max(self.peaks.get(index, 0), used)
            self._stop.wait(self.interval)


def cluster_outputs(n_samples: int, n_cells: int, n_genes: int, jobs: int) -> dict[str, AnnData]:
    counts, clusters = generate_with_clusters(n_samples * n_cells, n_genes, seed=0, jobs=jobs)
    genes = pd.Index(gene_names(n_genes))
    return {
        f"sample{i:02d}": AnnData(
            sample,
            obs=pd.DataFrame(
                {LABELS: pd.Categorical(clusters[i * n_cells : (i + 1) * n_cells].astype(str))},
                index=[f"cell{j}" for j in range(n_cells)],
            ),
            var=pd.DataFrame(index=genes),
        )
        for i, sample in enumerate(batches(counts, n_samples))
    }


def run_mode(mode: str, samples: dict[str, AnnData], config: dict) -> dict:
    backend, _, gpus = mode.partition(":")
    options = from_config(MergeOptions, {**config["merge"], "dask": bool(gpus)})
    backend = resolve_backend("gpu" if gpus else backend)
    start = time.perf_counter()
    with GpuMemorySampler() if backend == "gpu" else nullcontext() as sampler:
        merged, metrics, _, _ = run_merge(
            samples,
            options=options,
            clustering_options=clustering_options(config),
            labels=LABELS,
            seed=config["seed"],
            backend=backend,
            n_gpus=int(gpus or 1),
        )
    row = {"mode": mode, "cells": merged.n_obs, "merge_s": round(time.perf_counter() - start, 1)}
    row.update(
        {f"{step}_s": round(seconds, 2) for step, seconds in merged.uns["omicsprep"]["merge"]["timings"].items()}
    )
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        io.write_h5ad(merged, Path(folder) / "merged.h5ad", compression=config["h5ad_compression"])
        row["write_h5ad_s"] = round(time.perf_counter() - start, 1)
    start = time.perf_counter()
    plotting.embedding_panels(merged.obsm["X_umap"], merged.obs, keys=["sample", LABELS], title="merged")
    row["plot_s"] = round(time.perf_counter() - start, 1)
    if sampler:
        row.update({f"gpu{index}_peak_mb": peak for index, peak in sorted(sampler.peaks.items())})
    metrics = metrics.set_index("method")
    row.update(
        {
            "mixing_before": metrics.loc["pca", "batch_mixing"],
            "mixing_after": metrics.loc["harmony", "batch_mixing"],
            "label_conservation": metrics.loc["harmony", "label_conservation"],
        }
    )
    print(pd.Series(row).to_string(), flush=True)
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--cells", type=int, default=100_000, help="cells per sample")
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--modes", nargs="+", default=["gpu", "dask:2"], help="cpu, gpu or dask:N")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes generating the data")
    parser.add_argument("--results", type=Path, default=RESULTS)


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        config = bench_settings(Path(folder))
    start = time.perf_counter()
    samples = cluster_outputs(args.samples, args.cells, args.genes, args.jobs)
    print(f"{args.samples} samples of {args.cells} cells generated in {time.perf_counter() - start:.0f} s", flush=True)
    table = pd.DataFrame([run_mode(mode, samples, config) for mode in args.modes])
    print(table.set_index("mode").T.to_string())
    append_results(
        args.results,
        title="The merge step alone",
        table=table.set_index("mode").T.reset_index(names="step"),
        note=f"{args.samples} generated samples x {args.cells:,} cells ({args.genes:,} genes, per-gene "
        f"batch scale sigma {BATCH_SIGMA}), the benchmark settings (common.BENCH_CONFIG), in one process "
        f"(`run_merge`); seconds per step, GPU memory peaks from nvidia-smi.",
    )
