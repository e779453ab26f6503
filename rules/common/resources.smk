# Where and with what each rule's jobs run: backend, GPUs, threads, memory, disk, software.

import os
from pathlib import Path

from omicsprep import resources


def backend_for(rule_name):
    """The configured backend, per-rule override first, else the global one."""
    return config["backend_per_rule"].get(rule_name, config["backend"])


def jobs_run_here():
    """Whether this run's jobs run on this machine, not through a cluster executor.

    A dry run of a cluster executor executes as a local one: Snakemake then forces
    threads for its jobs, which a local run on Linux does not use.
    """
    settings = workflow.execution_settings  # none where nothing runs (--report)
    return workflow.local_exec and not (settings is not None and settings.use_threads)


def gpus_for(rule_name):
    """The GPUs a job asks for: none pinned to the CPU; one on a cluster; locally one only for
    large inputs, smaller jobs sharing the GPU (omicsprep.resources.gpus)."""
    backend = backend_for(rule_name)

    def gpu(wildcards, input):
        local = jobs_run_here()
        sized = local and backend != "cpu"  # the inputs' sizes are read only where they decide
        return resources.gpus(backend=backend, inputs_mb=resources.paths_mb(input) if sized else 0.0, local=local)

    return gpu


GPU_EXPECTED = resources.gpu_expected()

# The SLURM executor picks each job's partition from this file (profiles/slurm/partitions.yaml:
# with GPUs for a job asking for one), whatever the working directory; read only by that executor.
os.environ.setdefault(
    "SNAKEMAKE_SLURM_PARTITIONS", str(Path(workflow.basedir) / "profiles" / "slurm" / "partitions.yaml")
)


def threads_for(rule_name):
    """The rule's threads: one where its jobs run on the GPU, its CPU threads otherwise (a profile may set them)."""
    return resources.threads(rule_name, backend=backend_for(rule_name), on_gpu=GPU_EXPECTED)


def memory_for(rule_name):
    """The rule's ``mem_mb``: from its inputs' size, more at each retry (omicsprep.resources)."""

    def mem_mb(wildcards, input, attempt):
        inputs_mb = resources.paths_mb(input)
        return resources.memory_mb(rule_name, inputs_mb=inputs_mb, attempt=attempt, backend=backend_for(rule_name))

    return mem_mb


def disk_for(rule_name):
    """The rule's ``disk_mb``: its outputs' expected size, from its inputs' (omicsprep.resources)."""

    def disk_mb(wildcards, input):
        return resources.disk_mb(rule_name, inputs_mb=resources.paths_mb(input))

    return disk_mb


def software_for(rule_name):
    """The software a rule's jobs run with, "gpu" (RAPIDS) where the rule may use the GPU, else "cpu"."""
    return "cpu" if backend_for(rule_name) == "cpu" else "gpu"


def conda_env_for(rule_name):
    """The rule's conda environment (--sdm conda), that of ``software_for``."""
    return {"cpu": "../envs/cpu.yaml", "gpu": "../envs/rapids.yaml"}[software_for(rule_name)]


def container_for(rule_name):
    """The rule's image (--sdm apptainer), config containers' of ``software_for``."""
    return config["containers"][software_for(rule_name)]
