"""Many samples merged: generated samples end to end, with the merge rule and Harmony, per backend.

    python -m benchmarks merge --samples 10 --cells 50000 --backends cpu gpu

Generates ``--samples`` x ``--cells`` cells at once (generate.py: one biology, one seed) and
splits them into samples, each given its own per-gene technical scale (log-normal, sigma
0.5) as a batch effect, written as 10x HDF5 (cached in ``--workdir``). Then, per backend, it
runs the workflow (the benchmark settings, ``common.BENCH_CONFIG``, and ``merge.enabled``) and reports from
``results/run_times.tsv``: the wall time, each per-sample rule's seconds summed over the
samples and its largest peak memory, the merge rule's seconds and peak memory, and the
merged cells' batch mixing before and after Harmony (``integration.tsv``). The table, with
machine and date, is appended to ``--results``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import sparse

from benchmarks.common import RESULTS, append_results, bench_config, run_snakemake
from omicsprep.testing.generate import generate, write_10x_h5

BATCH_SIGMA = 0.5


def batches(counts: sparse.csr_matrix, n_samples: int) -> list[sparse.csr_matrix]:
    """``counts`` split into ``n_samples`` equal samples, each with a batch effect.

    The batch effect is a per-gene technical scale of the sample's own (log-normal, sigma
    :data:`BATCH_SIGMA`).
    """
    n_cells = counts.shape[0] // n_samples
    rng = np.random.default_rng(1)
    samples = []
    for i in range(n_samples):
        sample = counts[i * n_cells : (i + 1) * n_cells].tocsc()
        scale = rng.lognormal(0, BATCH_SIGMA, counts.shape[1])
        sample.data = np.round(sample.data * np.repeat(scale, np.diff(sample.indptr)))
        sample = sample.tocsr()
        sample.eliminate_zeros()
        samples.append(sample)
    return samples


def samples(workdir: Path, n_samples: int, n_cells: int, n_genes: int, jobs: int) -> Path:
    """The sample sheet of ``n_samples`` generated samples of ``n_cells`` each."""
    folder = workdir / f"data_{n_samples}x{n_cells}x{n_genes}"
    paths = [folder / f"sample{i:02d}.h5" for i in range(n_samples)]
    if not all(path.exists() for path in paths):  # each written atomically, so an existing one is whole
        folder.mkdir(parents=True, exist_ok=True)
        for sample, path in zip(
            batches(generate(n_samples * n_cells, n_genes, seed=0, jobs=jobs), n_samples), paths, strict=True
        ):
            write_10x_h5(sample, path)
    sheet = folder / "samples.tsv"
    sheet.write_text("sample\tinput\n" + "".join(f"{p.stem}\t{p}\n" for p in paths))
    return sheet


def run_workflow(workdir: Path, sheet: Path, backend: str, cores: int, merge_gpus: int) -> dict:
    rundir = workdir / f"merge_{backend}_{sheet.parent.name}"
    rundir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(bench_config(rundir).read_text())
    gpus = merge_gpus if backend == "gpu" else 1
    config["merge"] = {**config["merge"], "enabled": True, "dask": gpus > 1}  # merge.dask is GPU-only
    (rundir / "bench_config.yaml").write_text(yaml.safe_dump(config))
    wall = run_snakemake(
        rundir,
        config=rundir / "bench_config.yaml",
        sheet=sheet,
        backend=backend,
        cores=cores,
        extra=["--set-resources", f"merge:gpu={gpus}", "--resources", f"gpu={gpus}"],
    )
    row = {"backend": backend, "merge_gpus": gpus, "wall_s": round(wall, 1)}
    times = pd.read_csv(rundir / "results" / "run_times.tsv", sep="\t")
    totals = (
        times[times["step"] == "total"].groupby("rule").agg(seconds=("seconds", "sum"), peak_mb=("max_rss_mb", "max"))
    )
    for rule, (seconds, peak) in totals.iterrows():
        row[f"{rule}_s"], row[f"{rule}_peak_mb"] = round(seconds, 1), round(peak)
    metrics = pd.read_csv(rundir / "results" / "merged" / "integration.tsv", sep="\t").set_index("method")
    row["mixing_before"] = metrics.loc["pca", "batch_mixing"]
    row["mixing_after"] = metrics.loc["harmony", "batch_mixing"]
    row["label_conservation"] = metrics.loc["harmony", "label_conservation"]
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--cells", type=int, default=50_000, help="cells per sample")
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument(
        "--backends", nargs="*", choices=["cpu", "gpu"], default=["cpu"], help="none: only generate the samples"
    )
    parser.add_argument(
        "--merge-gpus",
        type=int,
        default=1,
        help="GPUs of the merge rule; more than one selects merge.dask (the GPU backend only)",
    )
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/omicsprep_merge_bench"))
    parser.add_argument("--results", type=Path, default=RESULTS)


def run(args: argparse.Namespace) -> None:
    args.workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sheet = samples(args.workdir, args.samples, args.cells, args.genes, jobs=args.cores)
    print(f"samples ready in {time.perf_counter() - start:.0f} s: {sheet}", flush=True)
    if not args.backends:
        return
    rows = [
        {
            "samples": args.samples,
            "cells_per_sample": args.cells,
            **run_workflow(args.workdir, sheet, backend, args.cores, args.merge_gpus),
        }
        for backend in args.backends
    ]
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    append_results(
        args.results,
        title="Many samples merged",
        table=table,
        note=f"Generated samples ({args.genes:,} genes, one biology, per-gene batch scale sigma "
        f"{BATCH_SIGMA}), the benchmark settings (common.BENCH_CONFIG) with merge.enabled; per-sample rules "
        f"summed over samples, peak memory the largest; {args.cores} cores.",
    )
