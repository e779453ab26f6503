"""Run-time tables: Snakemake benchmark files and the per-step timings of each rule."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd


def run_time_table(
    benchmarks: Mapping[tuple[str, str], pd.DataFrame], provenance: Mapping[tuple[str, str], Mapping]
) -> pd.DataFrame:
    """One row per (sample, rule, step): seconds, and peak memory for whole rules.

    Parameters
    ----------
    benchmarks
        ``(sample, rule)`` to the rule's ``benchmark:`` table (Snakemake's columns).
    provenance
        ``(sample, rule)`` to its ``uns["omicsprep"][rule]`` record (backend, timings).

    Returns
    -------
    Columns ``sample``, ``rule``, ``backend``, ``step``, ``seconds``, ``max_rss_mb``; the
    row with step ``total`` is the whole process as Snakemake measured it.
    """
    rows = []
    for (sample, rule), bench in benchmarks.items():
        record = provenance.get((sample, rule), {})
        backend = record.get("backend", "")
        rows.append(
            {
                "sample": sample,
                "rule": rule,
                "backend": backend,
                "step": "total",
                "seconds": float(bench["s"].iloc[-1]),
                "max_rss_mb": float(bench["max_rss"].iloc[-1]),
            }
        )
        for step, seconds in record.get("timings", {}).items():
            rows.append(
                {
                    "sample": sample,
                    "rule": rule,
                    "backend": backend,
                    "step": step,
                    "seconds": float(seconds),
                    "max_rss_mb": float("nan"),
                }
            )
    return pd.DataFrame(rows, columns=["sample", "rule", "backend", "step", "seconds", "max_rss_mb"])
