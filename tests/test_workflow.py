"""The Snakemake workflow end to end: dry runs, lint, a full CPU run, and bad input."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from conftest import (
    CITESEQ,
    DROPLETS_H5,
    DROPLETS_TRUTH,
    MULTIOME,
    PBMC_H5,
    PBMC_MTX,
    REPO,
    pool_running,
)
from matplotlib import image
from scipy import sparse

from omicsprep import io
from omicsprep.jobs import read_phases
from omicsprep.testing import snakemake_command

pytestmark = pytest.mark.workflow

OUTPUTS = [
    "processed.h5ad",
    "obs.parquet",
    "markers.tsv",
    "qc/cell_metrics.parquet",
    "plots/qc_histograms.png",
    "plots/qc_scatter.png",
    "plots/umap_clusters.png",
    "plots/umap_qc.png",
    "coexpression/edges.parquet",
    "coexpression/modules.tsv",
    "coexpression/modules_per_cluster.tsv",
    "coexpression/provenance.json",
    "coexpression/eigengenes.parquet",
    "coexpression/module_correlation.png",
    "coexpression/module_scores_umap.png",
]


DEMO_CONFIG = REPO / "resources" / "demo" / "config.yaml"


def workflow_command(*args: str, workdir: Path | None = None, overlay: Path | None = None) -> list[str]:
    """The command that runs the workflow with the shipped config and the demo's settings
    over it (and ``overlay``'s over those); with ``workdir``, there.
    """
    command = snakemake_command(
        *args,
        "--configfile",
        str(REPO / "config" / "config.yaml"),
        str(DEMO_CONFIG),
        *([str(overlay)] if overlay else []),
    )
    if workdir is not None:
        command += ["--directory", str(workdir)]
    return command


def snakemake(
    *args: str, workdir: Path | None = None, overlay: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run :func:`workflow_command` (in environment ``env``, if given)."""
    command = workflow_command(*args, workdir=workdir, overlay=overlay)
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200, env=env)


def write_sheet(path: Path, rows: list[str], header: str = "sample\tinput") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("profile", [None, "profiles/default", "profiles/slurm", "profiles/generic"])
def test_dry_run_of_shipped_config_and_profiles(profile):
    args = ["-n", "--forceall", "--quiet", "rules"] + (["--profile", profile] if profile else [])
    result = snakemake(*args)
    assert result.returncode == 0, result.stderr
    for rule in ("qc", "cluster", "coexpression", "run_times"):
        assert rule in result.stdout + result.stderr


# The rules that may use the GPU: those whose backend the config chooses.
GPU_RULES = sorted(
    set(re.findall(r'backend_for\("(\w+)"\)', "".join(path.read_text() for path in (REPO / "rules").glob("*.smk"))))
)


def dry_run_gpu_requests(output: str) -> dict[str, set[int | str]]:
    """The ``gpu`` resource each rule's jobs request, from a dry run's job listing
    (``rule NAME:`` then an indented ``resources: ..., gpu=N`` line; no entry counts as 0;
    ``<TBD>``: decided once the job's inputs exist, by their size).
    """
    requests: dict[str, set[int | str]] = {}
    for block in re.split(r"\n(?=rule \w+:\n)", output)[1:]:
        rule = re.match(r"rule (\w+):", block).group(1)
        resources = re.search(r"^\s+resources: (.*)$", block, flags=re.MULTILINE)
        gpu = re.search(r"(?:^|, )gpu=(\d+|<TBD>)", resources.group(1)) if resources else None
        value = gpu.group(1) if gpu else "0"
        requests.setdefault(rule, set()).add(int(value) if value.isdigit() else value)
    return requests


def dry_run_threads(output: str) -> dict[str, set[int]]:
    """The threads each rule's jobs ask for, from a dry run's job listing (no ``threads:`` line: 1)."""
    threads: dict[str, set[int]] = {}
    for block in re.split(r"\n(?=rule \w+:\n)", output)[1:]:
        rule = re.match(r"rule (\w+):", block).group(1)
        count = re.search(r"^\s+threads: (\d+)$", block, flags=re.MULTILINE)
        threads.setdefault(rule, set()).add(int(count.group(1)) if count else 1)
    return threads


def every_rule_sheet(path: Path) -> Path:
    """Samples that between them need every rule: reads (count_umis), RNA with fragments
    (atac, multiome) and antibody tags alone (protein).
    """
    return write_sheet(
        path,
        [
            f"reads\t{REPO / 'tests' / 'data' / 'umi_tools' / 'chr19_gene_tags.bam'}\tbam\t\t\t",
            f"multiome\t{MULTIOME / 'rna.h5ad'}\t\t\t{MULTIOME / 'fragments.tsv.gz'}\t{MULTIOME / 'peaks.bed'}",
            f"citeseq\t\t\t{CITESEQ / 'cells'}\t\t",
        ],
        header="sample\tinput\tformat\tadt\tfragments\tpeaks",
    )


def test_gpu_rules_are_the_documented_ones():
    documented = [
        "count_umis",
        "call_cells",
        "cellbender",
        "qc",
        "cluster",
        "coexpression",
        "protein",
        "atac",
    ]
    assert sorted([*documented, "multiome", "merge", "annotate"]) == GPU_RULES


def test_the_rules_import_no_heavy_library():
    # Every Snakemake process (a run, a dry run, each SLURM job) parses the rules: what
    # rules/common.smk and rules/common/ import from omicsprep must leave AnnData, Numba and SciPy
    # unimported (about 1.5 s of start-up, and as much again of teardown, on 2 cores).
    helpers = [REPO / "rules" / "common.smk", *sorted((REPO / "rules" / "common").glob("*.smk"))]
    lines = [line for path in helpers for line in path.read_text().splitlines()]
    imports = [line for line in lines if line.startswith(("from omicsprep", "import omicsprep"))]
    check = "import sys\n" + "\n".join(imports) + "\nprint(sorted({'anndata', 'numba', 'scipy'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert len(imports) >= 5
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("pinned", GPU_RULES)
def test_backend_per_rule_pins_one_rule_to_the_cpu(tmp_path, pinned):
    """Each rule that may use the GPU can be pinned to the CPU: the config validates, and the
    pinned rule's jobs request no GPU (the others do on a cluster, tests/test_slurm.py, and
    locally when their inputs are large: decided once the inputs exist).
    """
    sheet = every_rule_sheet(tmp_path / "s.tsv")
    overlay = tmp_path / "merge.yaml"
    # CellBender removes the ambient RNA, so that its rule runs too (for the reads sample).
    model = tmp_path / "types.pkl"  # a dry run does not read it
    model.touch()
    overlay.write_text(
        f"merge:\n  enabled: true\natac:\n  genes: {MULTIOME / 'genes.bed'}\n"
        f"cells:\n  ambient:\n    method: cellbender\nannotate:\n  model: {model}\n"
    )
    result = snakemake(
        "-n",
        "--forceall",
        "--config",
        f"samples={sheet}",
        f"backend_per_rule={{{pinned}: cpu}}",
        workdir=tmp_path,
        overlay=overlay,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    requests = dry_run_gpu_requests(result.stdout + result.stderr)
    assert set(GPU_RULES) <= set(requests), requests  # the sheet needs every such rule
    assert requests[pinned] == {0}
    assert all(requests[rule] <= {0, 1, "<TBD>"} for rule in GPU_RULES)
    assert all(requests[rule] == {0} for rule in set(requests) - set(GPU_RULES))


# Stands in for Apptainer: gives its version, and runs each `apptainer exec ... IMAGE SHELL -c CMD`
# here, recording the image and the command.
APPTAINER_STANDIN = """#!{python}
import subprocess, sys

arguments = sys.argv[1:]
if arguments == ["--version"]:
    sys.exit(print("apptainer version 1.3.4"))
assert arguments[0] == "exec", arguments
*options, image, shell, flag, command = arguments[1:]
with open({record!r}, "a") as record:
    record.write(image + "\\t" + command.replace("\\n", " ") + "\\n")
sys.exit(subprocess.call([shell, flag, command]))
"""


def test_sdm_apptainer_runs_each_rule_in_its_image(tmp_path):
    """With --sdm apptainer, each job runs through Apptainer in the image config `containers`
    names: rules that may use the GPU in the GPU image (backend auto), a rule pinned to the CPU in
    the CPU one."""
    record = tmp_path / "apptainer.tsv"
    standin = tmp_path / "bin" / "apptainer"
    standin.parent.mkdir()
    standin.write_text(APPTAINER_STANDIN.format(python=sys.executable, record=str(record)))
    standin.chmod(0o755)
    sheet = write_sheet(tmp_path / "s.tsv", [f"pbmc_h5\t{PBMC_H5}"])
    # In an image `python` is the image's; here this one's.
    path = os.pathsep.join([str(standin.parent), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path}
    result = snakemake(
        "results/pbmc_h5/processed.h5ad",
        "--cores",
        "2",
        "--sdm",
        "apptainer",
        "--config",
        f"samples={sheet}",
        "containers={cpu: cpu.sif, gpu: gpu.sif}",
        "backend_per_rule={qc: cpu}",
        workdir=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    runs = pd.read_csv(record, sep="\t", names=["image", "command"])
    rules = runs["command"].str.extract(r"scripts/tmp\w+\.(\w+)\.py")[0]  # the rule's script, copied
    assert dict(zip(rules, runs["image"], strict=True)) == {"qc": "cpu.sif", "cluster": "gpu.sif"}


def test_local_jobs_share_the_gpu_and_ask_one_thread(tmp_path):
    """Locally, on a machine with a GPU, small jobs of GPU rules ask for no whole GPU and one thread each
    (they run side by side, in the pool); the same run pinned to the CPU asks for the rules' CPU threads."""
    sheet = write_sheet(tmp_path / "s.tsv", [f"pbmc\t{PBMC_H5}"])
    probe = tmp_path / "gpu.py"
    # A visible NVIDIA device and RAPIDS, as omicsprep.resources.gpu_expected finds them on a GPU machine.
    probe.write_text("from omicsprep import resources\nresources.gpu_expected = lambda: True\n")
    outputs = {}
    for backend in ("auto", "cpu"):
        command = workflow_command(
            "-n", "--forceall", "--cores", "8", "--config", f"samples={sheet}", f"backend={backend}"
        )
        code = (
            f"import runpy, sys; exec(open({str(probe)!r}).read()); sys.argv = {command[2:]!r}; "
            "runpy.run_module('snakemake', run_name='__main__')"
        )
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs[backend] = result.stdout + result.stderr
    threads = {backend: dry_run_threads(output) for backend, output in outputs.items()}
    assert threads["auto"]["qc"] == threads["auto"]["cluster"] == {1}
    assert threads["cpu"]["qc"] == {2} and threads["cpu"]["cluster"] == {4}
    assert dry_run_gpu_requests(outputs["auto"])["qc"] == {0}


def test_backend_per_rule_refuses_a_rule_that_never_uses_the_gpu(tmp_path):
    result = snakemake("-n", "--config", "backend_per_rule={run_times: cpu}", workdir=tmp_path)
    expect_failure(result, "Additional properties are not allowed ('run_times' was unexpected)")


def test_lint_is_clean():
    result = snakemake("--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One full CPU run on the chr21 PBMCs, read from the 10x HDF5 and MatrixMarket forms."""
    workdir = tmp_path_factory.mktemp("run")
    sheet = write_sheet(
        workdir / "samples.tsv",
        [f"pbmc_h5\t{PBMC_H5}\t\tb1", f"pbmc_mtx\t{PBMC_MTX}\t10x_mtx\tb2"],
        header="sample\tinput\tformat\tbatch",
    )
    result = snakemake("--cores", "2", "--config", f"samples={sheet}", "backend=cpu", workdir=workdir)
    assert result.returncode == 0, result.stderr[-5000:]
    return workdir


@pytest.fixture
def gpu_pool():
    """A pool of one warm worker (omicsprep.pool), in a runtime folder of the test's own: the environment using it."""
    with pool_running(n_workers=1) as env:
        yield env


def assert_same_outputs(ours: Path, theirs: Path) -> None:
    """A sample's outputs of two runs hold the same tables, matrices and embeddings."""
    for table in ("qc/cell_metrics.parquet", "obs.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(ours / table), pd.read_parquet(theirs / table))
    pd.testing.assert_frame_equal(
        pd.read_csv(ours / "markers.tsv", sep="\t"), pd.read_csv(theirs / "markers.tsv", sep="\t")
    )
    for name in ("qc.h5ad", "processed.h5ad"):
        one, two = ad.read_h5ad(ours / name), ad.read_h5ad(theirs / name)
        assert abs(one.X - two.X).max() == 0, name
        for key in one.layers:
            assert (one.layers[key] != two.layers[key]).nnz == 0, key
        pd.testing.assert_frame_equal(one.var, two.var)
        assert sorted(one.obsm) == sorted(two.obsm) and sorted(one.uns) == sorted(two.uns)
        for key in one.obsm:
            np.testing.assert_array_equal(one.obsm[key], two.obsm[key], err_msg=key)
    for figure in ("qc_histograms", "qc_scatter", "umap_clusters", "umap_qc"):
        drawn, again = (image.imread(run / "plots" / f"{figure}.png") for run in (ours, theirs))
        assert drawn.shape == again.shape and np.abs(drawn - again).mean() < 0.01, figure


def test_the_pool_runs_jobs_as_their_own_processes_do(cpu_run, tmp_path, gpu_pool):
    """Jobs handed to the pool (backend auto, and the study summary) write what they write in their own
    processes, one worker running job after job; a failing job reports as it does there, leaves nothing,
    and its worker is replaced."""
    from omicsprep import pool

    sheet = write_sheet(tmp_path / "samples.tsv", [f"pbmc_h5\t{PBMC_H5}\t\tb1"], header="sample\tinput\tformat\tbatch")
    workdir = tmp_path / "run"
    targets = [f"results/pbmc_h5/{name}" for name in ("processed.h5ad", "plots/umap_qc.png", "plots/qc_scatter.png")]
    targets.append("results/summary.tsv")
    result = snakemake(*targets, "--cores", "2", "--config", f"samples={sheet}", workdir=workdir, env=gpu_pool)
    assert result.returncode == 0, result.stderr[-5000:]
    logs = {rule: workdir / "logs" / rule / "pbmc_h5.log" for rule in ("qc", "cluster")}
    logs["summary"] = workdir / "logs" / "summary" / "all.log"
    workers = {rule: (read_phases(log) or {}).get("pool_worker") for rule, log in logs.items()}
    pool_log = Path(gpu_pool[pool.POOL]).with_suffix(".log").read_text()
    assert workers["qc"] is not None and len(set(workers.values())) == 1, (workers, result.stderr, pool_log)
    assert "its matrix taken from this worker's memory" in logs["cluster"].read_text()  # as rule qc left it
    assert_same_outputs(workdir / "results" / "pbmc_h5", cpu_run / "results" / "pbmc_h5")
    summary, alone = (pd.read_csv(run / "results" / "summary.tsv", sep="\t", index_col=0) for run in (workdir, cpu_run))
    pd.testing.assert_series_equal(summary.loc["pbmc_h5"], alone.loc["pbmc_h5", summary.columns])

    empty = tmp_path / "empty.h5ad"
    ad.AnnData(sparse.csr_matrix((0, 5), dtype=np.float32)).write_h5ad(empty)
    sheet = write_sheet(tmp_path / "empty.tsv", [f"empty\t{empty}"])
    result = snakemake("--cores", "1", "--config", f"samples={sheet}", workdir=tmp_path / "empty", env=gpu_pool)
    expect_failure(result, f"omicsprep error: sample 'empty': file '{empty}': matrix is empty (0 cells x 5 genes)")
    assert not any((tmp_path / "empty" / "results").rglob("*.h5ad"))
    state = pool.status(Path(gpu_pool[pool.POOL]))
    assert state["workers"] in (["booting"], ["ready"])  # a new worker took the failed one's place


def assert_same_gpu_outputs(ours: Path, theirs: Path) -> None:
    """As :func:`assert_same_outputs`, but clusters: cuGraph's Leiden may order its work otherwise from run to run."""
    from sklearn.metrics import adjusted_rand_score

    pd.testing.assert_frame_equal(
        pd.read_parquet(ours / "qc/cell_metrics.parquet"), pd.read_parquet(theirs / "qc/cell_metrics.parquet")
    )
    for name in ("qc.h5ad", "processed.h5ad"):
        one, two = ad.read_h5ad(ours / name), ad.read_h5ad(theirs / name)
        for key in ("X", *one.layers):
            first, second = (adata.X if key == "X" else adata.layers[key] for adata in (one, two))
            assert abs(first - second).max() < 1e-6, (name, key)
        pd.testing.assert_frame_equal(one.var, two.var)
        for column in ("total_counts", "n_genes_by_counts", "doublet_score", "predicted_doublet"):
            pd.testing.assert_series_equal(one.obs[column], two.obs[column])
        assert sorted(one.obsm) == sorted(two.obsm) and sorted(one.obsp) == sorted(two.obsp)
        if "leiden_1.0" in one.obs:
            assert adjusted_rand_score(one.obs["leiden_1.0"], two.obs["leiden_1.0"]) > 0.9


@pytest.mark.gpu
def test_the_pool_runs_gpu_jobs_as_their_own_processes_do(tmp_path, gpu_pool):
    """On the GPU, where a worker imported RAPIDS and created its CUDA context before its jobs, and runs
    the second sample's jobs after the first's: the same outputs as the jobs' own processes write."""
    sheet = write_sheet(tmp_path / "samples.tsv", [f"first\t{PBMC_H5}", f"pbmc_h5\t{PBMC_H5}"])
    outputs = {}
    for env in (gpu_pool, {**os.environ, "OMICSPREP_POOL": "off"}):
        workdir = tmp_path / ("pool" if env is gpu_pool else "own")
        targets = [
            "results/first/processed.h5ad",
            "results/pbmc_h5/processed.h5ad",
            "results/pbmc_h5/plots/umap_qc.png",
        ]
        settings = [f"samples={sheet}", "backend=gpu"]
        result = snakemake(*targets, "-j1", "--resources", "gpu=1", "--config", *settings, workdir=workdir, env=env)
        assert result.returncode == 0, result.stderr[-5000:]
        phases = read_phases(workdir / "logs" / "cluster" / "pbmc_h5.log")
        assert ("pool_worker" in phases) == (env is gpu_pool)
        outputs[env is gpu_pool] = workdir / "results" / "pbmc_h5"
    assert_same_gpu_outputs(outputs[True], outputs[False])


@pytest.mark.parametrize(("sample", "source"), [("pbmc_h5", PBMC_H5), ("pbmc_mtx", PBMC_MTX)])
def test_full_run_writes_every_output(cpu_run, sample, source):
    """Every output of a sample, read back: each agrees with the input matrix, with the
    other outputs and with the shipped config.
    """
    import json

    import matplotlib.image

    from omicsprep import io

    results = cpu_run / "results" / sample
    for name in OUTPUTS:
        assert (results / name).is_file() and (results / name).stat().st_size > 0, name
    assert not list((cpu_run / "results").rglob("*.tmp*"))
    raw = io.read_counts(source)
    qc = ad.read_h5ad(results / "qc.h5ad")
    adata = ad.read_h5ad(results / "processed.h5ad")

    # QC table: every input cell, its metrics recomputed from the input; the cells that
    # passed are those of qc.h5ad, whose X is the input's counts for them.
    metrics = pd.read_parquet(results / "qc" / "cell_metrics.parquet")
    assert list(metrics.index) == list(raw.obs_names)
    np.testing.assert_allclose(metrics["total_counts"], np.asarray(raw.X.sum(axis=1)).ravel(), rtol=1e-6)
    np.testing.assert_array_equal(metrics["n_genes_by_counts"], np.asarray((raw.X > 0).sum(axis=1)).ravel())
    assert (metrics["passed"] == (metrics["fail_reason"] == "")).all()
    assert list(metrics.index[metrics["passed"]]) == list(qc.obs_names) == list(adata.obs_names)
    assert (abs(raw[qc.obs_names, qc.var_names].X - qc.X)).max() == 0
    for column in ("total_counts", "n_genes_by_counts", "pct_counts_mt", "doublet_score"):
        np.testing.assert_allclose(adata.obs[column], metrics.loc[metrics["passed"], column], rtol=1e-6)
    log = (cpu_run / "logs" / "qc" / f"{sample}.log").read_text()
    kept = re.search(r"qc: kept (\d+) of (\d+) cells, (\d+) genes", log)
    assert kept
    assert tuple(map(int, kept.groups())) == (adata.n_obs, raw.n_obs, adata.n_vars)

    # processed.h5ad: qc.h5ad's counts kept in a layer, log-normalized X (10,000 per cell),
    # embeddings and graph of every cell; obs.parquet is its obs.
    assert list(adata.var_names) == list(qc.var_names)
    assert (abs(adata.layers["counts"] - qc.X)).max() == 0
    np.testing.assert_allclose(np.expm1(adata.X.toarray()).sum(axis=1), 1e4, rtol=1e-4)
    assert adata.var["highly_variable"].sum() == min(2000, adata.n_vars)
    assert adata.obsm["X_pca"].shape == (adata.n_obs, 50)
    assert adata.obsm["X_umap"].shape == (adata.n_obs, 2)
    assert adata.obsp["connectivities"].shape == (adata.n_obs, adata.n_obs)
    pd.testing.assert_frame_equal(pd.read_parquet(results / "obs.parquet"), adata.obs)

    # markers.tsv: scanpy's ranking stored in processed.h5ad, 25 genes per Leiden 1.0
    # cluster, with expressing fractions recomputed from the counts.
    markers = pd.read_csv(results / "markers.tsv", sep="\t", dtype={"group": str})
    assert list(markers.columns) == [
        "group",
        "gene",
        "scores",
        "logfoldchanges",
        "pvals",
        "pvals_adj",
        "pct_nz_group",
        "pct_nz_reference",
    ]
    clusters = adata.obs["leiden_1.0"].astype(str)
    assert set(markers["group"]) == set(clusters)
    ranked = adata.uns["rank_genes_groups"]["names"]
    expressed = pd.DataFrame((adata.layers["counts"] > 0).toarray(), index=adata.obs_names, columns=adata.var_names)
    for group, table in markers.groupby("group"):
        assert list(table["gene"]) == list(ranked[group][:25]), group
        assert table["scores"].is_monotonic_decreasing
        np.testing.assert_allclose(table["pct_nz_group"], expressed[clusters == group][table["gene"]].mean())
        np.testing.assert_allclose(table["pct_nz_reference"], expressed[clusters != group][table["gene"]].mean())
    assert markers["pvals_adj"].between(0, 1).all()
    assert (markers["pvals_adj"] >= markers["pvals"]).all()

    # Co-expression: modules of the network's genes, hub scores recomputed from the edges
    # (weighted degree within the module over the module's largest), a finite eigengene
    # per cell and module, and provenance that counts them.
    edges = pd.read_parquet(results / "coexpression" / "edges.parquet")
    modules = pd.read_csv(results / "coexpression" / "modules.tsv", sep="\t")
    eigengenes = pd.read_parquet(results / "coexpression" / "eigengenes.parquet")
    provenance = json.loads((results / "coexpression" / "provenance.json").read_text())
    assert modules["gene"].is_unique
    assert set(modules["gene"]) <= set(adata.var_names)
    assert set(edges["gene_a"]) | set(edges["gene_b"]) <= set(modules["gene"])
    assert (edges["gene_a"] != edges["gene_b"]).all()
    assert edges["weight"].between(0, 1, inclusive="right").all()
    assert len({frozenset(pair) for pair in zip(edges["gene_a"], edges["gene_b"], strict=False)}) == len(edges)
    module_of = modules.set_index("gene")["module"]
    inside = edges[module_of[edges["gene_a"]].to_numpy() == module_of[edges["gene_b"]].to_numpy()]
    degree = pd.concat([inside.groupby("gene_a")["weight"].sum(), inside.groupby("gene_b")["weight"].sum()])
    degree = degree.groupby(level=0).sum().reindex(modules["gene"], fill_value=0).to_numpy()
    assigned = modules[modules["module"] != "unassigned"].assign(degree=degree[modules["module"] != "unassigned"])
    hub = assigned["degree"] / assigned.groupby("module")["degree"].transform("max")
    np.testing.assert_allclose(assigned["hub_score"], hub, rtol=1e-5)
    sizes = assigned["module"].value_counts()
    assert list(sizes.index) == [f"M{i + 1}" for i in range(len(sizes))]
    assert sizes.is_monotonic_decreasing
    assert list(eigengenes.index) == list(adata.obs_names)
    assert list(eigengenes.columns) == list(sizes.index)
    assert np.isfinite(eigengenes.to_numpy()).all()
    assert (eigengenes.std() > 0).all()
    assert provenance["backend"] == "cpu"
    assert provenance["summary"] == {
        "edges": len(edges),
        "genes": len(modules),
        "genes_skipped": provenance["summary"]["genes_skipped"],
        "modules": len(sizes),
        "samples": adata.n_obs,
    }
    per_cluster = pd.read_csv(results / "coexpression" / "modules_per_cluster.tsv", sep="\t")
    assert list(per_cluster.columns) == ["cluster", "gene", "module", "hub_score"]
    assert per_cluster.empty

    # Figures are images with something drawn; benchmarks hold one measured run.
    for name in [name for name in OUTPUTS if name.endswith(".png")]:
        image = matplotlib.image.imread(results / name)
        assert min(image.shape[:2]) > 100 and image[..., :3].std() > 0.05, name
    for rule in ("qc", "cluster", "coexpression"):
        benchmark = pd.read_csv(cpu_run / "benchmarks" / rule / f"{sample}.tsv", sep="\t")
        assert len(benchmark) == 1 and benchmark.loc[0, "s"] > 0 and benchmark.loc[0, "max_rss"] > 0, rule


def test_full_run_results(cpu_run):
    results = cpu_run / "results"
    adata = ad.read_h5ad(results / "pbmc_h5" / "processed.h5ad")
    assert sparse.issparse(adata.layers["counts"])
    assert adata.uns["omicsprep"]["cluster"]["backend"] == "cpu"
    assert adata.uns["omicsprep"]["qc"]["backend"] == "cpu"
    assert {"leiden_0.5", "leiden_1.0", "louvain_1.0"} <= set(adata.obs.columns)
    assert adata.obs["leiden_1.0"].nunique() >= 3
    assert set(adata.obs["batch"]) == {"b1"}
    assert 1000 < adata.n_obs < 1107
    # The same matrix read from two formats gives the same cells and clusters.
    obs_h5 = pd.read_parquet(results / "pbmc_h5" / "obs.parquet")
    obs_mtx = pd.read_parquet(results / "pbmc_mtx" / "obs.parquet")
    assert list(obs_h5.index) == list(obs_mtx.index)
    assert (obs_h5["leiden_1.0"] == obs_mtx["leiden_1.0"]).all()
    markers = pd.read_csv(results / "pbmc_h5" / "markers.tsv", sep="\t")
    assert list(markers.columns[:3]) == ["group", "gene", "scores"]
    assert markers["group"].nunique() == adata.obs["leiden_1.0"].nunique()
    metrics = pd.read_parquet(results / "pbmc_h5" / "qc" / "cell_metrics.parquet")
    assert len(metrics) == 1107
    # Co-expression modules of the real PBMCs, with a score per cell.
    modules = pd.read_csv(results / "pbmc_h5" / "coexpression" / "modules.tsv", sep="\t")
    eigengenes = pd.read_parquet(results / "pbmc_h5" / "coexpression" / "eigengenes.parquet")
    assert list(eigengenes.index) == list(adata.obs_names)
    assert eigengenes.shape[1] >= 2
    assert set(eigengenes.columns) == set(modules["module"]) - {"unassigned"}
    assert metrics["passed"].sum() == adata.n_obs
    times = pd.read_csv(results / "run_times.tsv", sep="\t")
    assert set(times["rule"]) == {"qc", "cluster", "coexpression"}
    assert (times.loc[times["step"] == "total", "seconds"] > 0).all()
    assert np.isin(["neighbors", "leiden", "doublets", "correlation", "modules"], times["step"]).all()


def test_report_holds_plots_and_timings(cpu_run):
    result = snakemake("--report", "report.html", "--config", f"samples={cpu_run / 'samples.tsv'}", workdir=cpu_run)
    assert result.returncode == 0, result.stderr[-3000:]
    html = (cpu_run / "report.html").read_text(errors="replace")
    for name in ("qc_histograms.png", "umap_clusters.png", "run_times.tsv", "markers.tsv"):
        assert name in html
    # The report opens on the study's summary, a table with a row per sample; tables are tables.
    description = re.search(r'var workflow_desc = "(.*?)";\n', html).group(1)
    title = '<h1 class=\\"title\\">Study summary</h1>'
    assert description.startswith('<div class=\\"document\\" id=\\"study-summary\\">\\n' + title)
    first_row = description.split("<tbody")[1].split("</tr>")[0]
    assert "<td>pbmc_h5</td>" in first_row and "<td>1107</td>" in first_row
    assert html.count('<th class=\\"head\\">pct_nz_group</th>') == 2  # each sample's markers, as a table


def test_the_study_summary_counts_each_samples_cells_through_qc(cpu_run):
    summary = pd.read_csv(cpu_run / "results" / "summary.tsv", sep="\t", index_col="sample")
    assert list(summary.index) == ["pbmc_h5", "pbmc_mtx"]
    for sample, row in summary.iterrows():
        metrics = pd.read_parquet(cpu_run / "results" / sample / "qc" / "cell_metrics.parquet")
        obs = pd.read_parquet(cpu_run / "results" / sample / "obs.parquet")
        kept = metrics[metrics["passed"]]
        assert row["cells_in"] == len(metrics) == 1107 and row["cells_kept"] == len(obs) == len(kept)
        removed = row[[column for column in summary if column.startswith("removed_")]]
        assert removed.sum() == len(metrics) - len(kept) and (removed > 0).any()
        assert row["removed_min_genes"] == (metrics["fail_reason"] == "min_genes").sum()
        assert row["median_genes"] == kept["n_genes_by_counts"].median()
        assert row["median_umis"] == kept["total_counts"].median()
        assert row["clusters"] == obs["leiden_1.0"].nunique()
        assert pd.isna(row["barcodes"])  # no droplets: no barcodes


def test_the_summary_and_multiqc_wait_for_clustering_not_for_the_rules_after_it():
    """MultiQC takes 2-4 s: run beside co-expression and the other late rules, not after the
    last of them (which run_times, reading every rule's timings, must wait for)."""
    result = snakemake("-n", "--forceall", "results/summary.tsv")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = set(re.findall(r"^rule (\w+):$", result.stdout + result.stderr, flags=re.MULTILINE))
    assert {"qc", "cluster", "summary"} <= jobs and not jobs & {"coexpression", "run_times"}, jobs


def test_multiqc_report_holds_the_study_summary(cpu_run):
    """MultiQC's General Statistics hold each sample's headline figures, as summary.tsv has them."""
    multiqc = cpu_run / "results" / "multiqc"
    summary = pd.read_csv(cpu_run / "results" / "summary.tsv", sep="\t", index_col="sample")
    general = pd.read_csv(multiqc / "multiqc_data" / "multiqc_general_stats.txt", sep="\t", index_col="Sample")
    general.columns = general.columns.str.removeprefix("custom_content_omicsprep-")
    assert list(general.index) == list(summary.index)
    assert list(general.columns) == list(summary.columns[: len(general.columns)])
    pd.testing.assert_frame_equal(general, summary[general.columns], check_names=False, check_dtype=False)
    assert (multiqc / "multiqc_report.html").stat().st_size > 100_000


# Headless Chromium opens a report as a user's browser does; a script added to a copy of the page
# measures, once the page has drawn its parts, where they are (JSON in body's data-layout).
CHROMIUM = shutil.which("chromium-headless-shell")
WINDOW = (1400, 1000)
LAYOUT_SCRIPT = """<script>
const selectors = %s;
const box = (element) => { const r = element.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
const started = Date.now();
const measure = setInterval(() => {
  const found = Object.values(selectors).map((selector) => document.querySelector(selector));
  if (found.includes(null) && Date.now() - started < 15000) return;  // still drawing
  clearInterval(measure);
  const measured = {};
  Object.keys(selectors).forEach((name, i) => {
    measured[name] = found[i] && { box: box(found[i]), text: found[i].innerText };
  });
  setTimeout(() => { document.body.dataset.layout = JSON.stringify(measured); }, 500);  // laid out
}, 250);
</script>"""


def browser_layout(page: Path, selectors: dict[str, str]) -> dict[str, dict]:
    """Each selector's first element in ``page`` as Chromium draws it: its box and text (None if absent)."""
    probe = page.with_name(f"probe_{page.name}")
    head, body_end, tail = page.read_text().rpartition("</body>")  # the page's own; scripts may hold others
    probe.write_text(head + LAYOUT_SCRIPT % json.dumps(selectors) + body_end + tail)
    command = [CHROMIUM, "--no-sandbox", "--disable-gpu", "--window-size={},{}".format(*WINDOW)]
    result = subprocess.run(
        [*command, "--virtual-time-budget=20000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    layout = re.search(r'data-layout="([^"]*)"', result.stdout)
    assert layout, result.stderr[-2000:]
    shot = subprocess.run([*command, f"--screenshot={page.with_suffix('.png')}", page.as_uri()], capture_output=True)
    assert shot.returncode == 0 and image.imread(page.with_suffix(".png"))[..., :3].std() > 0.05
    return json.loads(html.unescape(layout.group(1)))


def text_cells(text: str) -> list[str]:
    """A drawn table's cells, in order, from its text (MultiQC's puts each on a line of its own)."""
    return [cell.strip() for cell in text.split("\n") if cell.strip()]


def overlap(one: list[float], other: list[float]) -> bool:
    return one[0] < other[2] and other[0] < one[2] and one[1] < other[3] and other[1] < one[3]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium-headless-shell is not installed (make test installs it)")
def test_reports_open_on_the_summary_in_a_browser(cpu_run):
    """Snakemake's report opens on the summary's table, in view, clear of the rule graph, the
    headline columns first; MultiQC's opens on General Statistics with each sample's cells kept."""
    result = snakemake("--report", "report.html", "--config", f"samples={cpu_run / 'samples.tsv'}", workdir=cpu_run)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = pd.read_csv(cpu_run / "results" / "summary.tsv", sep="\t", index_col="sample")
    page = browser_layout(
        cpu_run / "report.html",
        {
            "heading": "#study-summary h1",
            "table": "#study-summary table",
            "scroller": "#study-summary div[style]",
            "header": "#study-summary thead",
            "first_row": "#study-summary tbody tr",
            "graph": "canvas.marks",
        },
    )
    assert page["heading"]["text"] == "Study summary"
    assert page["scroller"]["box"][3] < WINDOW[1]  # the whole table in the first view
    assert not overlap(page["scroller"]["box"], page["graph"]["box"])
    assert page["header"]["text"].split()[:3] == ["sample", "cells_kept", "median_genes"]
    assert page["first_row"]["text"].split()[:2] == ["pbmc_h5", str(summary.loc["pbmc_h5", "cells_kept"])]

    multiqc = browser_layout(
        cpu_run / "results" / "multiqc" / "multiqc_report.html",
        {"first_section": "#general_stats", "table": "#general_stats table", "header": "#general_stats thead"},
    )
    assert multiqc["first_section"]["box"][1] < WINDOW[1]
    header = text_cells(multiqc["header"]["text"])
    body = text_cells(multiqc["table"]["text"])[len(header) :]
    rows = [body[start : start + len(header)] for start in range(0, len(body), len(header))]
    column = header.index("Cells kept")
    assert {row[0]: int(re.sub(r"\D", "", row[column])) for row in rows} == summary["cells_kept"].to_dict()  # 1 068


@pytest.mark.parametrize(
    ("setting", "reruns"),
    [
        ("leiden={resolutions: [0.5, 1.0, 1.5]}", {"cluster", "coexpression", "run_times", "summary"}),
        ("neighbors={n_neighbors: 20}", {"cluster", "coexpression", "run_times", "summary"}),
        ("doublets={expected_rate: 0.08}", {"qc", "cluster", "coexpression", "run_times", "summary"}),
    ],
)
def test_a_changed_clustering_setting_reruns_clustering_not_qc(cpu_run, setting, reruns):
    """Snakemake reruns a job whose parameters changed, and what follows it: a resolution or
    neighbours' setting reruns rule cluster, not qc and its doublet scoring; a QC setting both."""
    result = snakemake("-n", "--config", f"samples={cpu_run / 'samples.tsv'}", "backend=cpu", setting, workdir=cpu_run)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = set(re.findall(r"^rule (\w+):$", result.stdout + result.stderr, flags=re.MULTILINE))
    assert jobs - {"all"} == reruns, jobs


def expect_failure(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in output, output[-3000:]


def test_missing_input_file(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"ghost\t{tmp_path / 'ghost.h5'}"])
    expect_failure(
        snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path),
        "sample 'ghost'",
        "ghost.h5",
        "does not exist",
    )


def test_unknown_format(tmp_path):
    counts = tmp_path / "counts.xlsx"
    counts.write_text("cell,gene\n")
    sheet = write_sheet(tmp_path / "s.tsv", [f"csv\t{counts}"])
    expect_failure(snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path), "sample 'csv'", "unknown format")


@pytest.mark.parametrize(
    ("header", "rows", "message"),
    [
        ("sample\tinput\tinput", [f"a\t{PBMC_H5}\t{PBMC_H5}"], "duplicate columns ['input']"),
        ("input\tpath", [f"{PBMC_H5}\tx"], "missing columns ['sample']"),
        ("sample\tpath", [f"a\t{PBMC_H5}"], "sample 'a': neither input, raw or fastq_1 (RNA) nor adt"),
        ("sample\tinput", [f"a\t{PBMC_H5}", f"a\t{PBMC_MTX}"], "samples listed more than once: ['a']"),
    ],
)
def test_bad_sample_sheet(tmp_path, header, rows, message):
    sheet = write_sheet(tmp_path / "s.tsv", rows, header=header)
    expect_failure(snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path), str(sheet), message)


def test_bad_config_value(tmp_path):
    expect_failure(snakemake("-n", "--config", "backend=tpu", workdir=tmp_path), "backend", "tpu")


def test_empty_matrix_fails_its_sample_and_leaves_nothing(tmp_path):
    empty = tmp_path / "empty.h5ad"
    ad.AnnData(sparse.csr_matrix((0, 5), dtype=np.float32)).write_h5ad(empty)
    sheet = write_sheet(tmp_path / "s.tsv", [f"empty\t{empty}"])
    result = snakemake("--cores", "1", "--config", f"samples={sheet}", workdir=tmp_path)
    expect_failure(result, f"omicsprep error: sample 'empty': file '{empty}': matrix is empty (0 cells x 5 genes)")
    assert not (tmp_path / "results" / "empty").exists() or not any((tmp_path / "results" / "empty").rglob("*"))


@pytest.mark.skipif(__import__("omicsprep.backend").backend.gpu_unavailable_reason() is None, reason="a GPU is present")
def test_explicit_gpu_without_one_fails_clearly(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"pbmc\t{PBMC_H5}"])
    result = snakemake("--cores", "1", "--config", f"samples={sheet}", "backend=gpu", workdir=tmp_path)
    expect_failure(result, "omicsprep error: sample 'pbmc': backend 'gpu' was requested but cannot be used")
    assert not (tmp_path / "results" / "pbmc" / "qc.h5ad").exists()


def test_a_sample_given_as_reads_is_counted_then_qcd(tmp_path):
    from omicsprep.testing.reads import generate_reads, write_bam

    bam = tmp_path / "reads.bam"
    write_bam(generate_reads(150_000, n_cells=200, n_genes=300, seed=5), bam)
    sheet = write_sheet(tmp_path / "s.tsv", [f"reads\t{bam}"])
    # Every barcode of these reads is a cell: no cell calling.
    result = snakemake(
        "results/reads/qc.h5ad",
        "--cores",
        "2",
        "--config",
        f"samples={sheet}",
        "cells={method: none}",
        workdir=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = pd.read_csv(tmp_path / "results" / "reads" / "umi_counts.tsv", sep="\t")
    assert list(counts.columns) == ["gene", "cell", "count"]
    adata = ad.read_h5ad(tmp_path / "results" / "reads" / "qc.h5ad")
    assert 100 <= adata.n_obs <= 200
    skipped = adata.uns["umi_dedup"]["reads_skipped"]
    assert skipped["several genes"] > 0
    assert skipped["UMI with N"] > 0
    assert (tmp_path / "benchmarks" / "count_umis" / "reads.tsv").is_file()


def test_raw_droplets_are_called_then_qcd(tmp_path):
    """Raw droplets, as a raw 10x matrix and as the reads of the same droplets (a BAM): the
    cells called among them and their ambient RNA removed (DecontX) before qc."""
    from omicsprep.testing.droplets import droplet_reads, generate_raw_droplets
    from omicsprep.testing.reads import write_bam

    droplets = generate_raw_droplets(150, 6_000, 800, seed=3)
    bam = tmp_path / "droplets.bam"
    write_bam(droplet_reads(droplets, seed=3), bam)
    sheet = write_sheet(tmp_path / "s.tsv", [f"raw\t\t{DROPLETS_H5}", f"reads\t{bam}\t"], header="sample\tinput\traw")
    targets = [f"results/{sample}/qc.h5ad" for sample in ("raw", "reads")]
    dry = snakemake("results/reads/qc.h5ad", "-n", "--config", f"samples={sheet}", workdir=tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    order = re.findall(r"^rule (\w+):", dry.stdout + dry.stderr, flags=re.MULTILINE)
    assert order == ["count_umis", "call_cells", "qc"], order
    result = snakemake(
        *targets,
        "--cores",
        "2",
        "--config",
        f"samples={sheet}",
        "backend=cpu",
        "cells={niters: 2000, ambient: {method: decontx}}",
        workdir=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    truth = {"raw": pd.read_parquet(DROPLETS_TRUTH), "reads": droplets.truth}
    for sample in ("raw", "reads"):
        cells = tmp_path / "results" / sample / "cells"
        table = pd.read_parquet(cells / "barcodes.parquet")
        assert {"total", "rank", "p_value", "fdr", "is_cell", "method", "ambient_fraction"} <= set(table.columns)
        called = table["is_cell"].reindex(truth[sample].index, fill_value=False)
        assert (called == truth[sample]["is_cell"]).mean() > 0.99
        for figure in ("knee.png", "ambient.png"):
            assert (cells / figure).stat().st_size > 0
        matrix = ad.read_h5ad(cells / "matrix.h5ad")
        assert matrix.n_obs == table["is_cell"].sum()
        assert (matrix.layers["counts_uncorrected"].sum() > matrix.X.sum()) and "ambient_fraction" in matrix.obs
        qc = ad.read_h5ad(tmp_path / "results" / sample / "qc.h5ad")
        assert set(qc.obs_names) <= set(matrix.obs_names)


@pytest.mark.skipif(shutil.which("cellbender") is not None, reason="CellBender is installed here")
def test_cellbender_without_its_environment_fails_clearly(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"raw\t\t{DROPLETS_H5}"], header="sample\tinput\traw")
    result = snakemake(
        "results/raw/qc.h5ad",
        "--cores",
        "1",
        "--config",
        f"samples={sheet}",
        "cells={ambient: {method: cellbender}}",
        workdir=tmp_path,
    )
    expect_failure(result, "sample 'raw': cells.ambient.method cellbender needs CellBender")
    cells = tmp_path / "results" / "raw" / "cells"
    assert not cells.exists() or not any(cells.iterdir())


def test_raw_droplets_with_antibody_rows_give_dsb_its_background(tmp_path):
    """A CITE-seq run's raw matrix (RNA and antibody rows) as both raw and adt: the antibody
    counts of the cells called on the RNA are normalized by dsb against the empty droplets'."""
    from omicsprep.testing import generate
    from omicsprep.testing.droplets import generate_raw_droplets

    droplets = generate_raw_droplets(150, 6_000, 800, seed=4)
    rng = np.random.default_rng(4)
    antibodies = (*(f"CD{i}" for i in range(10)), "Isotype_IgG1", "Isotype_IgG2a")
    is_cell = droplets.truth["is_cell"].to_numpy()
    # Cells carry tens to hundreds of each tag, empty droplets a few (free antibodies).
    means = np.where(is_cell[:, None], rng.lognormal(4, 1, (1, len(antibodies))), 3.0)
    tags = rng.poisson(means * rng.lognormal(0, 0.5, (is_cell.size, 1)))
    raw = tmp_path / "raw_feature_bc_matrix.h5"
    counts = sparse.hstack([droplets.counts, sparse.csr_matrix(tags, dtype=np.float32)], format="csr")
    generate.write_10x_h5(counts, raw, barcodes=droplets.barcodes, antibodies=antibodies)
    sheet = write_sheet(tmp_path / "s.tsv", [f"cite\t\t{raw}\t{raw}"], header="sample\tinput\traw\tadt")
    result = snakemake(
        "results/cite/protein.h5ad",
        "--cores",
        "2",
        "--config",
        f"samples={sheet}",
        "backend=cpu",
        "cells={niters: 2000}",
        workdir=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    calls = pd.read_parquet(tmp_path / "results" / "cite" / "cells" / "barcodes.parquet")
    protein = ad.read_h5ad(tmp_path / "results" / "cite" / "protein.h5ad")
    assert set(protein.obs_names) == set(calls.index[calls["is_cell"]])
    assert '"normalization": "dsb"' in protein.uns["omicsprep"]["protein"]["params"]


def test_raw_column_refused_with_reads(tmp_path):
    bam = REPO / "tests" / "data" / "umi_tools" / "chr19_gene_tags.bam"
    sheet = write_sheet(tmp_path / "s.tsv", [f"s\t{bam}\t{DROPLETS_H5}"], header="sample\tinput\traw")
    expect_failure(
        snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path), "sample 's'", "leave column raw empty"
    )


def fastq_pair(folder: Path) -> tuple[Path, Path]:
    """Two small FASTQ files (content irrelevant to a dry run)."""
    paths = (folder / "r1.fastq", folder / "r2.fastq")
    for path in paths:
        path.write_text("@r\nACGT\n+\nIIII\n")
    return paths


def fastq_config(folder: Path, *, whitelists: str = "{10xv3: none}") -> list[str]:
    fasta, gtf = folder / "genome.fa", folder / "genes.gtf"
    fasta.write_text(">chr1\nACGT\n")
    gtf.write_text("")
    return [f"reference={{fasta: {fasta}, gtf: {gtf}, whitelists: {whitelists}}}"]


def test_fastq_sample_is_aligned_counted_and_called(tmp_path):
    """A sample given as FASTQ goes through the STAR index, STARsolo, UMI counting and cell
    calling to qc (a dry run; tests/test_fastq_workflow.py runs it)."""
    r1, r2 = fastq_pair(tmp_path)
    sheet = write_sheet(
        tmp_path / "s.tsv", [f"f\t\t{r1}\t{r2}\t10xv3"], header="sample\tinput\tfastq_1\tfastq_2\tchemistry"
    )
    dry = snakemake(
        "results/f/qc.h5ad", "-n", "--config", f"samples={sheet}", *fastq_config(tmp_path), workdir=tmp_path
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    order = re.findall(r"^rule (\w+):", dry.stdout + dry.stderr, flags=re.MULTILINE)
    assert order == ["star_index", "align", "count_umis", "call_cells", "qc"], order


@pytest.mark.skipif(shutil.which("STAR") is None, reason="STAR is not installed (make test installs Debian's rna-star)")
@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_fastq_sample_runs_to_qc(tmp_path, backend):
    """FASTQ (two lanes, 10x v3) of 60 cells and 1,500 empty droplets, through STARsolo, UMI
    counting and cell calling: the planted cells are called, with their gene names, and the
    STAR run leaves its outputs only."""
    from omicsprep.testing import generate_fastq

    genome = generate_fastq.generate_genome(n_chromosomes=3, n_genes=200, seed=0)
    fasta, gtf = tmp_path / "genome.fa", tmp_path / "genes.gtf"
    generate_fastq.write_reference(genome, fasta=fasta, gtf=gtf)
    planted = generate_fastq.generate_fastqs(
        genome,
        out_dir=tmp_path / "fastq",
        n_cells=60,
        reads_per_cell=1200,
        n_lanes=2,
        n_decoys=3000,
        n_empty_droplets=1500,
        seed=2,
    )
    lanes_1, lanes_2 = (";".join(str(path) for path in paths) for paths in (planted.fastq_1, planted.fastq_2))
    sheet = write_sheet(
        tmp_path / "s.tsv", [f"f\t\t{lanes_1}\t{lanes_2}\t10xv3"], header="sample\tinput\tfastq_1\tfastq_2\tchemistry"
    )
    reference = f"reference={{fasta: {fasta}, gtf: {gtf}, whitelists: {{10xv3: {planted.whitelist}}}}}"
    result = snakemake(
        "results/f/qc.h5ad",
        "--cores",
        "2",
        "--config",
        f"samples={sheet}",
        reference,
        f"backend={backend}",
        "cells={niters: 2000}",
        "doublets={enabled: false, remove: false}",
        workdir=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    star = tmp_path / "results" / "f" / "star"
    assert {path.name for path in star.parent.iterdir() if path.name.startswith("star")} == {"star"}
    summary = io.read_solo_summary(star / "Solo.out" / "Gene" / "Summary.csv")
    assert summary["Reads With Valid Barcodes"] > 0.95
    assert not (tmp_path / "results" / "reference" / "star_index" / "_STARtmp").exists()
    calls = pd.read_parquet(tmp_path / "results" / "f" / "cells" / "barcodes.parquet")
    called = set(calls.index[calls["is_cell"]])
    assert len(called ^ set(planted.barcodes)) <= 1, sorted(called ^ set(planted.barcodes))
    qc = ad.read_h5ad(tmp_path / "results" / "f" / "qc.h5ad")
    genes = {gene.gene_id: gene.name for gene in genome.genes}
    assert set(qc.var["gene_ids"]) <= set(genes)
    assert all(genes[gene_id] == name for gene_id, name in zip(qc.var["gene_ids"], qc.var_names, strict=True))
    for rule in ("star_index", "align", "count_umis", "call_cells"):
        assert next((tmp_path / "benchmarks" / rule).glob("*.tsv"))


@pytest.mark.parametrize(
    ("columns", "reference", "message"),
    [
        ("{r1}\t{r2}\t", "given", "column(s) fastq_1, fastq_2 need column(s) chemistry too"),
        ("{r1}\t\t10xv3", "given", "need column(s) fastq_2 too"),
        ("{r1}\t{r2};{r2}\t10xv3", "given", "fastq_1 lists 1 file(s), fastq_2 2: one pair per lane"),
        ("{r1}\tghost.fastq.gz\t10xv3", "given", "FASTQ file 'ghost.fastq.gz' does not exist"),
        ("{r1}\t{r2}\t10xv9", "given", "column 'chemistry'"),
        ("{r1}\t{r2}\t10xv3", "absent", "set reference.fasta and reference.gtf"),
        ("{r1}\t{r2}\t10xv3", "without whitelist", "reference.whitelists.10xv3: sample 'f' is 10xv3"),
    ],
)
def test_bad_fastq_samples(tmp_path, columns, reference, message):
    r1, r2 = fastq_pair(tmp_path)
    sheet = write_sheet(
        tmp_path / "s.tsv",
        ["f\t\t" + columns.format(r1=r1, r2=r2)],
        header="sample\tinput\tfastq_1\tfastq_2\tchemistry",
    )
    config = {
        "given": fastq_config(tmp_path),
        "absent": [],
        "without whitelist": fastq_config(tmp_path, whitelists="{}"),
    }[reference]
    expect_failure(snakemake("-n", "--config", f"samples={sheet}", *config, workdir=tmp_path), message)


def test_multiome_and_citeseq_samples(tmp_path):
    """The demo's Multiome sample (RNA + ATAC fragments and peaks) and CITE-seq sample
    (antibody tags and empty droplets, no RNA) through their rules, on the CPU.
    """
    sheet = write_sheet(
        tmp_path / "samples.tsv",
        [
            f"multiome\t{MULTIOME / 'rna.h5ad'}\t\t{MULTIOME / 'fragments.tsv.gz'}\t{MULTIOME / 'peaks.bed'}",
            f"citeseq\t\t{CITESEQ / 'cells'}\t\t",
        ],
        header="sample\tinput\tadt\tfragments\tpeaks",
    )
    targets = [
        "results/multiome/multiome.h5mu",
        "results/multiome/plots/umap_joint.png",
        "results/citeseq/protein.h5ad",
        "results/multiome/coexpression/modules.tsv",
    ]
    genes = f"atac={{genes: {MULTIOME / 'genes.bed'}}}"
    result = snakemake(*targets, "--cores", "2", "--config", f"samples={sheet}", "backend=cpu", genes, workdir=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    import mudata

    joined = mudata.read_h5mu(tmp_path / "results" / "multiome" / "multiome.h5mu")
    assert list(joined.mod) == ["rna", "atac"]
    assert 700 < joined.n_obs <= 1000
    assert joined.mod["atac"].n_vars <= 174
    assert "X_lsi" in joined.mod["atac"].obsm
    assert joined.mod["atac"].uns["omicsprep"]["atac"]["backend"] == "cpu"
    assert joined.mod["atac"].obs["n_fragments"].sum() > 0
    assert (joined.mod["atac"].obs["tss_enrichment"] > 0).sum() > 50
    weights = joined.obs[["rna:mod_weight", "atac:mod_weight"]].to_numpy()
    np.testing.assert_allclose(weights.sum(axis=1), 1, atol=1e-5)
    assert joined.obsm["X_umap"].shape == (joined.n_obs, 2)
    assert joined.obs["wnn_leiden_1.0"].dtype == "category"
    assert joined.obs["wnn_leiden_1.0"].nunique() >= 2
    assert joined.uns["omicsprep"]["multiome"]["backend"] == "cpu"
    protein = ad.read_h5ad(tmp_path / "results" / "citeseq" / "protein.h5ad")
    assert protein.n_obs == 2872
    assert protein.uns["omicsprep"]["protein"]["backend"] == "cpu"
    assert '"normalization": "clr"' in protein.uns["omicsprep"]["protein"]["params"]  # no empty droplets: CLR
    assert protein.var["isotype_control"].sum() >= 1
    assert "X_umap" in protein.obsm
    # 45 genes cannot carry a 50-partner co-expression network: a documented skip.
    provenance = (tmp_path / "results" / "multiome" / "coexpression" / "provenance.json").read_text()
    assert "too few for top_k" in provenance
    assert pd.read_csv(tmp_path / "results" / "multiome" / "coexpression" / "modules.tsv", sep="\t").empty


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["s\t\t\t\t"], "neither input, raw or fastq_1 (RNA) nor adt"),
        (
            [f"s\t\t{CITESEQ / 'cells'}\t{MULTIOME / 'fragments.tsv.gz'}\t"],
            "column fragments needs column input, raw or fastq_1",
        ),
        ([f"s\t{PBMC_H5}\t\tmissing.tsv.gz\t"], "fragments file 'missing.tsv.gz' does not exist"),
    ],
)
def test_bad_modality_columns(tmp_path, rows, message):
    sheet = write_sheet(tmp_path / "s.tsv", rows, header="sample\tinput\tadt\tfragments\tpeaks")
    expect_failure(snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path), "sample 's'", message)


def test_multiome_refuses_modalities_without_shared_cells(tmp_path):
    sheet = write_sheet(
        tmp_path / "s.tsv", [f"mixed\t{MULTIOME / 'rna.h5ad'}\t{CITESEQ / 'cells'}"], header="sample\tinput\tadt"
    )
    result = snakemake(
        "results/mixed/multiome.h5mu", "--cores", "2", "--config", f"samples={sheet}", "backend=cpu", workdir=tmp_path
    )
    expect_failure(result, "sample 'mixed'", "modalities share 0 cell barcodes")
    assert not (tmp_path / "results" / "mixed" / "multiome.h5mu").exists()


def test_merge_with_harmony_and_keep_going(tmp_path):
    """Two batches of the same PBMCs (their barcodes collide) and one broken sample: with
    --keep-going the good samples finish and the merge waits for every sample; with
    merge.allow_partial it merges the two, names the missing one, and reports the
    integration.
    """
    empty = tmp_path / "empty.h5ad"
    ad.AnnData(sparse.csr_matrix((0, 5), dtype=np.float32)).write_h5ad(empty)
    rows = [f"pbmc_a\t{PBMC_H5}\tb1\td1", f"pbmc_b\t{PBMC_MTX}\tb2\td2", f"broken\t{empty}\tb3\td3"]
    sheet = write_sheet(tmp_path / "s.tsv", rows, header="sample\tinput\tbatch\tdonor")
    overlay = tmp_path / "merge.yaml"
    overlay.write_text("merge:\n  enabled: true\n  batch_key: batch\ncoexpression:\n  enabled: false\n")
    target = "results/merged/integration.tsv"
    args = ["--cores", "2", "--keep-going", "--config", f"samples={sheet}", "backend=cpu"]
    first = snakemake(target, *args, workdir=tmp_path, overlay=overlay)
    assert first.returncode != 0
    assert (tmp_path / "results" / "pbmc_a" / "processed.h5ad").is_file()
    assert not (tmp_path / "results" / "merged").exists()
    overlay.write_text(overlay.read_text().replace("enabled: true\n", "enabled: true\n  allow_partial: true\n", 1))
    second = snakemake(target, *args, workdir=tmp_path, overlay=overlay)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "merge: leaving out samples without results: broken" in second.stderr
    merged = ad.read_h5ad(tmp_path / "results" / "merged" / "merged.h5ad")
    assert set(merged.obs["sample"]) == {"pbmc_a", "pbmc_b"}
    assert merged.obs_names.is_unique
    assert merged.n_obs == 2 * ad.read_h5ad(tmp_path / "results" / "pbmc_a" / "processed.h5ad").n_obs
    assert "X_harmony" in merged.obsm
    assert merged.obs["leiden_1.0"].nunique() >= 3
    # Everything the samples knew of their cells and genes, their own clusters prefixed.
    sample_a = ad.read_h5ad(tmp_path / "results" / "pbmc_a" / "processed.h5ad")
    of_a = merged.obs[merged.obs["sample"] == "pbmc_a"]
    assert (of_a["donor"] == "d1").all() and (merged.obs.loc[merged.obs["sample"] == "pbmc_b", "donor"] == "d2").all()
    np.testing.assert_array_equal(of_a["pct_counts_mt"], sample_a.obs["pct_counts_mt"])
    np.testing.assert_array_equal(of_a["doublet_score"], sample_a.obs["doublet_score"])
    np.testing.assert_array_equal(
        of_a["sample_leiden_1.0"].astype(str), "pbmc_a:" + sample_a.obs["leiden_1.0"].astype(str)
    )
    assert (merged.var.loc[sample_a.var_names, "gene_ids"] == sample_a.var["gene_ids"]).all()
    assert (merged.var["feature_types"] == "Gene Expression").all()
    # Markers of the merged clusters, in the AnnData and as a table.
    markers = pd.read_csv(tmp_path / "results" / "merged" / "markers.tsv", sep="\t")
    assert merged.uns["rank_genes_groups"]["params"]["groupby"] == "leiden_1.0"
    assert set(markers["group"].astype(str)) == set(merged.obs["leiden_1.0"].astype(str))
    assert set(markers["gene"]) <= set(merged.var_names) and (markers.groupby("group").size() <= 25).all()
    metrics = pd.read_csv(tmp_path / target, sep="\t").set_index("method")
    assert metrics.loc["harmony", "batch_mixing"] > 0.9  # identical batches mix fully
    assert metrics.loc["harmony", "label_conservation"] > 0.5
