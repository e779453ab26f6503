"""Rule run_times: one table of every rule's benchmark and per-step timings."""

from omicsprep.jobs import run_rule

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    from omicsprep import io
    from omicsprep.jobs import read_phases
    from omicsprep.timings import run_time_table

    keys = list(zip(snakemake.params.samples, snakemake.params.rules, strict=True))
    benchmarks = {key: io.read_table(path) for key, path in zip(keys, snakemake.input.benchmarks, strict=True)}
    provenance = {
        (sample, rule): io.read_provenance(path, rule=rule)
        for (sample, rule), path in zip(keys, snakemake.input.provenance, strict=True)
    }
    phases = {key: read_phases(path) or {} for key, path in zip(keys, snakemake.params.logs, strict=True)}
    io.write_table(run_time_table(benchmarks, provenance, phases), snakemake.output.table)


# In a free worker of the GPU pool where there is one, as rule summary: the run's last job, whose imports
# are its whole time.
run_rule(main, snakemake, pooled=True, wait_for_worker=False)
