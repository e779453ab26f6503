# The pool of warm GPU processes, started for a local run with a GPU, and the run's end.

import os
import threading

from snakemake.settings.types import DeploymentMethod

from omicsprep import pool, resources


def cancel_rescheduling_timers():
    """Cancel Snakemake's pending scheduler timers, once every job has ended.

    While jobs run, Snakemake's scheduler wakes itself every second on a threading.Timer
    (the --max-jobs-per-timespan check), and its process waits for the last one before it
    exits: up to a second of every run.
    """
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.cancel()


def start_gpu_pool():
    """Start (or find) the pool of warm GPU processes for this run's GPU jobs, on a local run with a GPU.

    Its socket goes into the environment the jobs inherit (omicsprep.pool.POOL); a job on the
    CPU backend, on a cluster, or of another environment runs in its own process, and jobs in
    containers (--sdm apptainer) have their image's environment: no pool then. A pool named in
    the environment already is used instead (OMICSPREP_POOL=off: none).
    """
    gpu_rules = CONFIG_SCHEMA_DATA["properties"]["backend_per_rule"]["properties"]
    on_gpu = GPU_EXPECTED and any(backend_for(rule) != "cpu" for rule in gpu_rules)
    in_containers = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
    if not jobs_run_here() or not on_gpu or in_containers or os.environ.get(pool.POOL):
        return
    path = pool.start(n_workers=resources.pool_workers(workflow.cores))
    if path is not None:
        os.environ[pool.POOL] = str(path)


onstart:
    start_gpu_pool()


onsuccess:
    cancel_rescheduling_timers()


onerror:
    cancel_rescheduling_timers()
