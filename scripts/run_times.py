"""Rule run_times: one table of every rule's benchmark and per-step timings."""

import omicsprep.handoff  # noqa: F401 - first: a warm worker runs this script, if started (omicsprep workers)

# isort: split
from omicsprep import io
from omicsprep.timings import merged_provenance, run_time_table
from omicsprep.workflow import run_script

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    keys = list(zip(snakemake.params.samples, snakemake.params.rules, strict=True))
    benchmarks = {key: io.read_table(path) for key, path in zip(keys, snakemake.input.benchmarks, strict=True)}
    provenance = {
        key: merged_provenance([io.read_provenance(path, rule=rule) for rule in rules])
        for key, path, rules in zip(keys, snakemake.input.provenance, snakemake.params.provenance_rules, strict=True)
    }
    io.write_table(run_time_table(benchmarks, provenance), snakemake.output.table)


run_script(main, log_path=snakemake.log[0])
