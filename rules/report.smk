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
    params:
        samples=timed_samples(),
        rules=timed_rules(),
        logs=timed_logs(),
    script:
        "../scripts/run_times.py"
