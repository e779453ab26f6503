"""The Snakemake workflow end to end: dry runs, lint, a full CPU run, and bad input."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from conftest import CITESEQ, MULTIOME, PBMC_H5, PBMC_MTX, REPO
from scipy import sparse

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


def snakemake(*args: str, workdir: Path | None = None, overlay: Path | None = None) -> subprocess.CompletedProcess:
    """Run the workflow with the shipped config and the demo's settings over it (and
    ``overlay``'s over those); with ``workdir``, there."""
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), *args,
               "--configfile", str(REPO / "config" / "config.yaml"), str(DEMO_CONFIG),
               *([str(overlay)] if overlay else [])]
    if workdir is not None:
        command += ["--directory", str(workdir)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)


def write_sheet(path: Path, rows: list[str], header: str = "sample\tinput") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("profile", [None, "profiles/default", "profiles/slurm", "profiles/generic"])
def test_dry_run_of_shipped_config_and_profiles(profile):
    args = ["-n", "--forceall", "--quiet", "rules"] + (["--profile", profile] if profile else [])
    result = snakemake(*args)
    assert result.returncode == 0, result.stderr
    for rule in ("qc", "cluster", "plot_qc", "plot_umap", "run_times"):
        assert rule in result.stdout + result.stderr


# The rules that may use the GPU: those whose backend the config chooses.
GPU_RULES = sorted(set(re.findall(r'backend_for\("(\w+)"\)', "".join(
    path.read_text() for path in (REPO / "rules").glob("*.smk")))))


def dry_run_gpu_requests(output: str) -> dict[str, set[int]]:
    """The ``gpu`` resource each rule's jobs request, from a dry run's job listing
    (``rule NAME:`` then an indented ``resources: ..., gpu=N`` line; no entry counts as 0)."""
    requests: dict[str, set[int]] = {}
    for block in re.split(r"\n(?=rule \w+:\n)", output)[1:]:
        rule = re.match(r"rule (\w+):", block).group(1)
        resources = re.search(r"^\s+resources: (.*)$", block, flags=re.MULTILINE)
        gpu = re.search(r"(?:^|, )gpu=(\d+)", resources.group(1)) if resources else None
        requests.setdefault(rule, set()).add(int(gpu.group(1)) if gpu else 0)
    return requests


def every_rule_sheet(path: Path) -> Path:
    """Samples that between them need every rule: reads (count_umis), RNA with fragments
    (chromatin, multiome) and antibody tags alone (protein)."""
    return write_sheet(path, [
        f"reads\t{REPO / 'tests' / 'data' / 'umi_tools' / 'chr19_gene_tags.bam'}\tbam\t\t\t",
        f"multiome\t{MULTIOME / 'rna.h5ad'}\t\t\t{MULTIOME / 'fragments.tsv.gz'}\t{MULTIOME / 'peaks.bed'}",
        f"citeseq\t\t\t{CITESEQ / 'cells'}\t\t",
    ], header="sample\tinput\tformat\tadt\tfragments\tpeaks")


def test_gpu_rules_are_the_documented_ones():
    assert GPU_RULES == sorted(["count_umis", "qc", "cluster", "coexpression", "protein", "chromatin", "multiome",
                                "merge"])


@pytest.mark.parametrize("pinned", GPU_RULES)
def test_backend_per_rule_pins_one_rule_to_the_cpu(tmp_path, pinned):
    """Each rule that may use the GPU can be pinned to the CPU: the config validates, the
    pinned rule's jobs request no GPU, and every other such rule's jobs request one."""
    sheet = every_rule_sheet(tmp_path / "s.tsv")
    overlay = tmp_path / "merge.yaml"
    overlay.write_text(f"merge:\n  enabled: true\nchromatin:\n  genes: {MULTIOME / 'genes.bed'}\n")
    result = snakemake("-n", "--forceall", "--config", f"samples={sheet}", f"backend_per_rule={{{pinned}: cpu}}",
                       workdir=tmp_path, overlay=overlay)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    requests = dry_run_gpu_requests(result.stdout + result.stderr)
    assert set(GPU_RULES) <= set(requests), requests  # the sheet needs every such rule
    assert requests == {rule: {0} if rule == pinned or rule not in GPU_RULES else {1} for rule in requests}


def test_backend_per_rule_refuses_a_rule_that_never_uses_the_gpu(tmp_path):
    result = snakemake("-n", "--config", "backend_per_rule={plot_qc: cpu}", workdir=tmp_path)
    expect_failure(result, "Additional properties are not allowed ('plot_qc' was unexpected)")


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


def test_full_run_writes_every_output(cpu_run):
    for sample in ("pbmc_h5", "pbmc_mtx"):
        for name in OUTPUTS:
            path = cpu_run / "results" / sample / name
            assert path.is_file() and path.stat().st_size > 0, path
        assert (cpu_run / "logs" / "cluster" / f"{sample}.log").is_file()
        assert (cpu_run / "benchmarks" / "cluster" / f"{sample}.tsv").is_file()
    assert not list((cpu_run / "results").rglob("*.tmp*"))


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


def expect_failure(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in output, output[-3000:]


def test_missing_input_file(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"ghost\t{tmp_path / 'ghost.h5'}"])
    expect_failure(
        snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path), "sample 'ghost'", "ghost.h5", "does not exist"
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
        ("sample\tpath", [f"a\t{PBMC_H5}"], "missing columns ['input']"),
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


@pytest.mark.skipif(
    __import__("omicsprep.backend").backend.gpu_unavailable_reason() is None, reason="a GPU is present"
)
def test_explicit_gpu_without_one_fails_clearly(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"pbmc\t{PBMC_H5}"])
    result = snakemake("--cores", "1", "--config", f"samples={sheet}", "backend=gpu", workdir=tmp_path)
    expect_failure(result, "omicsprep error: backend 'gpu' was requested but cannot be used")
    assert not (tmp_path / "results" / "pbmc" / "qc.h5ad").exists()


def test_a_sample_given_as_reads_is_counted_then_qcd(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import generate

    bam = tmp_path / "reads.bam"
    generate.write_bam(generate.generate_reads(150_000, n_cells=200, n_genes=300, seed=5), bam)
    sheet = write_sheet(tmp_path / "s.tsv", [f"reads\t{bam}"])
    result = snakemake("results/reads/qc.h5ad", "--cores", "2", "--config", f"samples={sheet}", workdir=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = pd.read_csv(tmp_path / "results" / "reads" / "umi_counts.tsv", sep="\t")
    assert list(counts.columns) == ["gene", "cell", "count"]
    adata = ad.read_h5ad(tmp_path / "results" / "reads" / "qc.h5ad")
    assert 100 <= adata.n_obs <= 200
    skipped = adata.uns["umi_dedup"]["reads_skipped"]
    assert skipped["several genes"] > 0 and skipped["UMI with N"] > 0
    assert (tmp_path / "benchmarks" / "count_umis" / "reads.tsv").is_file()


def test_multiome_and_citeseq_samples(tmp_path):
    """The demo's Multiome sample (RNA + ATAC fragments and peaks) and CITE-seq sample
    (antibody tags and empty droplets, no RNA) through their rules, on the CPU."""
    sheet = write_sheet(
        tmp_path / "samples.tsv",
        [f"multiome\t{MULTIOME / 'rna.h5ad'}\t\t{MULTIOME / 'fragments.tsv.gz'}\t{MULTIOME / 'peaks.bed'}",
         f"citeseq\t\t{CITESEQ / 'cells'}\t\t"],
        header="sample\tinput\tadt\tfragments\tpeaks",
    )
    targets = ["results/multiome/multiome.h5mu", "results/multiome/plots/umap_joint.png",
               "results/citeseq/protein.h5ad", "results/multiome/coexpression/modules.tsv"]
    genes = f"chromatin={{genes: {MULTIOME / 'genes.bed'}}}"
    result = snakemake(*targets, "--cores", "2", "--config", f"samples={sheet}", "backend=cpu", genes,
                       workdir=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    import mudata

    joined = mudata.read_h5mu(tmp_path / "results" / "multiome" / "multiome.h5mu")
    assert list(joined.mod) == ["rna", "atac"] and 700 < joined.n_obs <= 1000
    assert joined.mod["atac"].n_vars <= 174 and "X_lsi" in joined.mod["atac"].obsm
    assert joined.mod["atac"].obs["n_fragments"].sum() > 0
    assert (joined.mod["atac"].obs["tss_enrichment"] > 0).sum() > 50
    weights = joined.obs[["rna:mod_weight", "atac:mod_weight"]].to_numpy()
    np.testing.assert_allclose(weights.sum(axis=1), 1, atol=1e-5)
    assert joined.obsm["X_umap"].shape == (joined.n_obs, 2)
    assert joined.obs["wnn_leiden_1.0"].dtype == "category" and joined.obs["wnn_leiden_1.0"].nunique() >= 2
    assert joined.uns["omicsprep"]["multiome"]["backend"] == "cpu"
    prot = ad.read_h5ad(tmp_path / "results" / "citeseq" / "protein.h5ad")
    assert prot.n_obs == 2872 and prot.uns["omicsprep"]["protein"]["backend"] == "cpu"
    assert '"normalization": "clr"' in prot.uns["omicsprep"]["protein"]["params"]  # no empty droplets: CLR
    assert prot.var["isotype_control"].sum() >= 1 and "X_umap" in prot.obsm
    # 45 genes cannot carry a 50-partner co-expression network: a documented skip.
    provenance = (tmp_path / "results" / "multiome" / "coexpression" / "provenance.json").read_text()
    assert "too few for top_k" in provenance
    assert pd.read_csv(tmp_path / "results" / "multiome" / "coexpression" / "modules.tsv", sep="\t").empty


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["s\t\t\t\t"], "neither input (RNA) nor adt"),
        ([f"s\t\t{CITESEQ / 'cells'}\t{MULTIOME / 'fragments.tsv.gz'}\t"], "column fragments needs column input"),
        ([f"s\t{PBMC_H5}\t\tmissing.tsv.gz\t"], "fragments file 'missing.tsv.gz' does not exist"),
    ],
)
def test_bad_modality_columns(tmp_path, rows, message):
    sheet = write_sheet(tmp_path / "s.tsv", rows, header="sample\tinput\tadt\tfragments\tpeaks")
    expect_failure(snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path), "sample 's'", message)


def test_multiome_refuses_modalities_without_shared_cells(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"mixed\t{MULTIOME / 'rna.h5ad'}\t{CITESEQ / 'cells'}"],
                        header="sample\tinput\tadt")
    result = snakemake("results/mixed/multiome.h5mu", "--cores", "2", "--config", f"samples={sheet}", "backend=cpu",
                       workdir=tmp_path)
    expect_failure(result, "sample 'mixed'", "modalities share 0 cell barcodes")
    assert not (tmp_path / "results" / "mixed" / "multiome.h5mu").exists()


def test_merge_with_harmony_and_keep_going(tmp_path):
    """Two batches of the same PBMCs (their barcodes collide) and one broken sample: with
    --keep-going the good samples finish and the merge waits for every sample; with
    merge.allow_partial it merges the two, names the missing one, and reports the
    integration."""
    empty = tmp_path / "empty.h5ad"
    ad.AnnData(sparse.csr_matrix((0, 5), dtype=np.float32)).write_h5ad(empty)
    rows = [f"pbmc_a\t{PBMC_H5}\tb1", f"pbmc_b\t{PBMC_MTX}\tb2", f"broken\t{empty}\tb3"]
    sheet = write_sheet(tmp_path / "s.tsv", rows, header="sample\tinput\tbatch")
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
    assert set(merged.obs["sample"]) == {"pbmc_a", "pbmc_b"} and merged.obs_names.is_unique
    assert merged.n_obs == 2 * ad.read_h5ad(tmp_path / "results" / "pbmc_a" / "processed.h5ad").n_obs
    assert "X_pca_harmony" in merged.obsm and merged.obs["leiden_1.0"].nunique() >= 3
    metrics = pd.read_csv(tmp_path / target, sep="\t").set_index("stage")
    assert metrics.loc["after", "batch_mixing"] > 0.9  # identical batches mix fully
    assert metrics.loc["after", "label_conservation"] > 0.5
