"""Warm processes that run the workflow's GPU jobs one after another (and its last jobs, the summaries).

A rule is a process, and a GPU rule's process spends 7-10 s importing RAPIDS and AnnData and
creating a CUDA context before its first step (H200 machine, ``benchmarks/gpu_check.sh
probe``): many times the work of a 10,000-cell sample, and, with 16 such samples run side by
side, more than the CPU backend takes for the whole study. So the workflow starts a pool on
a machine whose GPU it uses locally (``onstart`` in ``rules/common/pool.smk``): a server, which
imports the stages' code once and forks a few workers from itself, each of which creates its
CUDA context, compiles nothing twice, and runs job after job in its own process. A worker
takes jobs once its context is up and imports the GPU libraries while it waits for them (a
job that needs one sooner imports it).

A GPU job's script hands itself to the pool (:func:`omicsprep.jobs.run_script` calls
:func:`hand_over` first): a worker takes the job's working folder, environment, arguments,
umask and standard streams, runs the script, gives them back, and tells the server the exit
status, which the job's own process exits with; then it collects what the job left (log
handlers, cycles, device memory) and takes the next. A worker whose job failed or was
cancelled exits rather than run another (the server starts a new one), so a job runs in a
process that only ever finished other jobs cleanly. A job's own process that ends (Snakemake
cancelled it) stops its worker as it would have stopped itself (SIGTERM).

The pool serves this user, this interpreter and this package's code: a job started with
other code, other packages, other import-time settings or other CPUs (a scheduler's job)
runs in its own process, as it does without a pool. It outlives a run, so that the next run
(a changed resolution, another sample) finds it warm, and stops after ``idle_seconds``
without a job. On a cluster (a non-local executor) the workflow starts none: each job pays
its start once.

Snakemake's ``benchmark:`` file of a pooled job measures the job's own process, which waits;
the rule's log (its ``phases`` line) and ``results/run_times.tsv`` hold the worker's seconds
of CPU and its peak memory during the job.

The package: :mod:`~omicsprep.pool.protocol` (where the pool is, what its workers' imports
depend on, the messages), :mod:`~omicsprep.pool.client` (a job's and the workflow's side),
:mod:`~omicsprep.pool.server` and :mod:`~omicsprep.pool.worker`.
"""

from omicsprep.pool.client import IDLE_SECONDS, hand_over, start, status, stop
from omicsprep.pool.protocol import POOL, difference, fingerprint, socket_path
from omicsprep.pool.worker import in_worker, job_started_at, job_usage

__all__ = [
    "IDLE_SECONDS",
    "POOL",
    "difference",
    "fingerprint",
    "hand_over",
    "in_worker",
    "job_started_at",
    "job_usage",
    "socket_path",
    "start",
    "status",
    "stop",
]
