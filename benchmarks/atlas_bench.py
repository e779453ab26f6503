"""The atlas steps of issue 46 at scale, per backend: scVI (ours against scvi-tools' defaults), scIB, CellTypist.

    python benchmarks/atlas_bench.py --cells 1000000 --genes 2000 --backends gpu [--scvi-defaults]
        [--celltypist-train-cells 20000] [--results benchmarks/RESULTS.md]

A generated study (:func:`omicsprep.testing.study.generate_study`: 3 batches, 12 planted
types, one batch lacking one) of ``--cells`` cells x ``--genes`` genes, every gene taken as
highly variable (the 2,000 HVGs of the issue's goal). Per backend: PCA (the baseline
embedding), scVI as the merge trains it (:func:`omicsprep.rna.latent.scvi`) and, with
``--scvi-defaults``, scVI with scvi-tools' own training settings on the same device (batches
of 128, float32), each with its training seconds, epochs, cells per second per epoch,
held-out ELBO and the process's peak resident memory so far; scIB's metrics of the
embeddings (:mod:`omicsprep.rna.integration_scores`) and their seconds; CellTypist with a
model trained on ``--celltypist-train-cells`` cells of the first batch, its seconds and its
labels' agreement with CellTypist's own on those cells. The table goes to ``--results``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import append_results, versions  # noqa: E402

from omicsprep.backend import resolve_backend, to_device, to_host  # noqa: E402
from omicsprep.options import ScviOptions  # noqa: E402
from omicsprep.rna import annotation, integration_scores, latent, preprocessing  # noqa: E402
from omicsprep.testing.study import generate_study  # noqa: E402


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def study(n_cells: int, n_genes: int) -> ad.AnnData:
    """The generated study as one AnnData: raw counts in X and layers["counts"], every gene an HVG."""
    cells = ad.concat(generate_study(n_cells=n_cells // 3, n_genes=n_genes, seed=0), label="sample")
    cells.layers["counts"] = cells.X.copy()
    cells.var["highly_variable"] = True
    return cells


def trained(model: object, seconds: float, cells: ad.AnnData) -> dict[str, float]:
    epochs = len(model.history["elbo_train"])  # type: ignore[attr-defined]
    elbo = model.get_elbo(indices=model.validation_indices)  # type: ignore[attr-defined]
    return {
        "seconds": round(seconds, 2),
        "epochs": epochs,
        "cells_per_s_per_epoch": round(cells.n_obs * epochs / seconds),
        "heldout_elbo": round(float(elbo), 3),
        "peak_rss_mb": peak_rss_mb(),
    }


def scvi_defaults(cells: ad.AnnData, *, options: ScviOptions, backend: str) -> tuple[object, float]:
    """Train scVI with the merge's network on scvi-tools' own training settings (batch 128, float32)."""
    import scvi

    scvi.settings.seed = 0
    counts = ad.AnnData(cells.layers["counts"], obs=cells.obs[["sample"]])
    scvi.model.SCVI.setup_anndata(counts, batch_key="sample")
    model = scvi.model.SCVI(
        counts, n_latent=options.n_latent, n_hidden=options.n_hidden, n_layers=options.n_layers,
        gene_likelihood=options.gene_likelihood,
    )  # fmt: skip
    start = time.perf_counter()
    accelerator = "gpu" if backend == "gpu" else "cpu"
    model.train(max_epochs=options.max_epochs, accelerator=accelerator, enable_progress_bar=False)  # batches of 128
    return model, time.perf_counter() - start


def bench(
    cells: ad.AnnData, *, backend: str, defaults: bool, train_cells: int, max_epochs: int | None, batch_size: int
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    options = ScviOptions(max_epochs=max_epochs, batch_size=batch_size)
    start = time.perf_counter()
    to_device(cells, backend=backend)
    preprocessing.normalize(cells, target_sum=1e4, backend=backend)
    preprocessing.pca(cells, n_comps=50, seed=0, backend=backend)
    to_host(cells)
    rows.append({"step": "pca", "seconds": round(time.perf_counter() - start, 2)})
    start = time.perf_counter()
    model = latent.scvi(cells, batch_key="sample", options=options, seed=0, backend=backend)
    rows.append({"step": "scvi (the merge's)", **trained(model, time.perf_counter() - start, cells)})
    embeddings = ["X_pca", "X_scvi"]
    if defaults:
        model, seconds = scvi_defaults(cells, options=options, backend=backend)
        cells.obsm["X_scvi_defaults"] = np.asarray(model.get_latent_representation(), dtype=np.float32)
        rows.append({"step": "scvi (scvi-tools' defaults)", **trained(model, seconds, cells)})
        embeddings.append("X_scvi_defaults")
    start = time.perf_counter()
    table = integration_scores.scib_table(
        integration_scores.scib_benchmarker(
            cells, embeddings=embeddings, batch_key="sample", label_key="cell_type", backend=backend
        )
    )
    rows.append({"step": f"scib ({len(embeddings)} embeddings)", "seconds": round(time.perf_counter() - start, 2)})
    rows += [{"step": f"scib total {row.embedding}", "value": round(row.Total, 4)} for row in table.itertuples()]
    first = cells[cells.obs["sample"] == "batch0"][:train_cells].copy()
    import celltypist

    model = celltypist.train(
        annotation.log_cp10k(first), labels=first.obs["cell_type"].astype(str).to_numpy(), check_expression=False,
        use_SGD=True, max_iter=100, n_jobs=-1, random_state=0,
    )  # fmt: skip
    start = time.perf_counter()
    annotation.celltypist(cells, model=model, clusters=None, backend=backend)
    rows.append({"step": "celltypist", "seconds": round(time.perf_counter() - start, 2)})
    theirs = celltypist.annotate(annotation.log_cp10k(first), model=model).predicted_labels["predicted_labels"]
    ours = cells.obs.loc[first.obs_names, "cell_type_predicted"].astype(str).to_numpy()
    rows.append({"step": "celltypist labels equal to its own", "value": float((ours == theirs.astype(str)).mean())})
    return [{"backend": backend, **row} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=30_000)
    parser.add_argument("--genes", type=int, default=2_000)
    parser.add_argument("--backends", nargs="+", default=["cpu"], choices=["cpu", "gpu"])
    parser.add_argument("--scvi-defaults", action="store_true", help="also train with scvi-tools' own settings")
    parser.add_argument("--celltypist-train-cells", type=int, default=20_000)
    parser.add_argument("--max-epochs", type=int, help="scVI's epochs at most (default: scvi-tools' choice)")
    parser.add_argument("--batch-size", type=int, default=128, help="the merge's scVI cells per training step")
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    rows = []
    for backend in args.backends:
        cells = study(args.cells, args.genes)
        rows += bench(
            cells,
            backend=resolve_backend(backend),
            defaults=args.scvi_defaults,
            train_cells=args.celltypist_train_cells,
            max_epochs=args.max_epochs,
            batch_size=args.batch_size,
        )
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    if args.results:
        note = f"{versions()}. {args.cells:,} generated cells x {args.genes:,} genes (3 batches, 12 types)."
        append_results(args.results, title=f"The atlas steps, {args.cells:,} cells", note=note, table=table)


if __name__ == "__main__":
    main()
