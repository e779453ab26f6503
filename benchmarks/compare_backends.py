"""Compare two workflow runs (e.g. backend cpu and gpu) sample by sample.

    python -m benchmarks compare_backends RESULTS_A RESULTS_B

Prints, per sample: cells in each, cells in common, HVG overlap, and the adjusted Rand
index of every cluster column (Leiden/Louvain at each resolution) on the common cells;
then, for the protein, atac and multiome outputs, the ARI of their clusters (the
joint WNN clusters for multiome.h5mu) and the correlation of the modality weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from sklearn.metrics import adjusted_rand_score

from omicsprep.io import read_h5ad_elements
from omicsprep.options import parse_cluster_key


def compare_sample(run_a: Path, run_b: Path, sample: str) -> list[dict]:
    obs = [pd.read_parquet(run / sample / "obs.parquet") for run in (run_a, run_b)]
    var = [read_h5ad_elements(run / sample / "processed.h5ad", ["var"])["var"] for run in (run_a, run_b)]
    common = obs[0].index.intersection(obs[1].index)
    hvg = [set(v.index[v["highly_variable"]]) for v in var]
    base = {
        "sample": sample,
        "cells_a": len(obs[0]),
        "cells_b": len(obs[1]),
        "cells_common": len(common),
        "hvg_overlap": round(len(hvg[0] & hvg[1]) / max(len(hvg[0]), 1), 4),
    }
    keys = [c for c in obs[0].columns if parse_cluster_key(c) and c in obs[1]]
    return [
        {
            **base,
            "clustering": key,
            "clusters_a": obs[0][key].nunique(),
            "clusters_b": obs[1][key].nunique(),
            "ari": round(adjusted_rand_score(obs[0].loc[common, key], obs[1].loc[common, key]), 4),
        }
        for key in keys
    ]


MODALITY_FILES = ("protein.h5ad", "atac.h5ad", "multiome.h5mu")


def _modality_obs(path: Path) -> pd.DataFrame:
    if path.suffix == ".h5mu":
        import mudata

        return mudata.read_h5mu(path, backed=True).obs
    return read_h5ad_elements(path, ["obs"])["obs"]


def compare_modalities(run_a: Path, run_b: Path, sample: str) -> list[dict]:
    rows = []
    for name in MODALITY_FILES:
        if not (run_a / sample / name).exists() or not (run_b / sample / name).exists():
            continue
        obs = [_modality_obs(run / sample / name) for run in (run_a, run_b)]
        common = obs[0].index.intersection(obs[1].index)
        clusterings = [c for c in obs[0] if parse_cluster_key(c.removeprefix("wnn_")) and c in obs[1]]
        weights = [c for c in obs[0] if c.endswith(":mod_weight") and c in obs[1]]
        measures = [(key, "ARI", adjusted_rand_score) for key in clusterings]
        measures += [(key, "Pearson r", pd.Series.corr) for key in weights]
        rows.extend(
            {
                "sample": sample,
                "output": name,
                "column": key,
                "cells_common": len(common),
                "value": round(measure(obs[0].loc[common, key], obs[1].loc[common, key]), 4),
                "measure": label,
            }
            for key, label, measure in measures
        )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_a", type=Path)
    parser.add_argument("results_b", type=Path)


def run(args: argparse.Namespace) -> None:
    samples = sorted(p.parent.name for p in args.results_a.glob("*/obs.parquet"))
    rows = [row for sample in samples for row in compare_sample(args.results_a, args.results_b, sample)]
    print(pd.DataFrame(rows).to_csv(sep="\t", index=False), end="")
    samples = sorted(p.name for p in args.results_a.iterdir() if p.is_dir())
    modalities = [row for sample in samples for row in compare_modalities(args.results_a, args.results_b, sample)]
    if modalities:
        print(pd.DataFrame(modalities).to_csv(sep="\t", index=False), end="")
