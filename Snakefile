# omicsprep: single-cell preprocessing on GPUs (RAPIDS) and CPUs (scanpy).
# Table of contents: configuration, the stages in order, and the final targets.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/align.smk"
include: "rules/umi.smk"
include: "rules/cells.smk"
include: "rules/qc.smk"
include: "rules/cluster.smk"
include: "rules/coexpression.smk"
include: "rules/protein.smk"
include: "rules/atac.smk"
include: "rules/multiome.smk"
include: "rules/merge.smk"
include: "rules/annotate.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
