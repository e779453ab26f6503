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
    localrule: True
    params:
        samples=timed_samples(),
        rules=timed_rules(),
        provenance_rules=provenance_rules(),
    run:
        write_run_times(
            benchmarks=list(input.benchmarks),
            provenance=list(input.provenance),
            samples=params.samples,
            rules=params.rules,
            provenance_rules=params.provenance_rules,
            table=output.table,
        )
