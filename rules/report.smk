rule run_times:
    input:
        benchmarks=timed_benchmarks(),
        provenance=timed_provenance(),
    output:
        table=report(
            "results/run_times.tsv",
            category="Run times",
            caption="../report/run_times.rst",
        ),
    log:
        "logs/run_times/all.log",
    conda:
        "../envs/cpu.yaml"
    container:
        config["containers"]["cpu"]
    params:
        samples=timed_samples(),
        rules=timed_rules(),
        logs=timed_logs(),
    script:
        "../scripts/run_times.py"


# The study's summary: one row per sample (results/summary.tsv), shown on the report's first
# page (report/workflow.rst), and MultiQC's report of it (results/multiqc/) with STAR's logs and
# STARsolo's statistics of the samples given as FASTQ. One job, which waits for the samples'
# clustering only: MultiQC's 2-4 s run beside the rules that follow it, not after the last.
rule summary:
    input:
        metrics=expand(rules.qc.output.metrics, sample=RNA_SAMPLES),
        obs=expand(rules.cluster.output.obs, sample=RNA_SAMPLES),
        barcodes=expand(rules.call_cells.output.barcodes, sample=called_samples()),
        star_logs=expand(rules.align.output.log_final, sample=fastq_samples()),
        starsolo=expand(rules.align.output.summary, sample=fastq_samples()),
    output:
        table=report(
            "results/summary.tsv",
            category="Summary",
            caption="../report/summary.rst",
        ),
        multiqc="results/multiqc/multiqc_report.html",
        multiqc_data=directory("results/multiqc/multiqc_data"),
    log:
        "logs/summary/all.log",
    conda:
        "../envs/cpu.yaml"
    container:
        config["containers"]["cpu"]
    params:
        samples=RNA_SAMPLES,
        called=called_samples(),
        fastq_samples=fastq_samples(),
        clusters=markers_cluster_key(),
    script:
        "../scripts/summary.py"
