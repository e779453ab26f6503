# The rules' input functions and parameters, per stage: reads and FASTQ, cells, modalities,
# annotation and the merge, clustering keys.

import shlex
import sys
from dataclasses import fields
from pathlib import Path

from snakemake.exceptions import WorkflowError

from omicsprep.cells.cellbender import remove_background_command
from omicsprep.io import COEXPRESSION_FILES, READ_FORMATS
from omicsprep.options import ClusteringOptions, EmbeddingOptions, cluster_key
from omicsprep.sheet import DERIVED_COLUMNS, KNOWN_COLUMNS, lanes


def is_fastq(sample):
    return bool(SAMPLE_SHEET.loc[sample, "fastq_1"])


def is_reads(sample):
    """Whether the sample's RNA comes as reads (FASTQ, or aligned), counted by rule count_umis."""
    return SAMPLE_SHEET.loc[sample, "format"] in READ_FORMATS or is_fastq(sample)


def has_droplets(sample):
    """Whether the sample's RNA comes as raw droplets (a raw matrix, or reads), whose cells
    rule call_cells calls."""
    return bool(SAMPLE_SHEET.loc[sample, "raw"]) or is_reads(sample)


def reads_inputs(wildcards):
    """The sample's reads: its BAM/SAM or molecule table, or STARsolo's BAM of its FASTQs (with
    STARsolo's gene table, which names the gene IDs counted)."""
    if is_fastq(wildcards.sample):
        return {
            "reads": for_sample(rules.align.output.bam, wildcards.sample),
            "features": for_sample(rules.align.output.features, wildcards.sample),
        }
    return {"reads": SAMPLE_SHEET.loc[wildcards.sample, "input"]}


def reads_format(wildcards):
    return "bam" if is_fastq(wildcards.sample) else SAMPLE_SHEET.loc[wildcards.sample, "format"]


def umi_settings(wildcards):
    """Section umi, whose BAM tags are STARsolo's for a sample aligned here: the corrected
    cell barcode and UMI, and the gene ID (of align.gene_feature, the first of STARsolo's
    features, whose genes its BAM tags carry)."""
    if not is_fastq(wildcards.sample):
        return config["umi"]
    star_tags = {"cell_tag": "CB", "umi_tag": "UB", "gene_tag": "GX"}
    return {**config["umi"], "bam": {**config["umi"]["bam"], **star_tags, "umi_source": "tag"}}


def fastq_inputs(wildcards):
    """A FASTQ sample's read pairs (a list per read, in lane order), the STAR index, and the
    whitelist of its chemistry where one is given."""
    row = SAMPLE_SHEET.loc[wildcards.sample]
    inputs = {"fastq_1": lanes(row["fastq_1"]), "fastq_2": lanes(row["fastq_2"]), "index": star_index_folder()}
    whitelist = config["reference"]["whitelists"].get(row["chemistry"], "none")
    if whitelist != "none":
        inputs["whitelist"] = whitelist
    return inputs


def star_index_folder():
    """The reference's STAR index: the config's ready one, or the one rule star_index builds."""
    return config["reference"]["star_index"] or rules.star_index.output.index


def sample_chemistry(wildcards):
    return SAMPLE_SHEET.loc[wildcards.sample, "chemistry"]


def fastq_samples():
    """The samples given as FASTQ, aligned by STARsolo."""
    return [sample for sample in SAMPLES if is_fastq(sample)]


def check_reference():
    """FASTQ samples need a genome (FASTA and GTF, or a ready index) and, for a 10x chemistry,
    a whitelist entry (a file, or none)."""
    if not fastq_samples():
        return
    reference = config["reference"]
    if not reference["star_index"] and not (reference["fasta"] and reference["gtf"]):
        raise WorkflowError(
            f"config: reference: samples {fastq_samples()} are given as FASTQ: set reference.fasta and "
            "reference.gtf (the STAR index is built from them) or reference.star_index"
        )
    for key in ("fasta", "gtf", "star_index"):
        path = reference[key]
        if path and not Path(path).exists():
            raise WorkflowError(f"config: reference.{key}: {path!r} does not exist")
    for sample in fastq_samples():
        chemistry = SAMPLE_SHEET.loc[sample, "chemistry"]
        whitelist = reference["whitelists"].get(chemistry)
        if whitelist is None and chemistry.startswith("10x"):
            raise WorkflowError(
                f"config: reference.whitelists.{chemistry}: sample {sample!r} is {chemistry}: give the "
                "chemistry's barcode whitelist (shipped with Cell Ranger), or none to take barcodes as read"
            )
        if whitelist not in (None, "none") and not Path(whitelist).is_file():
            raise WorkflowError(f"config: reference.whitelists.{chemistry}: {whitelist!r} does not exist")


check_reference()


def for_sample(path, sample):
    """A rule's output or benchmark path (``rules.<rule>.output.<key>``) for one sample."""
    return expand(path, sample=sample)[0]


def counts_input(wildcards):
    """The cells' count matrix: the sheet's, or the cells called among the sample's droplets."""
    if has_droplets(wildcards.sample):
        return for_sample(rules.call_cells.output.h5ad, wildcards.sample)
    return SAMPLE_SHEET.loc[wildcards.sample, "input"]


def called_samples():
    """The RNA samples whose cells rule call_cells called among their droplets."""
    return [sample for sample in RNA_SAMPLES if has_droplets(sample)]


def counts_format(wildcards):
    return "h5ad" if has_droplets(wildcards.sample) else input_format(wildcards)


def ambient_corrected(wildcards):
    """Whether the sample's cells come with ambient-corrected (fractional) counts."""
    return has_droplets(wildcards.sample) and config["cells"]["ambient"]["method"] != "none"


def cellbender_run_dir(wildcards):
    """CellBender's working folder for a sample, removed after its run."""
    return f"results/{wildcards.sample}/cells/cellbender_run"


def cellbender_command(wildcards, threads):
    """``cellbender remove-background`` on the sample's raw droplets, writing into its run folder
    (``--cuda`` is added by the rule where the GPU is used)."""
    settings = config["cells"]["ambient"]["cellbender"]
    command = remove_background_command(
        raw_input(wildcards),
        Path(cellbender_run_dir(wildcards)) / "cellbender.h5",
        expected_cells=config["cells"]["expected_cells"],
        total_droplets=settings["total_droplets"],
        epochs=settings["epochs"],
        learning_rate=settings["learning_rate"],
        fpr=settings["fpr"],
        posterior_batch_size=settings["posterior_batch_size"],
        projected_ambient_count_threshold=settings["projected_ambient_count_threshold"],
        cpu_threads=threads,
    )
    return shlex.join(command)


def input_format(wildcards):
    return SAMPLE_SHEET.loc[wildcards.sample, "format"]


def raw_input(wildcards):
    """Every droplet of the sample: its raw matrix, or the counts of its reads."""
    if is_reads(wildcards.sample):
        return for_sample(rules.count_umis.output.h5ad, wildcards.sample)
    return SAMPLE_SHEET.loc[wildcards.sample, "raw"]


def raw_format(wildcards):
    return "h5ad" if is_reads(wildcards.sample) else SAMPLE_SHEET.loc[wildcards.sample, "raw_format"]


def call_cells_inputs(wildcards):
    """The raw droplets; the filtered matrix when given beside them (its cells are kept); and
    CellBender's output when it removes the ambient RNA."""
    row = SAMPLE_SHEET.loc[wildcards.sample]
    inputs = {"raw": raw_input(wildcards)}
    if row["raw"] and row["input"]:
        inputs["filtered"] = row["input"]
    if config["cells"]["ambient"]["method"] == "cellbender":
        inputs["cellbender"] = for_sample(rules.cellbender.output.h5, wildcards.sample)
    return inputs


def sample_metadata(wildcards):
    """The sample's obs annotations: its batch and the sheet's metadata columns, where given."""
    row = SAMPLE_SHEET.loc[wildcards.sample]
    columns = [
        "batch",
        *(column for column in SAMPLE_SHEET.columns if column not in KNOWN_COLUMNS + DERIVED_COLUMNS),
    ]
    return {column: row[column] for column in columns if row[column]}


def protein_inputs(wildcards):
    """The sample's antibody counts; the cells called among its raw droplets, when it has them
    (the antibody counts are kept for those); and its empty droplets: given, or (from raw
    droplets, which may hold the antibody rows) the barcodes that are not cells."""
    row = SAMPLE_SHEET.loc[wildcards.sample]
    inputs = {"adt": row["adt"]}
    if has_droplets(wildcards.sample):
        inputs["calls"] = for_sample(rules.call_cells.output.barcodes, wildcards.sample)
    if row["adt_empty"]:
        inputs["empty"] = row["adt_empty"]
    elif row["raw"]:
        inputs["raw"] = row["raw"]
    return inputs


def atac_inputs(wildcards):
    """Fragments, the QC'd RNA cells (the cells counted), and peaks, genes (TSS) and
    chromosome sizes when given."""
    row = SAMPLE_SHEET.loc[wildcards.sample]
    optional = {
        "peaks": row["peaks"],
        "genes": config["atac"]["genes"],
        "chrom_sizes": config["atac"]["chrom_sizes"],
    }
    return {
        "fragments": row["fragments"],
        "cells": for_sample(rules.qc.output.h5ad, wildcards.sample),
        **{name: path for name, path in optional.items() if path},
    }


def annotate_input(wildcards):
    """The cells to annotate, a sample's processed ones."""
    return for_sample(rules.cluster.output.h5ad, wildcards.sample)


def annotate_model():
    """The CellTypist model's path, an input of rule annotate (none when annotation is off)."""
    return config["annotate"]["model"] or []


def annotated_samples():
    """The samples whose cells are annotated, none without annotate.model."""
    return RNA_SAMPLES if config["annotate"]["model"] else []


def merge_scib_figure():
    """The scIB metrics' figure of rule merge, where merge.integration.label_key names known labels."""
    if not config["merge"]["integration"]["label_key"]:
        return []
    return report(
        "results/merged/plots/scib.png",
        category="Integration",
        caption="../report/scib.rst",
        labels={"sample": "merged", "figure": "scIB metrics"},
    )


def merge_cell_types_table():
    """The merged cells' CellTypist types, an output of rule merge with annotate.model."""
    return "results/merged/cell_types.tsv" if config["annotate"]["model"] else []


def merge_cell_types_figure():
    """The merged UMAP coloured by CellTypist's types, an output of rule merge with annotate.model."""
    if not config["annotate"]["model"]:
        return []
    return report(
        "results/merged/plots/umap_cell_types.png",
        category="Cell types",
        caption="../report/cell_types.rst",
        labels={"sample": "merged", "figure": "cell types"},
    )


def merge_inputs(wildcards):
    """Every RNA sample's processed AnnData, keyed by sample; with merge.allow_partial only
    those already written, the others named on the console."""
    paths = {sample: for_sample(rules.cluster.output.h5ad, sample) for sample in RNA_SAMPLES}
    if not config["merge"]["allow_partial"]:
        return paths
    missing = sorted(sample for sample, path in paths.items() if not Path(path).exists())
    if len(paths) - len(missing) < 2:
        raise WorkflowError(
            f"merge.allow_partial: {len(paths) - len(missing)} sample(s) have results, fewer than "
            "the two a merge needs; run without it first (with --keep-going)"
        )
    if missing:
        print(f"merge: leaving out samples without results: {', '.join(missing)}", file=sys.stderr)
    return {sample: path for sample, path in paths.items() if sample not in missing}


def merge_cell_types(wildcards):
    """The cell types of each merged sample (rule annotate's tables), none without annotate.model."""
    if not config["annotate"]["model"]:
        return []
    return [f"results/{sample}/cell_types.tsv" for sample in merge_inputs(wildcards)]


# The rule whose h5ad output is each modality's processed AnnData.
MODALITY_RULES = {"rna": "cluster", "protein": "protein", "atac": "atac"}


def multiome_inputs(wildcards):
    """Each modality's processed AnnData, keyed by modality."""
    return {
        name: for_sample(getattr(rules, MODALITY_RULES[name]).output.h5ad, wildcards.sample)
        for name in sample_modalities(wildcards.sample)
    }


def coexpression_file(key):
    """A sample's co-expression file by its key in omicsprep.io.COEXPRESSION_FILES (whose names
    the omicsprep coexpr command writes too)."""
    return f"results/{{sample}}/coexpression/{COEXPRESSION_FILES[key]}"


def config_sections(options_class):
    """The configuration sections an options class of omicsprep.options gathers, one per field."""
    return {option.name: config[option.name] for option in fields(options_class)}


def modality_clustering_params():
    """The sections the protein, atac and multiome rules embed and cluster with."""
    return config_sections(EmbeddingOptions)


def cluster_params():
    """The sections of the cluster rule's steps, normalization through markers."""
    return config_sections(ClusteringOptions)


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
