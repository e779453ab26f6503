"""Gene co-expression networks: planted modules are recovered (Leiden and Louvain).

Block-wise correlation is exact, hub scores, module sizes and eigengenes follow their
definitions, the written files hold the computed values, bad input is refused clearly.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace

import anndata as ad
import igraph
import numpy as np
import pandas as pd
import pytest
from conftest import repeated_entries
from scipy import sparse, stats
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score

from omicsprep.errors import InputError
from omicsprep.network import coexpression
from omicsprep.network.pipeline import run_coexpression, run_coexpression_per_cluster, skipped_coexpression
from omicsprep.options import CoexpressionOptions, MetacellOptions, PerClusterOptions
from omicsprep.rna.preprocessing import normalize
from omicsprep.testing import generate

OPTIONS = CoexpressionOptions(top_k=20, metacells=MetacellOptions(method="none", n_metacells=200))


def planted_data(n_cells: int = 3000, n_genes: int = 500, seed: int = 0) -> tuple[ad.AnnData, np.ndarray]:
    counts, planted = generate.generate_coexpression(n_cells, n_genes, seed=seed)
    adata = ad.AnnData(counts)
    adata.var_names = [f"g{i}" for i in range(n_genes)]
    normalize(adata, target_sum=1e4, backend="cpu")
    return adata, planted


@pytest.fixture(scope="module")
def planted():
    return planted_data()


@pytest.fixture(scope="module")
def planted_network(planted):
    """The planted cells (a copy) after run_coexpression with OPTIONS, and its result."""
    adata = planted[0].copy()
    return adata, run_coexpression(adata, options=OPTIONS, seed=0, backend="cpu")


def planted_ari(modules: pd.DataFrame, adata: ad.AnnData, planted: np.ndarray) -> float:
    found = modules.set_index("gene")["module"].astype(str).reindex(adata.var_names, fill_value="left out")
    return adjusted_rand_score(planted[planted >= 0], found.to_numpy()[planted >= 0])


@pytest.mark.parametrize(
    ("correlation", "metacells"),
    [
        ("pearson", "none"),
        ("spearman", "none"),
        ("pearson", "knn"),
        ("pearson", "kmeans"),
    ],
)
def test_planted_modules_are_recovered(planted, correlation, metacells):
    adata, truth = planted
    adata = adata.copy()
    if metacells != "none":
        import scanpy as sc

        sc.pp.pca(adata, n_comps=20, random_state=0)
        sc.pp.neighbors(adata, n_neighbors=10, transformer="sklearn")
    options = replace(OPTIONS, correlation=correlation, metacells=MetacellOptions(method=metacells, n_metacells=300))
    result = run_coexpression(adata, options=options, seed=0, backend="cpu")
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
    result = run_coexpression(adata, options=OPTIONS, seed=0, backend="cpu")
    modules, edges, eigengenes = result["modules"], result["edges"], result["eigengenes"]
    assert list(modules.columns) == ["gene", "module", "hub_score"]
    assert list(edges.columns) == ["gene_a", "gene_b", "weight"]
    assert modules["hub_score"].between(0, 1).all()
    assigned = modules[modules["module"] != coexpression.UNASSIGNED]
    assert (assigned.groupby("module", observed=True)["hub_score"].max() == 1).all()
    assert not edges.duplicated(["gene_a", "gene_b"]).any()
    assert (edges["gene_a"] != edges["gene_b"]).all()
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
    """Also with ties (whole numbers, a third of them 0), which Spearman's ranks share as their mean rank."""
    rng = np.random.default_rng(3)
    expression = rng.gamma(1.0, size=(300, 120)).astype(np.float32)
    expression[:, :40] += rng.gamma(2.0, size=(300, 1)).astype(np.float32)  # a correlated group
    expression = np.floor(expression)
    monkeypatch.setattr(coexpression, "BLOCK_BYTES", 4 * 120 * 7)  # blocks of 7 genes
    standardized = coexpression.standardize(expression, method=method, backend="cpu")
    graph = coexpression.correlation_graph(standardized, top_k=5, min_correlation=0.05, power=2.0, backend="cpu")
    full = stats.spearmanr(expression).statistic if method == "spearman" else np.corrcoef(expression.T)
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
    np.testing.assert_allclose(
        coexpression.standardize(split, method="pearson", backend="cpu"),
        coexpression.standardize(dense, method="pearson", backend="cpu"),
        rtol=1e-5,
    )


def hub_scores_from_edges(edges: pd.DataFrame, modules: pd.DataFrame) -> pd.Series:
    """The hub score of docs/steps.md, from an edge list.

    A gene's summed edge weight to genes of its own module over the largest such sum in the
    module; 0 for unassigned genes.
    """
    module_of = modules.set_index("gene")["module"].astype(str)
    both = pd.concat(
        [
            edges.rename(columns={"gene_a": "gene", "gene_b": "partner"}),
            edges.rename(columns={"gene_b": "gene", "gene_a": "partner"}),
        ]
    )
    inside = both[both["gene"].map(module_of).to_numpy() == both["partner"].map(module_of).to_numpy()]
    degree = inside.groupby("gene")["weight"].sum().reindex(module_of.index, fill_value=0.0)
    scores = degree / degree.groupby(module_of).transform("max")
    return scores.where(module_of != coexpression.UNASSIGNED, 0.0)


def pc1_eigengenes(log_expression: np.ndarray, modules: pd.DataFrame, genes: pd.Index) -> pd.DataFrame:
    """Each module's first principal component over the cells (SVD of its genes' z-scores).

    At unit variance, its sign left as the SVD gives it.
    """
    scores = {}
    for name, members in modules[modules["module"] != coexpression.UNASSIGNED].groupby("module", observed=True):
        values = log_expression[:, genes.get_indexer(members["gene"])].astype(np.float64)
        z = (values - values.mean(axis=0)) / values.std(axis=0)
        left, singular, _ = np.linalg.svd(z, full_matrices=False)
        scores[str(name)] = left[:, 0] * singular[0] / (left[:, 0] * singular[0]).std()
    return pd.DataFrame(scores)


def assert_equal_up_to_sign(found: pd.Series, expected: np.ndarray, atol: float) -> None:
    sign = np.sign(np.dot(found, expected))
    np.testing.assert_allclose(found.to_numpy(), sign * expected, atol=atol)


def test_cli_writes_the_tables_and_figures(tmp_path):
    adata, _ = planted_data(n_cells=1500, n_genes=300, seed=2)
    counts = adata.copy()
    counts.X = counts.layers.pop("counts")  # raw counts in: the command normalizes them
    counts.write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "network"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "omicsprep.cli",
            "coexpr",
            str(tmp_path / "in.h5ad"),
            "-o",
            str(out),
            "--top-k",
            "20",
            "--backend",
            "cpu",
        ],
        check=True,
        capture_output=True,
    )
    names = {p.name for p in out.iterdir()}
    assert names == {
        "edges.parquet",
        "modules.tsv",
        "eigengenes.parquet",
        "module_correlation.png",
        "module_scores_umap.png",
    }
    edges = pd.read_parquet(out / "edges.parquet")
    modules = pd.read_csv(out / "modules.tsv", sep="\t")
    eigengenes = pd.read_parquet(out / "eigengenes.parquet")
    assert list(modules.columns) == ["gene", "module", "hub_score"]

    # The files hold what the package computes in memory on the same (normalized) cells
    # with the command's settings.
    options = CoexpressionOptions(top_k=20, metacells=MetacellOptions(method="none"))
    expected = run_coexpression(adata, options=options, seed=0, backend="cpu")
    pd.testing.assert_frame_equal(edges, expected["edges"].reset_index(drop=True))
    pd.testing.assert_frame_equal(modules, expected["modules"].astype({"module": str}), check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(eigengenes, expected["eigengenes"], check_exact=False, rtol=1e-6)
    assert list(eigengenes.columns) == [f"M{i}" for i in range(1, 6)]  # the five planted modules

    # And each file agrees with values recomputed from the expression and the other files.
    log_expression = adata.X.toarray()
    genes = adata.var_names
    pearson = [
        np.corrcoef(log_expression[:, genes.get_loc(a)], log_expression[:, genes.get_loc(b)])[0, 1]
        for a, b in zip(edges["gene_a"], edges["gene_b"], strict=True)
    ]
    np.testing.assert_allclose(edges["weight"], pearson, atol=1e-5)  # power 1: the weight is the correlation
    assert set(edges["gene_a"]) | set(edges["gene_b"]) <= set(modules["gene"])
    np.testing.assert_allclose(modules.set_index("gene")["hub_score"], hub_scores_from_edges(edges, modules), rtol=1e-6)
    recomputed = pc1_eigengenes(log_expression, modules, genes)
    for name in eigengenes.columns:
        assert_equal_up_to_sign(eigengenes[name], recomputed[name].to_numpy(), atol=1e-3)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ("few_cells", r"^40 cells, fewer than coexpression.min_cells \(50\)$"),
        ("nan", "^expression holds NaN values$"),
        ("few_genes", r"^\d+ usable genes .* too few for top_k=20 partners each$"),
    ],
)
def test_bad_input_is_one_clear_error(change, problem):
    adata, _ = planted_data(n_cells=400, n_genes=300, seed=4)
    if change == "few_cells":
        adata = adata[:40].copy()
    elif change == "nan":
        adata.X.data[0] = np.nan
    else:
        adata = adata[:, :15].copy()
    with pytest.raises(InputError, match=problem):
        run_coexpression(adata, options=OPTIONS, seed=0, backend="cpu")


def test_the_fewest_cells_and_genes_a_network_is_built_from():
    """Exactly min_cells cells are enough; the usable genes must outnumber top_k (each needs
    top_k partners): top_k + 1 are enough, top_k are not."""
    values = np.random.default_rng(0).gamma(1.0, size=(50, 21)).astype(np.float32)
    adata = ad.AnnData(sparse.csr_matrix(values))
    settings = {"top_k": 20, "min_cells": 50, "min_expressing_cells": 20}
    assert len(coexpression.check_expression(adata, genes=adata.var_names, **settings)) == 21
    with pytest.raises(InputError, match=r"^20 usable genes"):
        coexpression.check_expression(adata, genes=adata.var_names[:20], **settings)


def test_genes_are_picked_by_hvg_rank_then_by_variance():
    """The workflow's HVGs first, by their rank; the genes without one (NaN) after them, by
    decreasing variance (of log-normalized X, dense or sparse, with unequal means far from 0)."""
    rng = np.random.default_rng(3)
    spread = np.array([0.5, 3.0, 1.0, 2.0, 0.1, 4.0, 1.5])
    means = np.array([9.0, 1.0, 6.0, 2.0, 4.0, 3.0, 8.0])  # unequal: the variance is not E[x^2] less a constant
    values = (means + rng.normal(size=(200, 7)) * spread).astype(np.float32)
    by_variance = list(np.argsort(-values.var(axis=0)))
    for x in (values, sparse.csr_matrix(values)):
        adata = ad.AnnData(x)
        adata.var_names = [f"g{i}" for i in range(7)]
        assert list(coexpression.select_genes(adata, n_genes=4)) == [f"g{i}" for i in by_variance[:4]]
        adata.var["highly_variable_rank"] = [np.nan, 1.0, np.nan, np.nan, 0.0, np.nan, np.nan]
        rest = [i for i in by_variance if i not in (4, 1)]
        assert list(coexpression.select_genes(adata, n_genes=4)) == ["g4", "g1", *(f"g{i}" for i in rest[:2])]


def test_standardized_genes_are_float32_and_constant_ones_zeros():
    """Dense or sparse float64 expression comes back float32 (half the device memory), each gene
    with mean 0 and variance 1, a constant gene all zeros rather than NaN."""
    values = np.random.default_rng(1).gamma(1.0, size=(30, 4))
    values[:, 2] = 3.0
    for expression in (values, sparse.csr_matrix(values)):
        for method in ("pearson", "spearman"):
            standardized = coexpression.standardize(expression, method=method, backend="cpu")
            assert standardized.dtype == np.float32
            np.testing.assert_array_equal(standardized[:, 2], 0)
            np.testing.assert_allclose(standardized[:, [0, 1, 3]].mean(axis=0), 0, atol=1e-6)
            np.testing.assert_allclose(standardized[:, [0, 1, 3]].var(axis=0), 1, rtol=1e-5)


def test_tf32_split_is_exact_and_its_high_part_has_tf32s_bits():
    """high + low is the value exactly; high keeps 10 mantissa bits (rounded to nearest) and
    low is at most 2^-11 of the value."""
    values = np.random.default_rng(2).normal(size=10_000).astype(np.float32) * np.float32(7)
    values[:3] = [1.0, -2.5, 1 + 2**-11]  # exact in TF32, and a tie rounded away from zero
    high, low = coexpression._split_tf32(values, xp=np)
    assert high.dtype == np.float32 and low.dtype == np.float32
    np.testing.assert_array_equal(high + low, values)
    assert not (high.view(np.uint32) & np.uint32(0x1FFF)).any()
    assert (np.abs(low) <= np.abs(values) * 2**-11).all()
    np.testing.assert_array_equal(high[:3], [1.0, -2.5, 1 + 2**-10])
    mantissa = np.frexp(values.astype(np.float64))
    nearest = np.ldexp(np.round(mantissa[0] * 2**11) / 2**11, mantissa[1])  # 1 + 10 bits
    np.testing.assert_allclose(high[3:], nearest[3:], rtol=0, atol=0)


@pytest.mark.parametrize(("change", "left_out"), [("constant", True), ("in 19 cells", True), ("in 20 cells", False)])
def test_constant_and_rare_genes_are_left_out_and_counted(planted, planted_network, change, left_out):
    adata, _ = planted
    baseline, baseline_result = planted_network
    assert "g250" in set(baseline_result["modules"]["gene"])
    values = adata.X.toarray()
    if change == "constant":
        values[:, 250] = 1.0  # expressed in every cell, so only the constant-gene filter can drop it
    else:  # varying, in one cell under min_expressing_cells (20), or in exactly 20
        cells = 19 if change == "in 19 cells" else 20
        values[:, 250] = 0.0
        values[:cells, 250] = np.linspace(0.5, 2.0, cells)
    changed = adata.copy()
    changed.X = sparse.csr_matrix(values)
    result = run_coexpression(changed, options=OPTIONS, seed=0, backend="cpu")
    summary = changed.uns["coexpression"]
    assert summary["genes_skipped"] == baseline.uns["coexpression"]["genes_skipped"] + left_out
    assert summary["genes"] + summary["genes_skipped"] == adata.n_vars
    assert ("g250" in set(result["modules"]["gene"])) is not left_out
    if left_out:
        assert "g250" not in set(result["edges"]["gene_a"]) | set(result["edges"]["gene_b"])


# A hand-built co-expression graph. Clique "a" (5 genes): a0 joined to each other at 0.9,
# the other pairs at 0.5. Clique "b" (4 genes): b0 joined to each other at 0.8, the other
# pairs at 0.3. One weak edge a4-b0 (0.1) between the cliques, a separate pair c0-c1 (0.7),
# and a gene without edges. The smaller clique comes first, so that naming by size shows.
HAND_EDGES = (
    [("a0", f"a{j}", 0.9) for j in range(1, 5)]
    + [(f"a{i}", f"a{j}", 0.5) for i in range(1, 5) for j in range(i + 1, 5)]
    + [("b0", f"b{j}", 0.8) for j in range(1, 4)]
    + [(f"b{i}", f"b{j}", 0.3) for i in range(1, 4) for j in range(i + 1, 4)]
    + [("a4", "b0", 0.1), ("c0", "c1", 0.7)]
)
HAND_GENES = pd.Index([*(f"b{i}" for i in range(4)), *(f"a{i}" for i in range(5)), "c0", "c1", "lone"])
# Hub scores by hand (weighted degree within the module over the module's largest):
#   a0: 4 x 0.9 = 3.6 (the largest) -> 1; a1..a4: 0.9 + 3 x 0.5 = 2.4 -> 2.4 / 3.6 = 2/3
#       (a4's edge to b0 crosses modules and does not count)
#   b0: 3 x 0.8 = 2.4 -> 1; b1..b3: 0.8 + 2 x 0.3 = 1.4 -> 1.4 / 2.4 = 7/12
#   c0, c1: 0.7 each -> 1; unassigned genes: 0
HAND_HUBS = {
    "a0": 1.0,
    **{f"a{i}": 2 / 3 for i in range(1, 5)},
    "b0": 1.0,
    **{f"b{i}": 7 / 12 for i in range(1, 4)},
    "c0": 1.0,
    "c1": 1.0,
}


def hand_graph() -> sparse.csr_matrix:
    rows, cols, weights = zip(*HAND_EDGES, strict=True)
    graph = sparse.coo_matrix(
        (weights, (HAND_GENES.get_indexer(rows), HAND_GENES.get_indexer(cols))),
        shape=(len(HAND_GENES), len(HAND_GENES)),
    ).tocsr()
    return graph.maximum(graph.T).tocsr()


@pytest.mark.parametrize("algorithm", ["leiden", "louvain"])
@pytest.mark.parametrize(
    ("min_module_size", "modules"),
    [
        (2, {"M1": "a", "M2": "b", "M3": "c"}),  # named by decreasing size
        (3, {"M1": "a", "M2": "b"}),  # the pair is under the minimum
        (5, {"M1": "a"}),  # a module of exactly min_module_size genes is kept
        (6, {}),
    ],
)
def test_modules_named_by_size_small_ones_unassigned_and_hub_scores(algorithm, min_module_size, modules):
    table = coexpression.find_modules(
        hand_graph(),
        genes=HAND_GENES,
        algorithm=algorithm,
        resolution=1.0,
        min_module_size=min_module_size,
        seed=0,
        backend="cpu",
    )
    assert sorted(table["gene"]) == sorted(HAND_GENES)
    module_of = table.set_index("gene")["module"].astype(str)
    expected = {
        gene: next((name for name, prefix in modules.items() if gene[0] == prefix), coexpression.UNASSIGNED)
        for gene in HAND_GENES
    }
    assert module_of.to_dict() == expected
    hubs = {gene: HAND_HUBS[gene] if expected[gene] != coexpression.UNASSIGNED else 0.0 for gene in HAND_GENES}
    np.testing.assert_allclose(
        table.set_index("gene")["hub_score"].reindex(HAND_GENES), [hubs[g] for g in HAND_GENES], rtol=1e-12
    )
    # The same scores from the edge list by docs/steps.md's definition (applied to the command's output in
    # test_cli_writes_the_tables_and_figures).
    edges = pd.DataFrame(HAND_EDGES, columns=["gene_a", "gene_b", "weight"])
    np.testing.assert_allclose(
        hub_scores_from_edges(edges, table).reindex(HAND_GENES), [hubs[g] for g in HAND_GENES], rtol=1e-12
    )


def unit_graph(edges: list[tuple[int, int]], n_genes: int) -> sparse.csr_matrix:
    rows, cols = np.array(edges).T
    graph = sparse.coo_matrix((np.ones(len(edges)), (rows, cols)), shape=(n_genes, n_genes)).tocsr()
    return graph.maximum(graph.T).tocsr()


def test_many_modules_are_named_by_size_then_in_their_communities_order():
    """12 triangles and 12 pairs, alternating: M1..M12 the triangles and M13..M24 the pairs, each
    in their communities' order (a stable sort of sizes; numpy's default sort reorders equal
    ones among 17 or more), categories in that order (M2 before M10) and rows by module, then
    hub score, highest first."""
    groups = np.split(np.arange(60), np.cumsum([2 if t % 2 == 0 else 3 for t in range(24)])[:-1])
    graph = unit_graph([(a, b) for members in groups for i, a in enumerate(members) for b in members[i + 1 :]], 60)
    genes = pd.Index([f"g{i}" for i in range(60)])
    settings = {"algorithm": "leiden", "resolution": 1.0, "seed": 0, "backend": "cpu"}
    table = coexpression.find_modules(graph, genes=genes, min_module_size=2, **settings)
    labels = coexpression.partition_graph(graph, **settings)
    order = sorted(set(labels), key=lambda label: (-(labels == label).sum(), label))
    assert table.set_index("gene")["module"].astype(str).to_dict() == {
        f"g{i}": f"M{order.index(labels[i]) + 1}" for i in range(60)
    }
    assert len(order) == 24 and all(len(groups[2 * t + 1]) == 3 for t in range(12))
    assert list(table["module"].cat.categories) == [*(f"M{i}" for i in range(1, 25)), coexpression.UNASSIGNED]
    assert (table["hub_score"] == 1.0).all() and table["module"].cat.codes.is_monotonic_increasing
    # Within a module, the highest hub score first: the hand graph, with unequal degrees.
    hand = coexpression.find_modules(hand_graph(), genes=HAND_GENES, min_module_size=2, **settings)
    assert hand["module"].cat.codes.is_monotonic_increasing
    for _, module in hand.groupby("module", observed=True):
        assert module["hub_score"].is_monotonic_decreasing


def test_a_module_whose_largest_degree_is_0_or_1_scores_its_genes_by_it():
    """A gene alone kept as a module (min_module_size 1) scores 0, not NaN; a pair joined at
    exactly 1 scores 1 each."""
    table = coexpression.find_modules(
        unit_graph([(1, 2)], 3),
        genes=pd.Index(["lone", "p0", "p1"]),
        algorithm="leiden",
        resolution=1.0,
        min_module_size=1,
        seed=0,
        backend="cpu",
    )
    assert table.set_index("gene")["hub_score"].to_dict() == {"p0": 1.0, "p1": 1.0, "lone": 0.0}


def test_a_network_that_cannot_be_built_leaves_empty_tables_and_the_reason(caplog):
    """skipped_coexpression: tables with their columns and no rows, eigengenes with a row per
    cell and no column, the reason in uns and the log, and the rule's provenance (settings,
    seed, backend)."""
    adata = ad.AnnData(sparse.csr_matrix(np.ones((5, 3), dtype=np.float32)))
    with caplog.at_level("WARNING", logger="omicsprep.network.pipeline"):
        tables = skipped_coexpression(adata, reason="5 cells, too few", options=OPTIONS, seed=7, backend="cpu")
    assert list(tables["edges"].columns) == ["gene_a", "gene_b", "weight"] and tables["edges"].empty
    assert list(tables["modules"].columns) == ["gene", "module", "hub_score"] and tables["modules"].empty
    eigengenes = adata.obsm["module_eigengenes"]
    assert tables["eigengenes"] is eigengenes and eigengenes.shape == (5, 0)
    assert eigengenes.index.equals(adata.obs_names)
    assert adata.uns["coexpression"] == {"skipped": "5 cells, too few"}
    assert "coexpression skipped: 5 cells, too few" in caplog.messages
    provenance = adata.uns["omicsprep"]["coexpression"]
    params = json.loads(provenance["params"])
    assert params["seed"] == 7 and params["top_k"] == OPTIONS.top_k and provenance["backend"] == "cpu"
    assert not provenance["timings"]


def test_every_setting_reaches_its_step(planted, monkeypatch):
    """run_coexpression passes each setting (and the backend) to the step that uses it, and
    times each step under its name."""
    adata, _ = planted
    calls = {}

    def spy(name):
        original = getattr(coexpression, name)

        def recorded(*args, **kwargs):
            calls[name] = kwargs
            return original(*args, **kwargs)

        monkeypatch.setattr(coexpression, name, recorded)

    for name in ("select_genes", "pool_metacells", "standardize", "correlation_graph", "find_modules"):
        spy(name)
    options = replace(OPTIONS, n_genes=400, correlation="spearman", algorithm="louvain")
    cells = adata.copy()
    run_coexpression(cells, options=options, seed=2, backend="cpu")
    assert calls["select_genes"]["n_genes"] == 400
    assert calls["standardize"]["method"] == "spearman" and calls["find_modules"]["algorithm"] == "louvain"
    assert calls["pool_metacells"]["seed"] == 2 and calls["find_modules"]["seed"] == 2
    assert all(kwargs["backend"] == "cpu" for name, kwargs in calls.items() if name != "select_genes")
    steps = set(cells.uns["omicsprep"]["coexpression"]["timings"])
    assert {"select_genes", "metacells", "standardize", "correlation", "modules", "eigengenes"} <= steps


def test_louvain_modules_are_igraphs_multilevel_communities():
    # A graph of chance correlations, where Leiden and Louvain disagree (on the planted
    # data they agree), so that Louvain being asked for shows in the modules.
    expression = np.random.default_rng(0).gamma(1.0, size=(60, 80)).astype(np.float32)
    standardized = coexpression.standardize(expression, method="pearson", backend="cpu")
    graph = coexpression.correlation_graph(standardized, top_k=5, min_correlation=0.1, power=1, backend="cpu")
    genes = pd.Index([f"g{i}" for i in range(80)])
    found = {
        algorithm: coexpression.find_modules(
            graph, genes=genes, algorithm=algorithm, resolution=1.0, min_module_size=1, seed=0, backend="cpu"
        )
        .set_index("gene")["module"]
        .astype(str)
        .reindex(genes)
        .to_numpy()
        for algorithm in ("leiden", "louvain")
    }
    upper = sparse.triu(graph, k=1).tocoo()
    network = igraph.Graph(n=80, edges=np.column_stack([upper.row, upper.col]).tolist())
    igraph.set_random_number_generator(random.Random(0))  # as the package seeds igraph
    try:
        multilevel = network.community_multilevel(weights=upper.data.tolist(), resolution=1.0).membership
    finally:
        igraph.set_random_number_generator(random)
    assert adjusted_rand_score(multilevel, found["louvain"]) == 1
    assert adjusted_rand_score(found["leiden"], found["louvain"]) < 0.9


def test_louvain_recovers_the_planted_modules(planted):
    adata, truth = planted
    result = run_coexpression(adata.copy(), options=replace(OPTIONS, algorithm="louvain"), seed=0, backend="cpu")
    assert planted_ari(result["modules"], adata, truth) >= 0.9
    assert list(result["eigengenes"].columns) == [f"M{i}" for i in range(1, 6)]


def test_eigengene_is_the_first_principal_component(planted_network):
    from sklearn.decomposition import PCA

    adata, result = planted_network
    modules, eigengenes = result["modules"], result["eigengenes"]
    for name, members in modules[modules["module"] != coexpression.UNASSIGNED].groupby("module", observed=True):
        values = adata[:, members["gene"].to_numpy()].X.toarray().astype(np.float64)
        z = (values - values.mean(axis=0)) / values.std(axis=0)
        pc1 = PCA(n_components=1).fit_transform(z)[:, 0]
        pc1 /= pc1.std()
        # Sign-agnostic: the orientation is checked on its own (test_outputs_are_well_formed).
        # The genes' plain mean differs from PC1 by 0.08-0.13 here: the tolerance tells them apart.
        assert_equal_up_to_sign(eigengenes[name], pc1, atol=1e-3)


def test_eigengenes_of_dense_expression_in_float32_each_rising_with_its_modules_mean():
    """On expression without planted structure, where a module's first component can lie at any
    angle to its mean (one here at a covariance under 1), each eigengene is oriented by that
    covariance; dense expression gives what sparse does; the scores are float32."""
    rng = np.random.default_rng(16)  # module M9's first component, as eigh signs it, at covariance 0.57
    values = rng.normal(size=(80, 36)).astype(np.float32)
    genes = [f"g{i}" for i in range(36)]
    names = [f"M{k + 1}" for k in range(12)]
    modules = pd.DataFrame(
        {
            "gene": genes,
            "module": pd.Categorical(np.repeat(names, 3), categories=[*names, coexpression.UNASSIGNED]),
            "hub_score": 1.0,
        }
    )
    found = {}
    for layout in ("dense", "sparse"):
        adata = ad.AnnData(values if layout == "dense" else sparse.csr_matrix(values))
        adata.var_names = genes
        coexpression.module_eigengenes(adata, modules=modules, backend="cpu")
        found[layout] = adata.obsm["module_eigengenes"]
    pd.testing.assert_frame_equal(found["dense"], found["sparse"], rtol=1e-5, atol=1e-5)
    assert (found["dense"].dtypes == np.float32).all()
    z = (values - values.mean(axis=0)) / values.std(axis=0)
    for k, name in enumerate(names):
        mean = z[:, 3 * k : 3 * k + 3].mean(axis=1)
        assert float((found["dense"][name] * mean).sum()) > 0, name


def test_kmeans_metacells_are_the_summed_counts_of_seeded_kmeans_groups():
    """Metacells by k-means: scikit-learn's k-means of the PCA (n_metacells groups, the seed's
    start), each group's counts summed, then normalized; on a PCA without structure, where the
    start decides the groups."""
    from sklearn.cluster import KMeans

    counts, _ = generate.generate_coexpression(400, 250, seed=4)
    adata = ad.AnnData(np.zeros(counts.shape, dtype=np.float32), layers={"counts": counts})
    adata.obsm["X_pca"] = np.random.default_rng(1).normal(size=(400, 10)).astype(np.float32)
    metacells = coexpression.pool_metacells(adata, method="kmeans", n_metacells=7, seed=5, backend="cpu")
    groups = KMeans(n_clusters=7, random_state=5, n_init=1).fit_predict(adata.obsm["X_pca"])
    summed = np.vstack([np.asarray(counts[groups == g].sum(axis=0)).ravel() for g in range(7)])
    expected = np.log1p(summed / summed.sum(axis=1, keepdims=True) * 1e4)
    np.testing.assert_allclose(metacells.X.toarray(), expected, rtol=1e-5, atol=1e-5)


def test_knn_metacells_are_each_cells_counts_with_its_neighbours_from_counts_or_x():
    """Metacells by neighbours: each cell's raw counts (``layers["counts"]``, else ``X``) summed
    with those of the cells it has an edge to, then normalized."""
    counts, _ = generate.generate_coexpression(60, 250, seed=7)
    rng = np.random.default_rng(2)
    weights = sparse.random(60, 60, density=0.05, random_state=rng, format="csr", dtype=np.float32)
    expected_pooling = (weights > 0).astype(np.float32).toarray() + np.eye(60, dtype=np.float32)
    summed = expected_pooling @ counts.toarray()
    expected = np.log1p(summed / summed.sum(axis=1, keepdims=True) * 1e4)
    in_layer = ad.AnnData(np.zeros(counts.shape, dtype=np.float32), layers={"counts": counts})
    in_x = ad.AnnData(counts.copy())
    for adata in (in_layer, in_x):
        adata.obsp["connectivities"] = weights
        metacells = coexpression.pool_metacells(adata, method="knn", n_metacells=0, seed=0, backend="cpu")
        np.testing.assert_allclose(metacells.X.toarray(), expected, rtol=1e-5, atol=1e-5)
        assert metacells.var_names.equals(adata.var_names)


def test_the_network_records_its_counts_settings_and_steps_and_a_seed_decides_it(caplog):
    """uns["coexpression"] counts the genes, cells, edges and modules, also in the log; the
    provenance holds every setting and the seed and the eigengenes' step; with k-means
    metacells the seed decides the network: the same seed, the same hub scores."""
    adata, _ = planted_data(n_cells=800, n_genes=300, seed=8)
    adata.obsm["X_pca"] = PCA(n_components=10, random_state=0).fit_transform(adata.X.toarray())
    options = replace(OPTIONS, metacells=MetacellOptions(method="kmeans", n_metacells=150))
    results = []
    for seed in (3, 3):
        cells = adata.copy()
        with caplog.at_level("INFO", logger="omicsprep.network.pipeline"):
            results.append(run_coexpression(cells, options=options, seed=seed, backend="cpu"))
    record = cells.uns["coexpression"]
    result = results[0]
    assert record["samples"] == 150 and record["edges"] == len(result["edges"])
    assert record["modules"] == result["eigengenes"].shape[1] and record["genes"] == result["modules"].shape[0]
    assert f"coexpression: {record}" in caplog.messages
    provenance = cells.uns["omicsprep"]["coexpression"]
    params = json.loads(provenance["params"])
    assert params["seed"] == 3 and params["top_k"] == OPTIONS.top_k and params["metacells"]["n_metacells"] == 150
    assert "eigengenes" in provenance["timings"]
    pd.testing.assert_frame_equal(results[0]["modules"], results[1]["modules"])


def per_cluster_data():
    """Planted cells in clusters of 1,200 (a network), 50 (too few), 700 whose expression all but
    10 genes lack (a network that cannot be built) and 600 (exactly min_cells: a network)."""
    adata, truth = planted_data(n_cells=2550, n_genes=400, seed=5)
    sizes = {"0": 1200, "1": 50, "2": 700, "3": 600}
    adata.obs["leiden_1.0"] = pd.Categorical(np.repeat(list(sizes), list(sizes.values())))
    values = adata.X.tolil()
    values[1250:1950, 10:] = 0
    adata.X = values.tocsr()
    adata.X.eliminate_zeros()
    adata.obsm["X_pca"] = PCA(n_components=10, random_state=0).fit_transform(adata.X.toarray())
    return adata, truth


def test_a_network_per_cluster(caplog):
    """Each cluster's own network, as run_coexpression gives it for that cluster's cells (seed
    and metacells passed on); clusters with too few cells or whose network cannot be built are
    skipped, each with its reason, the rest still done; the log says which."""
    adata, truth = per_cluster_data()
    options = replace(
        OPTIONS,
        metacells=MetacellOptions(method="kmeans", n_metacells=300),
        per_cluster=PerClusterOptions(enabled=True, min_cells=600),
    )
    with caplog.at_level("INFO", logger="omicsprep.network.pipeline"):
        table = run_coexpression_per_cluster(adata, options=options, clusters="leiden_1.0", seed=3, backend="cpu")
    assert list(table.columns) == ["cluster", "gene", "module", "hub_score"]
    assert table.index.equals(pd.RangeIndex(len(table)))
    assert list(table["cluster"].unique()) == ["0", "3"]
    skipped = adata.uns["coexpression"]["clusters_skipped"]
    assert list(skipped) == ["1", "2"] and skipped["1"] == "50 cells"
    assert skipped["2"].startswith("10 usable genes")
    assert f"coexpression per cluster: 2 networks, skipped {skipped}" in caplog.messages
    for cluster, modules in table.groupby("cluster"):
        cells = adata[(adata.obs["leiden_1.0"] == cluster).to_numpy()].copy()
        alone = run_coexpression(cells, options=options, seed=3, backend="cpu")["modules"]
        pd.testing.assert_frame_equal(
            modules.drop(columns="cluster").reset_index(drop=True), alone.astype({"module": str})
        )
        assert planted_ari(modules, adata, truth) >= 0.9


def test_per_cluster_networks_with_none_skipped_or_none_left(caplog):
    adata, _ = planted_data(n_cells=300, n_genes=250, seed=6)
    adata.obs["leiden_1.0"] = pd.Categorical(["0"] * 300)
    for min_cells, networks, skipped in ((300, 1, "none"), (301, 0, "{'0': '300 cells'}")):
        options = replace(OPTIONS, per_cluster=PerClusterOptions(enabled=True, min_cells=min_cells))
        caplog.clear()
        with caplog.at_level("INFO", logger="omicsprep.network.pipeline"):
            table = run_coexpression_per_cluster(adata, options=options, clusters="leiden_1.0", seed=0, backend="cpu")
        assert list(table.columns) == ["cluster", "gene", "module", "hub_score"]
        assert (table["cluster"].nunique(), bool(len(table))) == (networks, bool(networks))
        assert f"coexpression per cluster: {networks} networks, skipped {skipped}" in caplog.messages
