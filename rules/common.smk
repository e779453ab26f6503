# Helpers of every stage: configuration and sample sheet validation, input functions.

import csv
from pathlib import Path

import pandas as pd
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from omicsprep.clustering import cluster_key
from omicsprep.errors import InputError
from omicsprep.io import READ_FORMATS, resolve_format

validate(config, schema="../config/schemas/config.schema.yaml", set_default=True)

REQUIRED_COLUMNS = ("sample", "input")


def load_sample_sheet(path):
    """Read and check the sample sheet; every problem names the sheet and the sample."""
    sheet = Path(path)
    if not sheet.is_file():
        raise WorkflowError(f"sample sheet {str(sheet)!r} does not exist (config key 'samples')")
    with sheet.open(newline="") as handle:
        header = next(csv.reader(handle, delimiter="\t"), [])
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if duplicated:
        raise WorkflowError(f"sample sheet {str(sheet)!r}: duplicate columns {duplicated}")
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise WorkflowError(f"sample sheet {str(sheet)!r}: missing columns {missing} (found {header})")
    samples = pd.read_csv(sheet, sep="\t", dtype=str, keep_default_na=False)
    if samples.empty:
        raise WorkflowError(f"sample sheet {str(sheet)!r} lists no samples")
    repeated = sorted(samples.loc[samples["sample"].duplicated(), "sample"].unique())
    if repeated:
        raise WorkflowError(f"sample sheet {str(sheet)!r}: samples listed more than once: {repeated}")
    try:
        validate(samples, schema="../config/schemas/samples.schema.yaml")
    except WorkflowError as exc:
        raise WorkflowError(f"sample sheet {str(sheet)!r} does not match its schema", exc)
    if "format" not in samples:
        samples["format"] = ""
    if "batch" not in samples:
        samples["batch"] = ""
    for row in samples.itertuples():
        try:
            samples.loc[row.Index, "format"] = resolve_format(row.input, fmt=row.format)
        except InputError as exc:
            raise WorkflowError(f"sample sheet {str(sheet)!r}: {exc.for_sample(row.sample)}")
    return samples.set_index("sample", drop=False)


SAMPLE_SHEET = load_sample_sheet(config["samples"])
SAMPLES = list(SAMPLE_SHEET.index)
CLUSTER_SECTIONS = ("normalize", "hvg", "pca", "neighbors", "umap", "leiden", "louvain", "markers")
QC_METRIC_COLUMNS = ["total_counts", "n_genes_by_counts", "pct_counts_mt", "doublet_score"]


def check_marker_resolution():
    markers = config["markers"]
    resolutions = config[markers["algorithm"]]["resolutions"]
    if markers["resolution"] not in resolutions:
        raise WorkflowError(
            f"config: markers.resolution {markers['resolution']} is not among "
            f"{markers['algorithm']}.resolutions {resolutions}"
        )


check_marker_resolution()


def backend_for(rule_name):
    """The configured backend, per-rule override first, else the global one."""
    return config["backend_per_rule"].get(rule_name, config["backend"])


def gpus_for(rule_name):
    """GPUs requested from the scheduler; none for rules pinned to the CPU."""
    return 0 if backend_for(rule_name) == "cpu" else 1


def conda_env_for(rule_name):
    """The RAPIDS environment for rules that may use the GPU, the CPU one otherwise."""
    return "../envs/cpu.yaml" if backend_for(rule_name) == "cpu" else "../envs/rapids.yaml"


def is_reads(sample):
    return SAMPLE_SHEET.loc[sample, "format"] in READ_FORMATS


def reads_input(wildcards):
    return SAMPLE_SHEET.loc[wildcards.sample, "input"]


def reads_format(wildcards):
    return SAMPLE_SHEET.loc[wildcards.sample, "format"]


def counts_input(wildcards):
    """The count matrix: the sheet's, or the one counted from the sample's reads."""
    if is_reads(wildcards.sample):
        return f"results/{wildcards.sample}/umi_counts.h5ad"
    return SAMPLE_SHEET.loc[wildcards.sample, "input"]


def counts_format(wildcards):
    return "h5ad" if is_reads(wildcards.sample) else SAMPLE_SHEET.loc[wildcards.sample, "format"]


def sample_batch(wildcards):
    return SAMPLE_SHEET.loc[wildcards.sample, "batch"]


def cluster_params():
    return {section: config[section] for section in CLUSTER_SECTIONS}


def markers_cluster_key():
    """The obs column of the clustering that markers (and per-cluster networks) use."""
    return cluster_key(config["markers"]["algorithm"], config["markers"]["resolution"])


def cluster_keys():
    """The obs columns holding clusters, one per algorithm and resolution."""
    return [
        cluster_key(algorithm, resolution)
        for algorithm in ("leiden", "louvain")
        for resolution in config[algorithm]["resolutions"]
    ]


# Rules whose run times the report tabulates, with the file holding each one's provenance
# (backend, step timings): an AnnData, or a JSON record.
TIMED_RULES = {
    "qc": "results/{sample}/qc.h5ad",
    "cluster": "results/{sample}/processed.h5ad",
    "coexpression": "results/{sample}/coexpression/provenance.json",
}


def timed_pairs():
    rules = [rule for rule in TIMED_RULES if rule != "coexpression" or config["coexpression"]["enabled"]]
    return [(sample, rule) for sample in SAMPLES for rule in rules]


def timed_samples():
    return [sample for sample, _ in timed_pairs()]


def timed_rules():
    return [rule for _, rule in timed_pairs()]


def timed_benchmarks():
    return [f"benchmarks/{rule}/{sample}.tsv" for sample, rule in timed_pairs()]


def timed_provenance():
    return [TIMED_RULES[rule].format(sample=sample) for sample, rule in timed_pairs()]


def final_outputs():
    per_sample = [
        "results/{sample}/processed.h5ad",
        "results/{sample}/obs.parquet",
        "results/{sample}/markers.tsv",
        "results/{sample}/qc/cell_metrics.parquet",
        "results/{sample}/plots/qc_histograms.png",
        "results/{sample}/plots/qc_scatter.png",
        "results/{sample}/plots/umap_clusters.png",
        "results/{sample}/plots/umap_qc.png",
    ]
    if config["coexpression"]["enabled"]:
        per_sample += [f"results/{{sample}}/coexpression/{name}" for name in COEXPRESSION_OUTPUTS]
    return [*expand(per_sample, sample=SAMPLES), "results/run_times.tsv"]


COEXPRESSION_OUTPUTS = (
    "edges.parquet",
    "modules.tsv",
    "modules_per_cluster.tsv",
    "eigengenes.parquet",
    "provenance.json",
    "module_correlation.png",
    "module_scores_umap.png",
)
