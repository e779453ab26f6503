"""The peer: what a user would write with scanpy alone, with the workflow's steps and settings.

    python benchmarks/peer_scanpy.py COUNTS.h5 CONFIG.yaml OUT_DIR

Writes OUT_DIR/obs.parquet, OUT_DIR/var.parquet and OUT_DIR/timings.json (seconds per step,
whole run, peak resident memory). Uses scanpy only (no omicsprep), so it measures what the
workflow's structure (rules, files between rules) costs on top.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scanpy as sc
import yaml

counts_path, config_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
config = yaml.safe_load(config_path.read_text())
qc, seed = config["qc"], config["seed"]
timings: dict[str, float] = {}
start = last = time.perf_counter()


def lap(step: str) -> None:
    global last
    now = time.perf_counter()
    timings[step] = round(now - last, 4)
    last = now


adata = sc.read_10x_h5(counts_path)
adata.var_names_make_unique()
lap("read")
for group, pattern in qc["gene_groups"].items():
    adata.var[group] = adata.var_names.str.match(pattern)
sc.pp.calculate_qc_metrics(adata, qc_vars=list(qc["gene_groups"]), percent_top=None, log1p=True, inplace=True)
keep = (adata.obs["n_genes_by_counts"] >= qc["filter"]["min_genes"]) & (
    adata.obs["pct_counts_mt"] <= qc["filter"]["max_pct_mt"]
)
adata = adata[keep.to_numpy()].copy()
sc.pp.filter_genes(adata, min_cells=qc["min_cells_per_gene"])
lap("qc")
# As the workflow does: a sample larger than max_cells_per_run is scored in random equal groups.
n_groups = -(-adata.n_obs // config["doublets"].get("max_cells_per_run", 20_000))
if n_groups > 1:
    groups = np.random.default_rng(seed).permutation(adata.n_obs) % n_groups
    adata.obs["doublet_group"] = pd.Categorical(groups.astype(str))
sc.pp.scrublet(
    adata,
    expected_doublet_rate=config["doublets"]["expected_rate"],
    n_prin_comps=30,
    use_approx_neighbors=False,
    random_state=seed,
    batch_key="doublet_group" if n_groups > 1 else None,
)
adata = adata[~adata.obs["predicted_doublet"].to_numpy()].copy()
lap("doublets")
adata.layers["counts"] = adata.X.copy()
sc.pp.normalize_total(adata, target_sum=config["normalize"]["target_sum"])
sc.pp.log1p(adata)
sc.pp.highly_variable_genes(adata, flavor="seurat_v3", n_top_genes=config["hvg"]["n_top_genes"], layer="counts")
sc.pp.pca(adata, n_comps=config["pca"]["n_comps"], mask_var="highly_variable", svd_solver="arpack", random_state=seed)
lap("normalize_hvg_pca")
sc.pp.neighbors(
    adata, n_neighbors=config["neighbors"]["n_neighbors"], n_pcs=config["neighbors"]["n_pcs"], transformer="sklearn"
)
lap("neighbors")
for resolution in config["leiden"]["resolutions"]:
    key = f"leiden_{float(resolution)}"
    sc.tl.leiden(
        adata, resolution=resolution, flavor="igraph", n_iterations=-1, directed=False, random_state=seed, key_added=key
    )
lap("leiden")
sc.tl.umap(adata, min_dist=config["umap"]["min_dist"], random_state=seed)
lap("umap")
groupby = f"{config['markers']['algorithm']}_{float(config['markers']['resolution'])}"
sc.tl.rank_genes_groups(adata, groupby, method=config["markers"]["method"], use_raw=False, pts=True)
lap("markers")
out.mkdir(parents=True, exist_ok=True)
adata.write_h5ad(out / "peer.h5ad")
lap("write")
adata.obs.to_parquet(out / "obs.parquet")
adata.var[["highly_variable"]].to_parquet(out / "var.parquet")
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
(out / "timings.json").write_text(
    json.dumps({"steps": timings, "seconds": round(time.perf_counter() - start, 3), "max_rss_mb": round(peak_mb, 1)})
)
