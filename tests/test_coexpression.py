"""Gene co-expression networks: planted modules are recovered, block-wise correlation is
exact, outputs are well formed, bad input is refused clearly."""

from __future__ import annotations

import subprocess
import sys

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO, repeated_entries
from scipy import sparse, stats
from sklearn.metrics import adjusted_rand_score

from omicsprep import coexpression
from omicsprep.errors import InputError
from omicsprep.pipeline import run_coexpression, run_coexpression_per_cluster
from omicsprep.preprocessing import normalize

sys.path.insert(0, str(REPO / "benchmarks"))
import generate  # noqa: E402

PARAMS = {**coexpression.DEFAULTS, "top_k": 20, "metacells": {"method": "none", "n_metacells": 200}}


def planted_data(n_cells: int = 3000, n_genes: int = 500, seed: int = 0) -> tuple[ad.AnnData, np.ndarray]:
    counts, planted = generate.generate_coexpression(n_cells, n_genes, seed=seed)
    adata = ad.AnnData(counts)
    adata.var_names = [f"g{i}" for i in range(n_genes)]
    normalize(adata, target_sum=1e4, backend="cpu")
    return adata, planted


@pytest.fixture(scope="module")
def planted():
    return planted_data()


def planted_ari(modules: pd.DataFrame, adata: ad.AnnData, planted: np.ndarray) -> float:
    found = modules.set_index("gene")["module"].astype(str).reindex(adata.var_names, fill_value="left out")
    return adjusted_rand_score(planted[planted >= 0], found.to_numpy()[planted >= 0])


@pytest.mark.parametrize(("correlation", "metacells"), [
    ("pearson", "none"), ("spearman", "none"), ("pearson", "knn"), ("pearson", "kmeans"),
])
def test_planted_modules_are_recovered(planted, correlation, metacells):
    adata, truth = planted
    adata = adata.copy()
    if metacells != "none":
        import scanpy as sc

        sc.pp.pca(adata, n_comps=20, random_state=0)
        sc.pp.neighbors(adata, n_neighbors=10, transformer="sklearn")
    params = {**PARAMS, "correlation": correlation, "metacells": {"method": metacells, "n_metacells": 300}}
    result = run_coexpression(adata, params=params, seed=0, backend="cpu")
    assert planted_ari(result["modules"], adata, truth) >= 0.9
    if metacells == "none":
        # Unrelated genes stay out of modules. Pooling makes samples fewer and dependent,
        # which lifts chance correlations above min_correlation: not asserted there.
        modules = result["modules"]
        background = modules[modules["gene"].str[1:].astype(int) >= 200]
        assert (background["module"] == coexpression.UNASSIGNED).mean() > 0.9
        assert adata.uns["coexpression"]["modules"] == 5


def test_outputs_are_well_formed(planted):
    adata, _ = planted
    adata = adata.copy()
    result = run_coexpression(adata, params=PARAMS, seed=0, backend="cpu")
    modules, edges, eigengenes = result["modules"], result["edges"], result["eigengenes"]
    assert list(modules.columns) == ["gene", "module", "hub_score"]
    assert list(edges.columns) == ["gene_a", "gene_b", "weight"]
    assert modules["hub_score"].between(0, 1).all()
    assigned = modules[modules["module"] != coexpression.UNASSIGNED]
    assert (assigned.groupby("module", observed=True)["hub_score"].max() == 1).all()
    assert not edges.duplicated(["gene_a", "gene_b"]).any() and (edges["gene_a"] != edges["gene_b"]).all()
    assert edges["weight"].between(0.1, 1).all()
    assert list(eigengenes.columns) == [f"M{i}" for i in range(1, 6)]
    assert eigengenes.index.equals(adata.obs_names)
    np.testing.assert_allclose(eigengenes.std(ddof=0), 1, rtol=1e-4)
    for name, genes in assigned.groupby("module", observed=True)["gene"]:
        mean = np.asarray(adata[:, genes.to_numpy()].X.mean(axis=1)).ravel()
        assert np.corrcoef(eigengenes[name], mean)[0, 1] > 0.9  # oriented along the module's expression
    assert adata.uns["omicsprep"]["coexpression"]["backend"] == "cpu"


@pytest.mark.parametrize("method", ["pearson", "spearman"])
def test_blockwise_graph_equals_the_full_matrix(monkeypatch, method):
    rng = np.random.default_rng(3)
    expression = rng.gamma(1.0, size=(300, 120)).astype(np.float32)
    expression[:, :40] += rng.gamma(2.0, size=(300, 1)).astype(np.float32)  # a correlated group
    monkeypatch.setattr(coexpression, "BLOCK_BYTES", 4 * 120 * 7)  # blocks of 7 genes
    standardized = coexpression.standardize(expression, method=method, backend="cpu")
    graph = coexpression.correlation_graph(standardized, top_k=5, min_correlation=0.05, power=2.0, backend="cpu")
    full = (stats.spearmanr(expression).statistic if method == "spearman" else np.corrcoef(expression.T))
    np.fill_diagonal(full, -np.inf)
    expected = np.zeros_like(full)
    for gene, row in enumerate(full):
        partners = np.argsort(-row)[:5]
        partners = partners[row[partners] >= 0.05]
        expected[gene, partners] = row[partners] ** 2
    expected = np.maximum(expected, expected.T)
    np.testing.assert_allclose(graph.toarray(), expected, atol=1e-5)


def test_repeated_sparse_entries_are_summed():
    dense, split = repeated_entries()
    split.has_canonical_format = False
    np.testing.assert_allclose(coexpression.standardize(split, method="pearson", backend="cpu"),
                               coexpression.standardize(dense, method="pearson", backend="cpu"), rtol=1e-5)


def test_cli_writes_the_tables_and_figures(tmp_path):
    adata, _ = planted_data(n_cells=1500, n_genes=300, seed=2)
    adata.X = adata.layers.pop("counts")  # raw counts in: the command normalizes them
    adata.write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "network"
    subprocess.run([sys.executable, "-m", "omicsprep.cli", "coexpr", str(tmp_path / "in.h5ad"), "-o", str(out),
                    "--top-k", "20", "--backend", "cpu"], check=True, capture_output=True)
    names = {p.name for p in out.iterdir()}
    assert names == {"edges.parquet", "modules.tsv", "eigengenes.parquet", "module_correlation.png",
                     "module_scores_umap.png"}
    header = (out / "modules.tsv").read_text().splitlines()[0]
    assert header == "gene\tmodule\thub_score"
    assert pd.read_parquet(out / "eigengenes.parquet").shape[1] == 5


@pytest.mark.parametrize(("change", "problem"), [
    ("few_cells", r"40 cells, fewer than coexpression.min_cells \(50\)"),
    ("nan", "expression holds NaN values"),
    ("few_genes", r"usable genes .* too few for top_k=20"),
])
def test_bad_input_is_one_clear_error(change, problem):
    adata, _ = planted_data(n_cells=400, n_genes=300, seed=4)
    if change == "few_cells":
        adata = adata[:40].copy()
    elif change == "nan":
        adata.X.data[0] = np.nan
    else:
        adata = adata[:, :15].copy()
    with pytest.raises(InputError, match=problem):
        run_coexpression(adata, params=PARAMS, seed=0, backend="cpu")


def test_constant_and_rare_genes_are_left_out_and_counted(planted):
    adata, _ = planted
    adata = adata.copy()
    values = adata.X.tolil()
    values[:, 250] = 0.0  # constant
    adata.X = sparse.csr_matrix(values)
    run_coexpression(adata, params=PARAMS, seed=0, backend="cpu")
    summary = adata.uns["coexpression"]
    assert summary["genes"] + summary["genes_skipped"] == adata.n_vars
    assert summary["genes_skipped"] > 0


def test_a_network_per_cluster():
    adata, truth = planted_data(n_cells=3000, n_genes=400, seed=5)
    adata.obs["leiden_1.0"] = pd.Categorical(np.where(np.arange(adata.n_obs) < 2000, "0", np.where(
        np.arange(adata.n_obs) < 2950, "1", "2")))  # the last has 50 cells: too few
    params = {**PARAMS, "per_cluster": {"enabled": True, "min_cells": 200}}
    table = run_coexpression_per_cluster(adata, params=params, clusters="leiden_1.0", seed=0, backend="cpu")
    assert list(table.columns) == ["cluster", "gene", "module", "hub_score"]
    assert set(table["cluster"]) == {"0", "1"}
    assert adata.uns["coexpression"]["clusters_skipped"] == {"2": "50 cells"}
    for _, modules in table.groupby("cluster"):
        assert planted_ari(modules, adata, truth) >= 0.9


def test_package_defaults_match_the_config_schema():
    schema = yaml.safe_load((REPO / "config" / "schemas" / "config.schema.yaml").read_text())
    properties = schema["properties"]["coexpression"]["properties"]
    nested = ("metacells", "per_cluster")
    defaults = {key: spec["default"] for key, spec in properties.items() if key not in ("enabled", *nested)}
    for key in nested:
        defaults[key] = {name: spec["default"] for name, spec in properties[key]["properties"].items()}
    assert defaults == coexpression.DEFAULTS
