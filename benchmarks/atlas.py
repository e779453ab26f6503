"""The atlas steps of issue 46 at scale: scVI (the merge's training against scvi-tools' defaults), scIB, CellTypist.

    python -m benchmarks atlas --cells 1000000 --backend gpu --cache /tmp/atlas
        --parts ours celltypist scib_check [--batch-sizes 0 4096] [--results atlas.md]
    python -m benchmarks atlas --cells 1000000 --backend gpu --cache /tmp/atlas --parts defaults scib

A generated study (:func:`omicsprep.testing.study.generate_study`: 3 batches, 12 planted
types, one batch lacking one) of ``--cells`` cells x ``--genes`` genes, every gene taken as
highly variable (the 2,000 HVGs of the issue's goal), kept in ``--cache`` with each part's
embeddings and models, so that the parts can run in separate processes (a device call has
10 minutes). Parts:

ours
    scVI as the merge trains it (:func:`omicsprep.rna.latent.scvi`) at each of
    ``--batch-sizes`` (0: the merge's default; ``4096:16``: 4,096 cells a step for 16 epochs):
    seconds, epochs, cells per second per epoch,
    the host memory the training added against the HVG counts' size, and where a step's
    time goes (gathering the batch, forward pass and loss, backward pass, optimizer; the rest
    of the measured step is Lightning's loop, logging and validation).
harmony
    Harmony (:func:`omicsprep.rna.integration.harmony`, the merge's settings) on the PCA: its
    seconds, and a fourth embedding for scIB.
scanvi
    scANVI trained from ``ours``' model of the merge's default batch size with the last batch's
    labels unknown, as the merge trains it: seconds, epochs, the share of that batch labelled
    right, and a fourth embedding for scIB (with PCA, Harmony and scVI: the merge's four).
defaults
    scVI with scvi-tools' own training (its data loading, batches of 128, float32) on the
    same device and network; then the held-out ELBO of every model on the cells that none
    trained on.
held_out
    The held-out ELBO of every cached model of ``ours`` on the cells that none of them and
    scvi-tools' defaults (whose split is drawn again, without training) trained on: the
    cells and number of ``defaults``' rows, so a batch size is compared with the defaults'
    recorded ELBO without their 9 minutes of training.
scib
    scIB's metrics (:mod:`omicsprep.rna.integration_scores`) of every embedding in the cache,
    and their seconds.
scib_profile
    Where one embedding's scIB time goes (``X_pca``): the neighbour search's parts (the
    IVF-Flat bounds, :func:`omicsprep.rna.embedding.exact_neighbors_and_label_sums`, the copy
    to the host, scib-metrics' subsets), kBET per label, and one label's parts (its graph,
    components, diffusion map, its neighbours' bounds, the cells within them by the pass and by
    matrix products, its exact search), the silhouettes' pass, our k-means (twice: the first
    compiles), NMI and ARI, and a ``gc.collect()`` (scib-metrics runs one before each metric).
scib_check
    scIB's metrics on 20,000 of the cells: ours on the backend against scib-metrics' own
    ``Benchmarker`` with exact neighbours on the CPU (largest difference).
silhouettes
    One pass of the silhouettes' sums (each cell's distance to every cell of each type) over
    each cached embedding by the backend's way (the GPU's kernel), timed after its compile,
    and, on the GPU, its largest relative difference from the CPU's matrix products on 100,000
    of the cells.
celltypist
    CellTypist with a model trained on ``--celltypist-train-cells`` cells of the first
    batch: seconds, and agreement with CellTypist's own labels of all the cells.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anndata as ad
import numpy as np
import pandas as pd

from benchmarks.common import append_results, versions
from omicsprep.backend import resolve_backend, to_device, to_host
from omicsprep.options import HarmonyOptions, ScanviOptions, ScviOptions
from omicsprep.rna import annotation, integration, integration_scores, latent, preprocessing
from omicsprep.testing.scib_reference import scib_metrics_own
from omicsprep.testing.study import generate_study

if TYPE_CHECKING:
    from collections.abc import Iterator

PARTS = (
    "ours", "harmony", "scanvi", "defaults", "held_out", "scib", "scib_profile", "scib_check", "silhouettes",
    "celltypist",
)  # fmt: skip


def study(n_cells: int, n_genes: int, cache: Path) -> ad.AnnData:
    """The generated study as one AnnData (raw counts in X and layers["counts"], every gene an HVG), cached."""
    path = cache / "study.h5ad"
    if path.exists():
        return ad.read_h5ad(path)
    batches = generate_study(n_cells=n_cells // 3, n_genes=n_genes, seed=0, jobs=os.cpu_count() or 1)
    cells = ad.concat(batches, label="sample")
    cells.layers["counts"] = cells.X.copy()
    cells.var["highly_variable"] = True
    cells.write_h5ad(path)
    return cells


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextmanager
def host_memory_peak() -> Iterator[dict[str, float]]:
    """The resident memory added at peak while the block runs (sampled every 20 ms), in MB."""
    found = {"added_mb": 0.0}
    start, done = rss_mb(), threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            found["added_mb"] = max(found["added_mb"], rss_mb() - start)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield found
    finally:
        done.set()
        sampler.join()
        found["added_mb"] = round(max(found["added_mb"], rss_mb() - start), 1)


def trained(model: Any, seconds: float, n_cells: int) -> dict[str, Any]:
    epochs = len(model.history["elbo_train"])
    return {"seconds": round(seconds, 2), "epochs": epochs, "cells_per_s_per_epoch": round(n_cells * epochs / seconds)}


def step_breakdown(model: Any, *, batch_size: int, learning_rate: float, steps: int = 50) -> dict[str, float]:
    """Milliseconds per step of gathering a device-resident batch, forward and loss, backward, and Adam's update."""
    import torch

    from omicsprep.rna.resident_batches import ResidentDataModule

    sync = torch.cuda.synchronize
    sync()
    start = time.perf_counter()
    data = ResidentDataModule(model, batch_size=batch_size, seed=0, device=torch.device("cuda"))
    sync()
    to_device_s = time.perf_counter() - start
    module = copy.deepcopy(model.module).train()
    optimizer = torch.optim.Adam(module.parameters(), lr=learning_rate, eps=0.01, weight_decay=1e-6)
    batches = iter(data.train_dataloader())

    def timed(step: Any) -> float:
        step()  # once unmeasured: allocations, autotuning
        sync()
        begin = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        return round((time.perf_counter() - begin) / steps * 1e3, 3)

    batch = next(batches)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        forward = timed(lambda: module(batch, loss_kwargs={"kl_weight": 1.0})[2].loss)
        loss = lambda: module(batch, loss_kwargs={"kl_weight": 1.0})[2].loss  # noqa: E731
        forward_backward = timed(lambda: loss().backward())
    return {
        "to_device_s": round(to_device_s, 2),
        "gather_ms": timed(lambda: next(batches)),
        "forward_ms": forward,
        "backward_ms": round(forward_backward - forward, 3),
        "adam_ms": timed(optimizer.step),
    }


def part_ours(cells: ad.AnnData, *, batch_sizes: list[str], backend: str, cache: Path) -> list[dict[str, Any]]:
    rows = []
    counts = cells.layers["counts"]
    counts_mb = round((counts.data.nbytes + counts.indices.nbytes + counts.indptr.nbytes) / 2**20, 1)
    for setting in batch_sizes:
        batch_size, _, epochs = setting.partition(":")
        options = ScviOptions(batch_size=int(batch_size) or None, max_epochs=int(epochs) if epochs else None)
        steps = latent.training_steps(options, n_cells=cells.n_obs, backend=backend)
        start = time.perf_counter()
        with host_memory_peak() as memory:
            model = latent.scvi(cells, batch_key="sample", options=options, seed=0, backend=backend)
        seconds = time.perf_counter() - start
        name = f"scvi_b{steps[0]}" + (f"_e{epochs}" if epochs else "")
        np.save(cache / f"X_{name}.npy", cells.obsm["X_scvi"])
        model.save(str(cache / name), overwrite=True)
        n_steps = len(model.history["elbo_train"]) * -(-len(model.train_indices) // steps[0])
        row = {
            "step": f"scvi, the merge's (batch {steps[0]}, lr {steps[1]:.2g})",
            **trained(model, seconds, cells.n_obs),
            "ms_per_step": round(seconds / n_steps * 1e3, 3),
            "host_added_mb": memory["added_mb"],
            "hvg_counts_mb": counts_mb,
        }
        if backend == "gpu":
            row |= step_breakdown(model, batch_size=steps[0], learning_rate=steps[1])
        rows.append(row)
        print(row, flush=True)
    return rows


def part_harmony(cells: ad.AnnData, *, backend: str, cache: Path) -> list[dict[str, Any]]:
    settings = HarmonyOptions()
    start = time.perf_counter()
    integration.harmony(
        cells, key="sample", theta=settings.theta, max_iter=settings.max_iter, seed=0, backend=backend
    )  # fmt: skip
    seconds = time.perf_counter() - start
    np.save(cache / "X_harmony.npy", np.asarray(cells.obsm["X_harmony"], dtype=np.float32))
    return [{"step": "harmony, the merge's", "seconds": round(seconds, 2)}]


def part_scanvi(cells: ad.AnnData, *, backend: str, cache: Path) -> list[dict[str, Any]]:
    import scvi

    steps = latent.training_steps(ScviOptions(), n_cells=cells.n_obs, backend=backend)
    scvi_model = scvi.model.SCVI.load(str(cache / f"scvi_b{steps[0]}"), adata=latent_counts(cells))
    held_out = (cells.obs["sample"] == cells.obs["sample"].cat.categories[-1]).to_numpy()
    cells.obs["known_type"] = cells.obs["cell_type"].astype(str).where(~held_out, latent.UNLABELLED)
    start = time.perf_counter()
    model = latent.scanvi(
        cells, scvi_model=scvi_model, label_key="known_type", options=ScanviOptions(), steps=steps, seed=0,
        backend=backend,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    np.save(cache / "X_scanvi.npy", cells.obsm["X_scanvi"])
    predicted = cells.obs["known_type_scanvi"].astype(str).to_numpy()
    accuracy = float((predicted[held_out] == cells.obs["cell_type"].astype(str).to_numpy()[held_out]).mean())
    return [
        {
            "step": f"scanvi from scvi_b{steps[0]} (batch {steps[0]}), the last batch's labels unknown",
            "seconds": round(seconds, 2),
            "epochs": len(model.history["elbo_train"]),
            "value": f"held-out batch labelled right: {accuracy:.4f}",
        }
    ]


def scvi_tools_counts(cells: ad.AnnData) -> ad.AnnData:
    import scvi

    counts = ad.AnnData(cells.layers["counts"], obs=cells.obs[["sample"]])
    scvi.model.SCVI.setup_anndata(counts, batch_key="sample")
    return counts


def part_defaults(cells: ad.AnnData, *, backend: str, cache: Path) -> list[dict[str, Any]]:
    """scvi-tools' own training on the merge's network; every cached model's ELBO on cells none trained on."""
    import scvi

    options = ScviOptions()
    scvi.settings.seed = 0
    counts = scvi_tools_counts(cells)
    model = scvi.model.SCVI(
        counts, n_latent=options.n_latent, n_hidden=options.n_hidden, n_layers=options.n_layers,
        gene_likelihood=options.gene_likelihood,
    )  # fmt: skip
    start = time.perf_counter()
    with host_memory_peak() as memory:
        model.train(accelerator="gpu" if backend == "gpu" else "cpu", enable_progress_bar=False)  # batches of 128
    seconds = time.perf_counter() - start
    np.save(
        cache / "X_scvi_defaults.npy", np.asarray(model.get_latent_representation(batch_size=8192), dtype=np.float32)
    )
    rows = [
        {
            "step": "scvi, scvi-tools' defaults",
            **trained(model, seconds, cells.n_obs),
            "host_added_mb": memory["added_mb"],
        }
    ]
    print(rows[0], flush=True)
    return rows + held_out_elbos(cells, cache=cache, models={"scvi_defaults": model}, held_out=model.validation_indices)


def part_held_out(cells: ad.AnnData, *, cache: Path) -> list[dict[str, Any]]:
    """The held-out ELBO of ``ours``' cached models on the cells of scvi-tools' default split's validation set."""
    import scvi
    from scvi.dataloaders import DataSplitter

    scvi.settings.seed = 0  # part_defaults' seed, so its split
    counts = scvi_tools_counts(cells)
    splitter = DataSplitter(scvi.model.SCVI._get_most_recent_anndata_manager(counts))  # noqa: SLF001
    splitter.setup()
    return held_out_elbos(cells, cache=cache, models={}, held_out=splitter.val_idx)


def held_out_elbos(cells: ad.AnnData, *, cache: Path, models: dict[str, Any], held_out: Any) -> list[dict[str, Any]]:
    """Each model's and each cached model's ELBO on the cells of ``held_out`` that none of them trained on."""
    import scvi

    models = dict(models)
    for saved in sorted(cache.glob("scvi_b*")):
        models[saved.name] = scvi.model.SCVI.load(str(saved), adata=latent_counts(cells))
    cells_none_trained_on = set(np.asarray(held_out).tolist())
    for model in models.values():
        cells_none_trained_on &= set(model.validation_indices.tolist())
    indices = np.sort(np.fromiter(cells_none_trained_on, dtype=np.int64))
    rows = []
    for name, model in models.items():
        elbo = float(model.get_elbo(indices=indices, batch_size=4096))
        step = f"held-out ELBO, {name} ({indices.size:,} cells none trained on)"
        rows.append({"step": step, "value": round(elbo, 3)})
    return rows


def latent_counts(cells: ad.AnnData) -> ad.AnnData:
    """The AnnData the merge's scVI trains on (its HVG counts and batches), for loading its saved models."""
    counts = latent.hvg_counts(cells, batch_key="sample")
    import scvi

    scvi.model.SCVI.setup_anndata(counts, batch_key="batch")
    return counts


def cached_embeddings(cells: ad.AnnData, cache: Path) -> list[str]:
    names = []
    for path in sorted(cache.glob("X_*.npy")):
        cells.obsm[path.stem] = np.load(path)
        names.append(path.stem)
    return names


def part_scib(cells: ad.AnnData, *, backend: str, cache: Path) -> list[dict[str, Any]]:
    embeddings = cached_embeddings(cells, cache)
    start = time.perf_counter()
    table = integration_scores.scib_table(
        integration_scores.scib_benchmarker(
            cells, embeddings=embeddings, batch_key="sample", label_key="cell_type", backend=backend
        )
    )
    rows: list[dict[str, Any]] = [
        {
            "step": f"scib ({len(embeddings)} embeddings, {cells.n_obs:,} cells)",
            "seconds": round(time.perf_counter() - start, 2),
        }
    ]
    for row in table.to_dict("records"):
        scores = ", ".join(f"{name} {row[name]:.4f}" for name in integration_scores.AGGREGATES)
        rows.append({"step": f"scib {row['embedding']}", "value": scores})
    table.to_csv(cache / "scib.tsv", sep="\t", index=False)
    return rows


def part_scib_profile(cells: ad.AnnData, *, backend: str, cache: Path) -> list[dict[str, Any]]:
    """Seconds of the parts of one embedding's scIB metrics that lead at a million cells.

    (cuML's and cuVS's brute-force searches of 90 neighbours, profiled here until 2026-12-06: 11.2
    and 11.1 s on an H100, RESULTS.md.)
    """
    import gc

    import scib_metrics
    import scipy.sparse.csgraph
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from omicsprep.backend import array_module, asnumpy, synchronize
    from omicsprep.rna.embedding import exact_neighbors, exact_neighbors_and_label_sums

    xp, rows = array_module(backend), []

    def timed(step: str, function: Any) -> Any:
        synchronize(backend=backend)
        start = time.perf_counter()
        result = function()
        synchronize(backend=backend)
        rows.append({"step": f"scib_profile: {step}", "seconds": round(time.perf_counter() - start, 3)})
        print(rows[-1], flush=True)
        return result

    embedding = cells.obsm["X_pca"].astype(np.float32)
    labels = pd.Categorical(cells.obs["cell_type"].astype(str)).codes
    batches = pd.Categorical(cells.obs["sample"].astype(str)).codes
    if backend == "gpu":
        from omicsprep.backend import cuml
        from omicsprep.rna import neighbors_cuda

        bounds_of = neighbors_cuda._upper_bounds  # noqa: SLF001
        timed("exact neighbours' IVF-Flat bounds", lambda: bounds_of(xp.asarray(embedding), 90, xp=xp, cuml=cuml()))
    indices, distances, _ = timed(
        "exact neighbours and the silhouettes' sums (bounds, pass over pairs, order)",
        lambda: exact_neighbors_and_label_sums(embedding, 90, labels=labels, backend=backend),
    )
    neighbours = timed(
        "to scib-metrics' NeighborsResults on the host",
        lambda: integration_scores._neighbors_on_host(indices, distances, backend=backend),  # noqa: SLF001
    )
    for_kbet = timed(
        "scib-metrics' subsets of 15, 50, 90", lambda: [neighbours.subset_neighbors(n=n) for n in (15, 50, 90)]
    )[1]
    with integration_scores._steps_on_backend(backend, integration_scores.SilhouetteMemory(backend)):  # noqa: SLF001
        timed("kBET per label", lambda: scib_metrics.kbet_per_label(for_kbet, batches, labels))
    # kBET's search per label: one label's diffusion map and its neighbours' parts (scib-metrics' k0 at most 70).
    graph = for_kbet.connectivities_on_device if backend == "gpu" else for_kbet.knn_graph_connectivities
    members = np.flatnonzero(labels == 0)
    one_label = timed(
        "kBET: one label's part of the graph",
        lambda: integration_scores._rows_and_columns(graph, members, backend=backend),  # noqa: SLF001
    )
    timed(
        "kBET: its connected components (host)",
        lambda: scipy.sparse.csgraph.connected_components(asnumpy(one_label), connection="strong"),
    )
    mapped = timed(
        f"kBET: one label's diffusion map ({members.size:,} cells)",
        lambda: integration_scores.diffusion_map(one_label, 100, backend=backend),
    )
    if backend == "gpu":
        from omicsprep.rna import pairs_cuda

        bounds = timed("kBET: its 71 neighbours' bounds", lambda: bounds_of(mapped, 71, xp=xp, cuml=cuml()))
        read, limits = neighbors_cuda._pass_points_and_limits(mapped, bounds, xp=xp)  # noqa: SLF001
        one_code = xp.zeros(len(read), dtype=xp.int32)

        def within_by_the_pass(cells: slice) -> Any:
            return pairs_cuda.pair_sums_gpu(
                read[cells],
                one_code[cells],
                1,
                cosine=False,
                xp=xp,
                limits=limits[cells],
                max_candidates=neighbors_cuda.MAX_CANDIDATES,
            )

        within_by_the_pass(slice(0, 1000))  # compiles the pass for this width, which kBET does not take
        timed("kBET: the cells within them by the pass", lambda: within_by_the_pass(slice(None)))
        timed(
            "kBET: the cells within them by products",
            lambda: neighbors_cuda._within_bounds_by_products(mapped, bounds, xp=xp),  # noqa: SLF001
        )
    timed("kBET: its 71 exact neighbours", lambda: exact_neighbors(mapped, 71, backend=backend))
    timed("silhouettes alone", lambda: integration_scores.silhouette_samples(embedding, labels, backend=backend))
    n_clusters = len(np.unique(labels))
    timed("k-means, ours, first (compiles)", lambda: integration_scores.kmeans_labels(embedding, n_clusters))
    clusters = timed("k-means, ours, again", lambda: integration_scores.kmeans_labels(embedding, n_clusters))
    timed(
        "NMI and ARI (host, label codes)",
        lambda: (normalized_mutual_info_score(labels, clusters), adjusted_rand_score(labels, clusters)),
    )
    timed("gc.collect()", gc.collect)
    return rows


def part_scib_check(cells: ad.AnnData, *, backend: str, cache: Path, n_cells: int = 20_000) -> list[dict[str, Any]]:
    """Ours on the backend against scib-metrics' Benchmarker (exact neighbours, CPU) on a sample of the cells."""
    cached_embeddings(cells, cache)
    n_cells = min(n_cells, cells.n_obs)
    sample = cells[np.random.default_rng(0).choice(cells.n_obs, n_cells, replace=False)].copy()
    embeddings = [*[name for name in sample.obsm if name != "X_pca"][:1], "X_pca"]
    ours = integration_scores.scib_table(
        integration_scores.scib_benchmarker(
            sample, embeddings=embeddings, batch_key="sample", label_key="cell_type", backend=backend
        )
    ).set_index("embedding")
    reference = scib_metrics_own(sample, batch_key="sample", label_key="cell_type", embeddings=embeddings)
    numeric = ours.select_dtypes("number")
    reference = reference.loc[numeric.index, [column for column in numeric.columns if column in reference.columns]]
    differences = (numeric[reference.columns] - reference).abs().max()
    return [
        {
            "step": f"scib on {n_cells:,} cells, largest difference from scib-metrics' own",
            "value": f"{differences.max():.2e} ({differences.idxmax()})",
        }
    ]


def part_silhouettes(
    cells: ad.AnnData, *, backend: str, cache: Path, compared_cells: int = 100_000
) -> list[dict[str, Any]]:
    """The silhouettes' sums of all cells over each cached embedding by the backend's way, timed.

    On the GPU, the kernel is checked against the matrix products (the CPU's way, 53 s a million
    cells on one H100) on the first ``compared_cells``.
    """
    from omicsprep.backend import array_module, asnumpy, synchronize

    xp = array_module(backend)
    codes = pd.Categorical(cells.obs["cell_type"]).codes.astype(np.int64)
    n_labels, rows = int(codes.max()) + 1, []
    sums_of, way = integration_scores.label_distance_sums, "matrix products"
    if backend == "gpu":
        from omicsprep.rna import pairs_cuda

        def sums_of(points: Any, labels: Any, n_labels: int, *, cosine: bool, xp: Any) -> Any:
            return pairs_cuda.pair_sums_gpu(points, labels, n_labels, cosine=cosine, xp=xp).sums

        way = "kernel"
    labels = xp.asarray(codes)
    for name in cached_embeddings(cells, cache):
        points = xp.asarray(cells.obsm[name], dtype=xp.float32)
        points = points - points.mean(axis=0)
        compared = sums_of(points[:compared_cells], labels[:compared_cells], n_labels, cosine=False, xp=xp)  # compiles
        synchronize(backend=backend)
        start = time.perf_counter()
        sums_of(points, labels, n_labels, cosine=False, xp=xp)
        synchronize(backend=backend)
        rows.append({"step": f"silhouette sums, {name} ({points.shape[1]} dims, {points.shape[0]:,} cells), {way}",
                     "seconds": round(time.perf_counter() - start, 2)})  # fmt: skip
        if backend == "gpu":
            ours = asnumpy(compared).astype(np.float64)
            products = asnumpy(
                integration_scores.label_distance_sums(
                    points[:compared_cells], labels[:compared_cells], n_labels, cosine=False, xp=xp
                )
            )
            difference = np.abs(ours - products) / np.maximum(ours, 1e-12)
            rows.append({"step": f"silhouette sums, {name}, {way} against products on {ours.shape[0]:,} cells",
                         "value": f"{difference.max():.2e}"})  # fmt: skip
    return rows


def part_celltypist(cells: ad.AnnData, *, backend: str, train_cells: int) -> list[dict[str, Any]]:
    import celltypist

    first = cells[cells.obs["sample"] == "batch0"][:train_cells].copy()
    model = celltypist.train(
        annotation.log_cp10k(first), labels=first.obs["cell_type"].astype(str).to_numpy(), check_expression=False,
        use_SGD=True, max_iter=100, n_jobs=-1, random_state=0,
    )  # fmt: skip
    start = time.perf_counter()
    annotation.celltypist(cells, model=model, clusters=None, backend=backend)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    theirs = celltypist.annotate(annotation.log_cp10k(cells), model=model).predicted_labels["predicted_labels"]
    their_seconds = time.perf_counter() - start
    same = float((cells.obs["cell_type_predicted"].astype(str).to_numpy() == theirs.astype(str).to_numpy()).mean())
    return [
        {"step": f"celltypist, ours on {backend}", "seconds": round(seconds, 2)},
        {"step": "celltypist, its own annotate (CPU)", "seconds": round(their_seconds, 2)},
        {"step": "celltypist labels equal to its own", "value": same},
    ]


def with_pca(cells: ad.AnnData, *, backend: str, cache: Path) -> None:
    path = cache / "X_pca.npy"
    if path.exists():
        cells.obsm["X_pca"] = np.load(path)
        return
    # Genes without a count (a small study has some) have no place in a PCA; rapids-singlecell refuses them.
    normalized = cells[:, np.asarray(cells.X.sum(axis=0)).ravel() > 0].copy()
    to_device(normalized, backend=backend)
    preprocessing.normalize(normalized, target_sum=1e4, backend=backend)
    preprocessing.pca(normalized, n_comps=50, seed=0, backend=backend)
    to_host(normalized)
    cells.obsm["X_pca"] = normalized.obsm["X_pca"]
    np.save(path, cells.obsm["X_pca"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=int, default=30_000)
    parser.add_argument("--genes", type=int, default=2_000)
    parser.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/omicsprep-atlas"))
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument(
        "--batch-sizes", nargs="+", default=["0"], help="the merge's scVI: cells a step (0: its default)[:epochs]"
    )
    parser.add_argument("--celltypist-train-cells", type=int, default=20_000)
    parser.add_argument("--results", type=Path)


def run(args: argparse.Namespace) -> None:
    # The steps' own seconds (scIB's per metric, kBET's per label) are omicsprep's INFO lines.
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("omicsprep").setLevel(logging.INFO)
    cache = args.cache / f"{args.cells}x{args.genes}"
    cache.mkdir(parents=True, exist_ok=True)
    backend = resolve_backend(args.backend)
    start = time.perf_counter()
    cells = study(args.cells, args.genes, cache)
    with_pca(cells, backend=backend, cache=cache)
    rows: list[dict[str, Any]] = [
        {"step": "study generated or read, PCA", "seconds": round(time.perf_counter() - start, 2)}
    ]
    for part in args.parts:
        if part == "ours":
            rows += part_ours(cells, batch_sizes=args.batch_sizes, backend=backend, cache=cache)
        elif part == "harmony":
            rows += part_harmony(cells, backend=backend, cache=cache)
        elif part == "scanvi":
            rows += part_scanvi(cells, backend=backend, cache=cache)
        elif part == "defaults":
            rows += part_defaults(cells, backend=backend, cache=cache)
        elif part == "held_out":
            rows += part_held_out(cells, cache=cache)
        elif part == "scib":
            rows += part_scib(cells, backend=backend, cache=cache)
        elif part == "silhouettes":
            rows += part_silhouettes(cells, backend=backend, cache=cache)
        elif part == "scib_profile":
            rows += part_scib_profile(cells, backend=backend, cache=cache)
        elif part == "scib_check":
            rows += part_scib_check(cells, backend=backend, cache=cache)
        else:
            rows += part_celltypist(cells, backend=backend, train_cells=args.celltypist_train_cells)
        (cache / "rows.json").write_text(json.dumps(rows, default=str))
        print(pd.DataFrame(rows).to_string(index=False), flush=True)
    table = pd.DataFrame([{"backend": backend, **row} for row in rows])
    if args.results:
        note = f"{versions()}. {cells.n_obs:,} generated cells x {args.genes:,} genes (3 batches, 12 types)."
        append_results(args.results, title=f"The atlas steps, {args.cells:,} cells", note=note, table=table)
