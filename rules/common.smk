# Helpers of every stage: the checked configuration and sample sheet (omicsprep.configuration,
# omicsprep.sheet) here; resources, input functions, targets and the GPU pool in rules/common/.

from pathlib import Path

from snakemake.exceptions import WorkflowError

from omicsprep.configuration import check_settings_together, checked_config, read_yaml
from omicsprep.errors import InputError
from omicsprep.sheet import load_sample_sheet

CONFIG_SCHEMA = Path(workflow.basedir) / "config" / "schemas" / "config.schema.yaml"
SAMPLES_SCHEMA = Path(workflow.basedir) / "config" / "schemas" / "samples.schema.yaml"
CONFIG_SCHEMA_DATA = read_yaml(CONFIG_SCHEMA.read_text())


try:
    checked_config(config, CONFIG_SCHEMA_DATA)
    SAMPLE_SHEET = load_sample_sheet(config["samples"], schema=read_yaml(SAMPLES_SCHEMA.read_text()))
except InputError as exc:  # one line, as Snakemake shows its own errors
    raise WorkflowError(str(exc)) from None

SAMPLES = list(SAMPLE_SHEET.index)


def sample_modalities(sample):
    """The sample's modalities among rna, protein and atac."""
    row = SAMPLE_SHEET.loc[sample]
    present = {"rna": row["input"] or row["raw"] or row["fastq_1"], "protein": row["adt"], "atac": row["fragments"]}
    return [name for name, path in present.items() if path]


RNA_SAMPLES = [s for s in SAMPLES if "rna" in sample_modalities(s)]
PROTEIN_SAMPLES = [s for s in SAMPLES if "protein" in sample_modalities(s)]
ATAC_SAMPLES = [s for s in SAMPLES if "atac" in sample_modalities(s)]
MULTIOME_SAMPLES = [s for s in SAMPLES if len(sample_modalities(s)) > 1]
QC_METRIC_COLUMNS = ["total_counts", "n_genes_by_counts", "pct_counts_mt", "doublet_score"]


try:
    check_settings_together(config, rna_samples=RNA_SAMPLES)
except InputError as exc:
    raise WorkflowError(str(exc)) from None


include: "common/resources.smk"
include: "common/inputs.smk"
include: "common/targets.smk"
include: "common/pool.smk"
