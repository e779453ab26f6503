"""Where Scrublet's seconds go in one group of cells: each stage of ``doublets.scrublet``, timed.

    python -m benchmarks doublets --cells 20000 --backends cpu gpu [--repeats 3] [--warm-up-cells 2000]
    python -m benchmarks doublets --cells 20000 --backends gpu --groups 8 --threads 1 2 4

A sample scored in groups (``doublets.max_cells_per_run``, 20,000 by default) repeats these
stages once per group: 50 times at 1M cells. Generated counts (``generate.py``) of
``--cells`` cells are scored ``--repeats`` times on each backend, each time twice: first
with each stage timed, then unmeasured (``plain_total``). The first GPU repeat shows what a
process's first group costs beyond the others (kernels compiled or loaded, libraries'
handles), stage by stage; ``--warm-up-cells`` first scores a group of that many generated
cells, as a worker of the GPU pool has (:mod:`omicsprep.pool`). Each stage's seconds are inclusive
(the PCA's fit is inside the embedding), measured with the device synchronized before and
after, which the pipeline does not do: the total is slightly above an unmeasured call's.

With ``--groups``, the question is instead whether a sample's groups, scored one after another
by ``qc.score_doublets``, gain from being scored side by side: ``--groups`` groups of
``--cells`` cells (each its own seed) are scored in a pool of each of ``--threads`` threads,
after one unmeasured pass, and each pass's scores are compared with one thread's.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict

import pandas as pd

from omicsprep.testing.generate import generate


def timed_stages(backend: str, seconds: dict[str, float]) -> list[tuple[object, str, object]]:
    """Wrap the stages of ``doublets.scrublet`` with synchronized timers; returns what to restore."""
    from omicsprep.backend import cuml, cupy, single_cell_api
    from omicsprep.rna import doublets

    synchronize = cupy().cuda.Device().synchronize if backend == "gpu" else lambda: None
    if backend == "gpu":
        pca, search = cuml().decomposition.PCA, cuml().neighbors.NearestNeighbors
    else:
        from sklearn.decomposition import PCA as pca
        from sklearn.neighbors import NearestNeighbors as search
    api = single_cell_api(backend)
    targets = [
        (doublets, name, name.strip("_"))
        for name in ("AnnData", "_expressed", "doublet_pairs", "_embed", "_neighbour_scores", "_threshold")
    ]
    targets += [(api.pp, name, name) for name in ("normalize_total", "log1p", "highly_variable_genes")]
    targets += [(pca, "fit", "pca_fit"), (pca, "transform", "pca_transform")]
    targets += [(search, "fit", "neighbours_fit"), (search, "kneighbors", "neighbours_search")]
    restore = []
    for owner, name, label in targets:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, _original=original, _label=label, **kwargs):
            synchronize()
            start = time.perf_counter()
            result = _original(*args, **kwargs)
            synchronize()
            seconds[_label] += time.perf_counter() - start
            return result

        restore.append((owner, name, original))
        setattr(owner, name, wrapper)
    return restore


def measure(counts, *, backend: str, repeats: int, warm_up_cells: int) -> pd.DataFrame:
    from omicsprep.backend import cupy, cupyx_sparse
    from omicsprep.rna import doublets

    on_device = cupyx_sparse().csr_matrix if backend == "gpu" else lambda matrix: matrix
    synchronize = cupy().cuda.Device().synchronize if backend == "gpu" else lambda: None
    if warm_up_cells:
        start = time.perf_counter()
        small = on_device(generate(warm_up_cells, counts.shape[1], seed=1))
        doublets.scrublet(small, expected_rate=0.06, n_comps=30, seed=0, backend=backend)
        synchronize()
        print(f"{backend}: warmed up on {warm_up_cells} cells in {time.perf_counter() - start:.2f} s", flush=True)
    matrix = on_device(counts)
    rows = []
    for repeat in range(repeats):
        seconds: dict[str, float] = defaultdict(float)
        restore = timed_stages(backend, seconds)
        try:
            synchronize()
            start = time.perf_counter()
            doublets.scrublet(matrix, expected_rate=0.06, n_comps=30, seed=repeat, backend=backend)
            synchronize()
            seconds["total"] = time.perf_counter() - start
        finally:
            for owner, name, original in restore:
                setattr(owner, name, original)
        start = time.perf_counter()
        doublets.scrublet(matrix, expected_rate=0.06, n_comps=30, seed=repeat, backend=backend)
        synchronize()
        rows.append({"backend": backend, "repeat": repeat, "plain_total": time.perf_counter() - start, **seconds})
    return pd.DataFrame(rows)


def groups_in_threads(counts, *, backend: str, n_groups: int, threads: list[int]) -> pd.DataFrame:
    """Seconds to score ``n_groups`` groups (seeds 0, 1, ...) in a pool of each of ``threads`` threads."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from omicsprep.backend import cupy, cupyx_sparse
    from omicsprep.rna import doublets

    matrix = cupyx_sparse().csr_matrix(counts) if backend == "gpu" else counts
    synchronize = cupy().cuda.Device().synchronize if backend == "gpu" else lambda: None

    def score(seed: int) -> np.ndarray:
        return doublets.scrublet(matrix, expected_rate=0.06, n_comps=30, seed=seed, backend=backend).scores

    with ThreadPoolExecutor(max(threads)) as pool:  # unmeasured: compiles, loads, creates the handles
        list(pool.map(score, range(min(n_groups, max(threads)))))
    rows, reference = [], None
    for n_threads in threads:
        with ThreadPoolExecutor(n_threads) as pool:
            synchronize()
            start = time.perf_counter()
            scores = list(pool.map(score, range(n_groups)))
            synchronize()
            seconds = time.perf_counter() - start
        reference = scores if reference is None else reference
        differing = sum(int(np.sum(ours != theirs)) for ours, theirs in zip(scores, reference, strict=True))
        row = {"backend": backend, "groups": n_groups, "threads": n_threads, "seconds": seconds}
        rows.append(row | {"scores_differing": differing})
    return pd.DataFrame(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=20_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--backends", nargs="+", choices=["cpu", "gpu"], default=["cpu"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--warm-up-cells", type=int, default=0, help="first score one generated group of this many cells (0: none)"
    )
    parser.add_argument("--groups", type=int, default=0, help="score this many groups side by side instead (0: stages)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4], help="with --groups: pools' threads")


def run(args: argparse.Namespace) -> None:
    counts = generate(args.cells, args.genes, seed=0)
    print(f"{args.cells} cells x {args.genes} genes, {counts.nnz} non-zeros")
    if args.groups:
        threads = sorted(set(args.threads) | {1})  # one thread's scores are the reference
        table = pd.concat(
            [groups_in_threads(counts, backend=b, n_groups=args.groups, threads=threads) for b in args.backends]
        )
        print(table.round(3).to_markdown(index=False))
        return
    table = pd.concat(
        [
            measure(counts, backend=backend, repeats=args.repeats, warm_up_cells=args.warm_up_cells)
            for backend in args.backends
        ]
    )
    columns = ["backend", "repeat", "plain_total", "total"]
    table = table[columns + sorted(set(table.columns) - set(columns))].round(4)
    print(table.T.to_markdown())
