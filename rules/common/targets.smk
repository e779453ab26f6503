# The run's targets: the timed rules the report tabulates, and rule all's outputs.


# Rules whose run times the report tabulates, with the key of the output holding each one's
# provenance (backend, step timings): an AnnData, or a JSON record.
TIMED_RULES = {
    "call_cells": "h5ad",
    "qc": "h5ad",
    "cluster": "h5ad",
    "coexpression": "provenance",
    "protein": "h5ad",
    "atac": "h5ad",
    "multiome": "h5mu",
    "merge": "h5ad",
}


def rules_of(sample):
    """The timed rules that run for a sample."""
    runs = {
        "call_cells": sample in RNA_SAMPLES and has_droplets(sample),
        "qc": sample in RNA_SAMPLES,
        "cluster": sample in RNA_SAMPLES,
        "coexpression": sample in RNA_SAMPLES and config["coexpression"]["enabled"],
        "protein": sample in PROTEIN_SAMPLES,
        "atac": sample in ATAC_SAMPLES,
        "multiome": sample in MULTIOME_SAMPLES,
        "merge": False,  # not per sample: timed_pairs adds it
    }
    return [rule for rule in TIMED_RULES if runs[rule]]


def timed_pairs():
    merged = [("merged", "merge")] if config["merge"]["enabled"] else []
    return [(sample, rule) for sample in SAMPLES for rule in rules_of(sample)] + merged


def timed_samples():
    return [sample for sample, _ in timed_pairs()]


def timed_rules():
    return [rule for _, rule in timed_pairs()]


# timed_benchmarks, timed_logs and timed_provenance read the rules' paths, so they are called where
# run_times is defined, after the timed rules (rules/report.smk is included last).
def timed_benchmarks():
    return [for_sample(getattr(rules, rule).benchmark, sample) for sample, rule in timed_pairs()]


def timed_logs():
    """The timed jobs' logs: a job run by a worker of the GPU pool records the worker's peak memory there."""
    return [for_sample(getattr(rules, rule).log[0], sample) for sample, rule in timed_pairs()]


def timed_provenance():
    return [
        for_sample(getattr(getattr(rules, rule).output, TIMED_RULES[rule]), sample) for sample, rule in timed_pairs()
    ]


def final_outputs():
    """The targets of rule all, from the rules' outputs (so read after every rule is defined)."""
    per_sample = [
        *rules.cluster.output,
        *rules.qc.output,
        *(rules.coexpression.output if config["coexpression"]["enabled"] else []),
    ]
    return [
        *expand(per_sample, sample=RNA_SAMPLES),
        *expand(rules.protein.output.h5ad, sample=PROTEIN_SAMPLES),
        *expand(rules.atac.output.h5ad, sample=ATAC_SAMPLES),
        *expand(list(rules.multiome.output), sample=MULTIOME_SAMPLES),
        *(rules.merge.output if config["merge"]["enabled"] else []),
        *expand(list(rules.annotate.output), sample=annotated_samples()),
        rules.run_times.output.table,
        *([rules.summary.output.table, rules.summary.output.multiqc] if RNA_SAMPLES else []),
    ]
