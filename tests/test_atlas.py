"""The merge's integration methods (PCA, Harmony, scVI, scANVI), scIB's metrics and CellTypist's cell types.

On a generated study (:func:`omicsprep.testing.study.generate_study`): three batches of 800
cells with 12 planted cell types and a per-gene capture efficiency of their own, the last
batch lacking one type (``type00``) and its labels held out (``Unknown``) for scANVI to
predict. Compared with scvi-tools' own saved models; scIB's metrics against scib-metrics' own
benchmark are ``test_scib.py``'s.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from conftest import ATLAS_OPTIONS, CLUSTER_OPTIONS, train_celltypist_model
from matplotlib import image
from test_workflow import snakemake, write_sheet

from omicsprep import io
from omicsprep.configuration import check_settings_together
from omicsprep.errors import InputError
from omicsprep.rna import annotation
from omicsprep.rna.latent import UNLABELLED, known_labels
from omicsprep.rna.pipeline import run_merge
from omicsprep.testing.study import generate_study

OPTIONS = ATLAS_OPTIONS
METHODS = OPTIONS.integration.methods


@pytest.fixture(scope="module")
def merged(generated_study):
    import torch

    # One thread: the small model's steps are too short to share, and pytest's other process
    # has the other core.
    torch.set_num_threads(1)
    return run_merge(
        generated_study, options=OPTIONS, clustering_options=CLUSTER_OPTIONS, labels="leiden_1.0", seed=0, backend="cpu"
    )


def test_the_study_plants_types_batches_and_a_missing_type():
    batches = generate_study(n_batches=3, n_cells=600, n_genes=500, seed=1)
    assert list(batches) == ["batch0", "batch1", "batch2"]
    assert set(batches["batch0"].obs["cell_type"]) == {f"type{t:02d}" for t in range(12)}
    assert "type00" not in set(batches["batch2"].obs["cell_type"]) and batches["batch2"].n_obs < 600
    first, second = (batches[name].X.toarray() for name in ("batch0", "batch1"))
    # The same type differs between batches gene by gene (capture efficiency), not by a scale.
    ratio = (second[batches["batch1"].obs["cell_type"] == "type01"].mean(0) + 1) / (
        first[batches["batch0"].obs["cell_type"] == "type01"].mean(0) + 1
    )
    assert np.std(np.log(ratio[ratio > 0])) > 0.2
    again = generate_study(n_batches=3, n_cells=600, n_genes=500, seed=1)
    assert (again["batch2"].X != batches["batch2"].X).nnz == 0


def test_labels_survive_qc_and_the_merge(generated_study, merged):
    cells = merged.cells
    for name, batch in generated_study.items():
        of_batch = cells.obs.loc[cells.obs["sample"] == name]
        assert list(of_batch.index) == [f"{name}:{barcode}" for barcode in batch.obs_names]
        np.testing.assert_array_equal(of_batch["cell_type"].astype(str), batch.obs["cell_type"].astype(str))
    assert (known_labels(cells.obs.loc[cells.obs["sample"] == "batch2", "known_type"]) == UNLABELLED).all()


def test_every_method_writes_its_embedding_and_its_row(merged):
    cells, metrics = merged.cells, merged.metrics
    assert list(metrics["method"]) == list(METHODS)
    assert list(metrics["embedding"]) == [f"X_{method}" for method in METHODS]
    assert cells.obsm["X_harmony"].shape == cells.obsm["X_pca"].shape
    assert cells.obsm["X_scvi"].shape == cells.obsm["X_scanvi"].shape == (cells.n_obs, OPTIONS.scvi.n_latent)
    assert cells.uns["neighbors"]["params"]["use_rep"] == "X_scvi"  # integration.use
    assert set(merged.models) == {"scvi", "scanvi"}
    assert list(merged.models["scvi"].adata.var_names) == list(cells.var_names[cells.var["highly_variable"]])
    assert cells.uns["omicsprep"]["merge"]["timings"]["scvi"] > 0


def test_scvi_and_harmony_mix_the_batches_and_keep_the_types_apart(merged):
    metrics = merged.metrics.set_index("method")
    print(metrics.round(3).to_string())
    assert metrics.loc["pca", "batch_mixing"] < 0.2  # the capture efficiencies keep the batches apart
    assert metrics.loc["harmony", "batch_mixing"] > 0.8
    assert metrics.loc["scvi", "batch_mixing"] > 0.8
    assert metrics.loc["scvi", "Bio conservation"] > metrics.loc["harmony", "Bio conservation"] + 0.05
    assert metrics.loc["scvi", "KMeans ARI"] > 0.6
    assert metrics.loc["scanvi", "Total"] == metrics["Total"].max()


def test_scanvi_labels_the_held_out_batch_and_not_with_the_type_it_lacks(merged):
    cells = merged.cells
    held_out = cells.obs["sample"] == "batch2"
    predicted = cells.obs.loc[held_out, "known_type_scanvi"].astype(str)
    accuracy = (predicted == cells.obs.loc[held_out, "cell_type"].astype(str)).mean()
    print(f"scANVI accuracy on the held-out batch {accuracy:.4f}")
    assert accuracy >= 0.95
    assert (predicted == "type00").mean() < 0.02  # no cell of batch2 is of type00


def test_saved_models_load_again_and_give_the_same_latent_space(merged, tmp_path):
    import scvi

    io.write_models(merged.models, tmp_path / "models")
    assert sorted(path.name for path in (tmp_path / "models").iterdir()) == ["scanvi", "scvi"]
    counts = merged.models["scvi"].adata
    loaded = scvi.model.SCVI.load(str(tmp_path / "models" / "scvi"), adata=counts)
    np.testing.assert_allclose(loaded.get_latent_representation(), merged.cells.obsm["X_scvi"], atol=1e-5)
    labelled = merged.models["scanvi"].adata  # the scVI model's counts with the known labels beside
    scanvi = scvi.model.SCANVI.load(str(tmp_path / "models" / "scanvi"), adata=labelled)
    np.testing.assert_array_equal(scanvi.predict(), merged.cells.obs["known_type_scanvi"].astype(str))


def test_a_label_key_that_no_sample_has_is_one_clear_error(generated_study):
    options = replace(OPTIONS, integration=replace(OPTIONS.integration, methods=("pca",), use="pca", label_key="typo"))
    with pytest.raises(InputError, match=r"merge.integration.label_key 'typo' is not a per-cell column"):
        run_merge(
            generated_study,
            options=options,
            clustering_options=CLUSTER_OPTIONS,
            labels="leiden_1.0",
            seed=0,
            backend="cpu",
        )


@pytest.mark.parametrize(
    ("integration", "message"),
    [
        ({"methods": ["pca"], "use": "harmony"}, "use 'harmony' is not among the methods \\['pca'\\]"),
        ({"methods": ["pca", "scanvi"], "use": "pca", "label_key": "t"}, "scanvi starts from scvi's model"),
        ({"methods": ["scvi", "scanvi"], "use": "scvi", "label_key": ""}, "and needs label_key"),
    ],
)
def test_integration_settings_that_do_not_go_together_are_refused(integration, message):
    config = {
        "markers": {"algorithm": "leiden", "resolution": 1.0},
        "leiden": {"resolutions": [1.0]},
        "merge": {"enabled": True, "integration": integration},
        "neighbors": {"n_pcs": 30},
        "pca": {"n_comps": 50},
    }
    with pytest.raises(InputError, match=message):
        check_settings_together(config, rna_samples=["a", "b"])


@pytest.fixture(scope="module")
def celltypist_model(generated_study):
    return train_celltypist_model(generated_study["batch0"])


def test_celltypist_labels_another_batch_as_celltypist_does(generated_study, celltypist_model):
    """Trained on batch0, applied to batch1 (other capture efficiencies): our labels, confidences and
    majority votes over the sample's Leiden clusters are CellTypist's own annotate's."""
    import celltypist

    cells = generated_study["batch1"].copy()
    annotation.celltypist(cells, model=celltypist_model, clusters="leiden_1.0", backend="cpu")
    theirs = celltypist.annotate(
        annotation.log_cp10k(cells),
        model=celltypist_model,
        majority_voting=True,
        over_clustering=cells.obs["leiden_1.0"],
    )
    expected = theirs.to_adata().obs
    np.testing.assert_array_equal(
        cells.obs["cell_type_predicted"].astype(str), expected["predicted_labels"].astype(str)
    )
    np.testing.assert_array_equal(cells.obs["cell_type"].astype(str), expected["majority_voting"].astype(str))
    np.testing.assert_allclose(cells.obs["cell_type_confidence"], expected["conf_score"], rtol=1e-6, atol=1e-7)
    truth = generated_study["batch1"].obs["cell_type"].astype(str)
    accuracy = (cells.obs["cell_type_predicted"].astype(str) == truth).mean()
    print(f"CellTypist accuracy on another batch: {accuracy:.4f}")
    assert accuracy > 0.8
    assert cells.obs["cell_type"].nunique() <= cells.obs["leiden_1.0"].nunique()


def test_majority_vote_gives_each_cluster_its_most_frequent_label():
    labels = pd.Series(["a", "b", "b", "a", "c", "c", "a"], index=list("1234567"))
    clusters = pd.Series(["x", "x", "x", "y", "y", "y", "z"], index=labels.index)
    # x: b twice; y: c twice; z: a. Ties go to the first label in sorted order (y: c, c, a -> c).
    assert annotation.majority_vote(labels, clusters).tolist() == ["b", "b", "b", "c", "c", "c", "a"]
    tie = pd.Series(["b", "a"], index=["1", "2"])
    assert annotation.majority_vote(tie, pd.Series(["x", "x"], index=tie.index)).tolist() == ["a", "a"]


def test_a_model_that_shares_no_gene_is_one_clear_error(generated_study, celltypist_model):
    cells = generated_study["batch1"].copy()
    cells.var_names = [f"ENSG{i:011d}" for i in range(cells.n_vars)]
    with pytest.raises(
        ValueError,
        match=r"the cells share no gene with the CellTypist model \(\d+ genes, e.g. 'MT-G0'; the cells' e.g. 'ENSG0",
    ):
        annotation.celltypist(cells, model=celltypist_model, clusters=None, backend="cpu")


def test_scvi_trains_with_its_settings(generated_study, monkeypatch):
    """The merge's scVI settings reach scvi-tools: network, epochs, early stopping, cells per step, seed."""
    import scvi

    from omicsprep.options import ScviOptions
    from omicsprep.rna import latent

    asked = []
    train = scvi.model.SCVI.train

    def recorded(model, **kwargs):
        asked.append(kwargs)
        return train(model, **kwargs)

    monkeypatch.setattr(scvi.model.SCVI, "train", recorded)
    cells = generated_study["batch0"][:300].copy()
    options = ScviOptions(n_latent=7, n_hidden=16, n_layers=1, max_epochs=2, early_stopping=False, batch_size=64)
    model = latent.scvi(cells, batch_key="batch", options=options, seed=3, backend="cpu")
    assert asked == [
        {
            "max_epochs": 2,
            "early_stopping": False,
            "plan_kwargs": {"lr": pytest.approx(1e-3 * np.sqrt(0.5))},
            "enable_progress_bar": False,
            "batch_size": 64,
            "accelerator": "cpu",
        }
    ]
    assert cells.obsm["X_scvi"].shape == (300, 7) and len(model.history["elbo_train"]) == 2
    assert model.module.n_latent == 7 and scvi.settings.seed == 3
    assert list(model.adata.var_names) == list(cells.var_names[cells.var["highly_variable"]])


def test_scvi_and_scanvi_log_once_per_epoch_what_scvi_tools_logs_per_step(generated_study, monkeypatch):
    """The merge's training gives scvi-tools' own history and model, with Lightning's log called per epoch."""
    import scvi
    from lightning.pytorch import LightningModule

    from omicsprep.options import ScanviOptions, ScviOptions
    from omicsprep.rna import latent

    cells = generated_study["batch0"][:300].copy()
    cells.obs["known"] = np.where(np.arange(300) % 3 == 0, UNLABELLED, cells.obs["cell_type"].astype(str))
    options = ScviOptions(n_latent=4, n_hidden=16, n_layers=1, max_epochs=3, batch_size=32)
    steps = latent.training_steps(options, n_cells=300, backend="cpu")
    log, logged = LightningModule.log, []

    def counted(plan, name, *args, **kwargs):
        logged.append(name)
        log(plan, name, *args, **kwargs)

    monkeypatch.setattr(LightningModule, "log", counted)
    ours = latent.scvi(cells, batch_key="batch", options=options, seed=3, backend="cpu")
    ours_scanvi = latent.scanvi(
        cells, scvi_model=ours, label_key="known", options=ScanviOptions(max_epochs=2), steps=steps, seed=3,
        backend="cpu",
    )  # fmt: skip
    # Each value once per epoch of scVI (3) and scANVI (2), not once per step (9 steps an epoch).
    assert set(collections.Counter(logged).values()) == {5, 2} and "kl_weight" not in ours.history

    scvi.settings.seed = 3
    theirs = scvi.model.SCVI(ours.adata, n_latent=4, n_hidden=16, n_layers=1, gene_likelihood=options.gene_likelihood)
    theirs.train(max_epochs=3, batch_size=32, plan_kwargs={"lr": steps[1]}, accelerator="cpu", early_stopping=True)
    np.testing.assert_array_equal(ours.get_latent_representation(), theirs.get_latent_representation())
    scvi.settings.seed = 3
    theirs_scanvi = scvi.model.SCANVI.from_scvi_model(
        theirs, adata=ours_scanvi.adata, unlabeled_category=UNLABELLED, labels_key="label"
    )
    theirs_scanvi.train(
        max_epochs=2, batch_size=32, plan_kwargs={"lr": steps[1]}, accelerator="cpu", early_stopping=True
    )
    for mine, reference in ((ours, theirs), (ours_scanvi, theirs_scanvi)):
        assert set(reference.history) - set(mine.history) <= {"kl_weight"}
        for name, values in mine.history.items():
            np.testing.assert_allclose(
                values.to_numpy(float), reference.history[name].to_numpy(float), rtol=1e-6, err_msg=name
            )
    np.testing.assert_array_equal(ours_scanvi.predict(), theirs_scanvi.predict())


@pytest.mark.workflow
def test_merge_integrates_and_annotates_a_study_with_every_method(tmp_path):
    """A generated study of three .h5ad batches with known types (the last held out) through
    every integration method: the labels of the inputs reach the merge, scANVI predicts them,
    integration.tsv holds scIB's metrics of each embedding, drawn in the report, the trained
    models are saved in scvi-tools' format, and a CellTypist model labels each sample (rule
    annotate) and the merged cells (rule merge, into merged.h5ad beside the inputs' labels)."""
    rows = []
    study = generate_study(n_batches=3, n_cells=400, n_genes=1000, seed=2)
    for name, batch in study.items():
        batch.obs["known_type"] = batch.obs["cell_type"].astype(str) if name != "batch2" else "Unknown"
        batch.write_h5ad(tmp_path / f"{name}.h5ad")
        rows.append(f"{name}\t{tmp_path / f'{name}.h5ad'}")
    train_celltypist_model(study["batch0"]).write(str(tmp_path / "types.pkl"))
    sheet = write_sheet(tmp_path / "s.tsv", rows)
    overlay = tmp_path / "atlas.yaml"
    overlay.write_text(
        "merge:\n  enabled: true\n  integration:\n    methods: [pca, harmony, scvi, scanvi]\n    use: scanvi\n"
        "    label_key: known_type\n  scvi:\n    max_epochs: 40\n  scanvi:\n    max_epochs: 5\n"
        f"annotate:\n  model: {tmp_path / 'types.pkl'}\ncoexpression:\n  enabled: false\n"
    )
    targets = ["results/merged/merged.h5ad", "results/merged/cell_types.tsv", "results/batch1/cell_types.tsv"]
    result = snakemake(
        *targets, "--cores", "2", "--config", f"samples={sheet}", "backend=cpu", workdir=tmp_path, overlay=overlay
    )
    assert result.returncode == 0, result.stderr[-3000:]
    merged_dir = tmp_path / "results" / "merged"
    merged = ad.read_h5ad(merged_dir / "merged.h5ad")
    assert {"X_pca", "X_harmony", "X_scvi", "X_scanvi", "X_umap"} <= set(merged.obsm)
    assert merged.uns["neighbors"]["params"]["use_rep"] == "X_scanvi"
    assert set(merged.obs.loc[merged.obs["sample"] == "batch2", "known_type"]) == {"Unknown"}
    assert set(merged.obs["known_type_scanvi"]) <= {f"type{t:02d}" for t in range(12)}
    metrics = pd.read_csv(merged_dir / "integration.tsv", sep="\t")
    assert list(metrics["method"]) == ["pca", "harmony", "scvi", "scanvi"]
    assert {"KMeans ARI", "iLISI", "KBET", "Bio conservation", "Batch correction", "Total"} <= set(metrics.columns)
    assert metrics["Total"].between(0, 1).all()
    models = sorted(path.name for path in (merged_dir / "models").iterdir() if not path.name.startswith("."))
    assert models == ["scanvi", "scvi"]  # Snakemake adds a hidden time stamp
    assert (merged_dir / "models" / "scvi" / "model.pt").is_file()
    assert image.imread(merged_dir / "plots" / "scib.png").shape[0] > 100
    assert {"X_umap_pca", "X_umap_harmony", "X_umap_scvi"} <= set(merged.obsm)  # scanvi's is X_umap
    rows, columns = image.imread(merged_dir / "plots" / "umap_methods.png").shape[:2]
    # A row per method (4), a panel per annotation (4: sample, batch, labels, scANVI's predictions).
    assert abs(rows / columns - (4 * 4.6) / (4 * 5.2)) < 0.05
    # CellTypist's types, per sample and on the merge, majority-voted over each one's own clusters.
    for where, clusters in (("batch1", "processed.h5ad"), ("merged", "merged.h5ad")):
        types = pd.read_csv(tmp_path / "results" / where / "cell_types.tsv", sep="\t", index_col=0)
        cells = ad.read_h5ad(tmp_path / "results" / where / clusters)
        assert list(types.index) == list(cells.obs_names)
        assert (types.groupby(cells.obs["leiden_1.0"].to_numpy())["cell_type"].nunique() == 1).all()
        truth = cells.obs["cell_type"].astype(str).to_numpy()
        assert (types["cell_type_predicted"].to_numpy() == truth).mean() > 0.7
        assert types["cell_type_confidence"].between(0, 1).all()
        assert (tmp_path / "results" / where / "plots" / "umap_cell_types.png").is_file()
    # The merged cells' types are in their obs, beside the inputs' own column cell_type.
    merged_again = ad.read_h5ad(merged_dir / "merged.h5ad")
    types = pd.read_csv(merged_dir / "cell_types.tsv", sep="\t", index_col=0)
    for column in ("cell_type", "cell_type_predicted"):
        np.testing.assert_array_equal(merged_again.obs[f"merged_{column}"].astype(str), types[column])
    np.testing.assert_allclose(
        merged_again.obs["merged_cell_type_confidence"], types["cell_type_confidence"], atol=1e-12
    )
    assert merged_again.obs["cell_type"].astype(str).str.fullmatch(r"type\d\d").all()  # the inputs' own, kept
    # Each sample's own types are in the merged cells' obs, as the sample's own clusters are.
    of_batch1 = merged_again.obs[merged_again.obs["sample"] == "batch1"]
    types = pd.read_csv(tmp_path / "results" / "batch1" / "cell_types.tsv", sep="\t", index_col=0)
    assert list(of_batch1.index) == [f"batch1:{barcode}" for barcode in types.index]
    np.testing.assert_array_equal(of_batch1["sample_cell_type"].astype(str), types["cell_type"])
    np.testing.assert_allclose(of_batch1["sample_cell_type_confidence"], types["cell_type_confidence"])


@pytest.mark.parametrize(
    ("options", "n_cells", "backend", "steps"),
    [
        ({}, 10**6, "cpu", (128, 1e-3)),  # scvi-tools' defaults
        ({}, 50_000, "gpu", (128, 1e-3)),
        ({}, 10**6, "gpu", (4096, 1e-3 * np.sqrt(32))),  # the square-root scaling rule
        ({"batch_size": 1024}, 10, "cpu", (1024, 1e-3 * np.sqrt(8))),
        ({"batch_size": 512, "learning_rate": 5e-4}, 10**6, "gpu", (512, 5e-4)),
    ],
)
def test_training_steps_scale_the_learning_rate_with_the_batch(options, n_cells, backend, steps):
    from omicsprep.options import ScviOptions
    from omicsprep.rna.latent import training_steps

    assert training_steps(ScviOptions(**options), n_cells=n_cells, backend=backend) == pytest.approx(steps)


def resident_model(generated_study):
    import scvi

    cells = ad.concat([generated_study["batch0"], generated_study["batch1"]])
    cells.obs["label"] = known_labels(cells.obs["known_type"]).to_numpy()
    cells.obs.loc[cells.obs_names[::3], "label"] = UNLABELLED
    counts = ad.AnnData(cells.layers["counts"], obs=cells.obs[["batch", "label"]])
    scvi.model.SCANVI.setup_anndata(counts, batch_key="batch", labels_key="label", unlabeled_category=UNLABELLED)
    return scvi.model.SCANVI(counts, n_latent=5, n_hidden=16, n_layers=1)


@pytest.mark.parametrize("dense", [True, False])
def test_resident_batches_are_the_registered_rows_each_training_cell_once_an_epoch(generated_study, dense):
    """Device-resident batches (here on CPU tensors) hold the registered counts and codes of their
    cells, dense or gathered from CSR; an epoch visits every training cell once, in a new order the
    next epoch; validation cells are apart; scANVI's labelled half has known labels only."""
    import torch

    from omicsprep.rna.resident_batches import ResidentDataModule

    model = resident_model(generated_study)
    manager = model.adata_manager
    unlabelled = list(manager.get_state_registry("labels").categorical_mapping).index(UNLABELLED)
    data = ResidentDataModule(
        model, batch_size=100, seed=0, device=torch.device("cpu"), dense=dense, labelled=True,
        unlabelled_code=unlabelled,
    )  # fmt: skip
    assert data.n_train + data.n_val == model.adata.n_obs and not set(data.train_idx) & set(data.val_idx)
    counts = manager.get_from_registry("X")
    codes = {key: np.asarray(manager.get_from_registry(key)).ravel() for key in ("batch", "labels")}
    cell_of_row = {
        row.tobytes(): cell for cell, row in zip(data.train_idx, counts[data.train_idx].toarray(), strict=True)
    }
    loader = data.train_dataloader()
    epochs = []
    for _ in range(2):
        visited = []
        for full, labelled in loader:
            cells = np.array([cell_of_row[row.tobytes()] for row in full["X"].numpy()])
            for key, column in codes.items():
                np.testing.assert_array_equal(full[key].numpy().ravel(), column[cells])
            assert labelled["X"].shape == full["X"].shape
            assert (labelled["labels"].numpy() != unlabelled).all()
            visited.append(cells)
        epochs.append(np.concatenate(visited))
    for visited in epochs:
        np.testing.assert_array_equal(np.sort(visited), data.train_idx)
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[0], data.train_idx)


def test_scanvi_on_resident_batches_labels_the_held_out_batch(generated_study, merged):
    """scANVI from the merge's scVI model, trained from device-resident batches with their
    semi-supervised pairs (the GPU backend's path, here on the CPU), labels the held-out batch."""
    import scvi
    import torch

    from omicsprep.rna.resident_batches import ResidentDataModule

    cells = merged.cells
    scvi_model = merged.models["scvi"]
    counts = ad.AnnData(
        scvi_model.adata.X, obs=scvi_model.adata.obs.assign(label=known_labels(cells.obs["known_type"]).to_numpy())
    )
    scvi.settings.seed = 0
    model = scvi.model.SCANVI.from_scvi_model(
        scvi_model, adata=counts, unlabeled_category=UNLABELLED, labels_key="label"
    )
    unlabelled = list(model.adata_manager.get_state_registry("labels").categorical_mapping).index(UNLABELLED)
    data = ResidentDataModule(
        model, batch_size=256, seed=0, device=torch.device("cpu"), labelled=True, unlabelled_code=unlabelled
    )
    model.train(
        max_epochs=10, datamodule=data, accelerator="cpu", enable_progress_bar=False, plan_kwargs={"lr": 1.4e-3}
    )
    held_out = (cells.obs["sample"] == "batch2").to_numpy()
    predicted = np.asarray(model.predict())[held_out]
    accuracy = (predicted == cells.obs["cell_type"].astype(str).to_numpy()[held_out]).mean()
    print(f"scANVI (resident batches) accuracy on the held-out batch {accuracy:.4f}")
    assert accuracy >= 0.95
    assert "label" not in scvi_model.adata.obs  # the scVI model's own AnnData is left as it was
    # Latent means and predictions from the resident data (every cell, in order) equal scvi-tools' own.
    every_cell = data.every_cell(batch_size=500)
    np.testing.assert_allclose(
        model.get_latent_representation(dataloader=every_cell), model.get_latent_representation(), atol=1e-5
    )
    np.testing.assert_array_equal(model.predict(dataloader=every_cell), model.predict())


RULE_DRIVER = """
import runpy, sys
from types import SimpleNamespace

class Names(SimpleNamespace):  # as Snakemake's named lists: by name, or each value in turn
    def get(self, key, default=None):
        return getattr(self, key, default)

    def __iter__(self):
        return iter(vars(self).values())

h5ad, model, out = sys.argv[1:]
snakemake = SimpleNamespace(
    input=Names(h5ad=h5ad, model=model), output=Names(table=out + "/cell_types.tsv", umap=out + "/umap.png"),
    log=[out + "/annotate.log"], wildcards=Names(sample="batch1"), threads=1,
    params=Names(backend="cpu", clusters="leiden_1.0", majority_voting=True),
)
runpy.run_path("scripts/annotate.py", init_globals={"snakemake": snakemake})
"""


@pytest.mark.parametrize(
    ("model_file", "problem"),
    [("text", "not a CellTypist model"), ("renamed genes", "the cells share no gene with the CellTypist model")],
)
def test_rule_annotate_names_the_sample_and_the_model_file_of_a_bad_model(
    generated_study, celltypist_model, tmp_path, model_file, problem
):
    import copy

    h5ad, model = tmp_path / "processed.h5ad", tmp_path / "model.pkl"
    generated_study["batch1"].write_h5ad(h5ad)
    if model_file == "text":
        model.write_text("not a pickle\n")
    else:
        renamed = copy.deepcopy(celltypist_model)  # the module's model is shared
        renamed.classifier.features = np.array([f"ENSG{i:011d}" for i in range(len(renamed.classifier.features))])
        renamed.write(str(model))
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-c", RULE_DRIVER, str(h5ad), str(model), str(tmp_path)],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    message = run.stderr.strip().splitlines()[-1]
    assert message.startswith("omicsprep error:") and "'batch1'" in message and problem in message, message
    assert str(model) in message
    assert not (tmp_path / "cell_types.tsv").exists()
