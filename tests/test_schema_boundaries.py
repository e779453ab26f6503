"""Every setting of the RNA path that the schema accepts works, or stops with omicsprep's own one-line error.

Hypothesis draws whole sections from the schema itself (each setting at its bounds, its
default, far beyond the data, or anywhere in between; nulls and every enum value) and runs
QC, or the clustering chain, on 300 real PBMCs. A library's traceback fails the test.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import NO_DOUBLETS, PBMC_H5, QC_OPTIONS, SCHEMA
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from omicsprep import io
from omicsprep.configuration import fill_defaults
from omicsprep.errors import TooFewCellsError
from omicsprep.options import ClusteringOptions, DoubletOptions, QcOptions, cluster_key, from_config, from_sections
from omicsprep.rna.pipeline import run_clustering, run_qc

SCHEMA_TEXT = yaml.safe_load(SCHEMA.read_text())
BEYOND = 10_000  # far beyond these data's 300 cells and 507 genes


def resolved(node: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its ``$ref`` (into ``definitions``) merged in."""
    if "$ref" not in node:
        return node
    target = SCHEMA_TEXT["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return {**target, **{key: value for key, value in node.items() if key != "$ref"}}


def numbers(node: dict[str, Any], *, integer: bool) -> st.SearchStrategy:
    """Values at the node's bounds, its default, far beyond, and anywhere between."""
    low = node.get("minimum", node.get("exclusiveMinimum", 0))
    if "exclusiveMinimum" in node:
        low = low + (1 if integer else 1e-6)
    high = node.get("maximum", low + BEYOND)
    edges = [low, high, node.get("default", low)]
    anywhere = st.integers(low, high) if integer else st.floats(low, high, allow_nan=False)
    return st.one_of(st.sampled_from([edge for edge in edges if edge is not None]), anywhere)


def values(node: dict[str, Any]) -> st.SearchStrategy:
    """Values the schema accepts for ``node``."""
    node = resolved(node)
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "properties" in node:
        return st.fixed_dictionaries({name: values(child) for name, child in node["properties"].items()})
    options = [st.none()] if "null" in kinds else []
    if "boolean" in kinds:
        options.append(st.booleans())
    if "integer" in kinds:
        options.append(numbers(node, integer=True))
    elif "number" in kinds:
        options.append(numbers(node, integer=False))
    if "array" in kinds:
        options.append(st.lists(values(node["items"]), min_size=node.get("minItems", 0), max_size=3, unique=True))
    if "object" in kinds:  # free-form mappings (gene groups): their defaults
        options.append(st.just(copy.deepcopy(node["default"])))
    return st.one_of(options)


def section_configs(sections: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """Configurations of ``sections`` that the schema and the workflow's config check accept."""

    @st.composite
    def configs(draw: st.DrawFn) -> dict[str, Any]:
        properties = SCHEMA_TEXT["properties"]
        config = {section: draw(values(properties[section])) for section in sections}
        if "markers" in config:
            markers = config["markers"]
            resolutions = config[markers["algorithm"]]["resolutions"]
            assume(resolutions)  # the config check asks the markers' resolution to be among them
            markers["resolution"] = draw(st.sampled_from(resolutions))
            assume(config["neighbors"]["n_pcs"] <= config["pca"]["n_comps"])  # refused by the config check
        fill_defaults(config, SCHEMA_TEXT)  # and valid: a strategy beyond the schema would fail here
        return config

    return configs()


WALK = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def pbmc_300():
    """300 real PBMCs (507 genes of chr21): few genes per cell, as QC's hardest case."""
    return io.read_counts(PBMC_H5)[:300].copy()


@pytest.fixture(scope="module")
def pbmc_300_qc(pbmc_300):
    kept, _ = run_qc(pbmc_300.copy(), options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
    return kept


def test_the_strategies_reach_each_settings_bounds():
    """The walk draws each numeric bound of the schema (so a narrowed strategy shows here)."""
    node = {"type": "integer", "minimum": 2, "default": 15}
    drawn = {numbers(node, integer=True).example() for _ in range(200)}
    assert {2, 2 + BEYOND, 15} <= drawn


@WALK
@given(config=section_configs(("qc", "doublets")))
def test_accepted_qc_settings_keep_enough_cells_or_say_which_filter_removed_them(pbmc_300, config):
    qc_options = from_config(QcOptions, config["qc"])
    doublet_options = from_config(DoubletOptions, config["doublets"])
    problem = ""
    try:
        kept, metrics = run_qc(
            pbmc_300.copy(), options=qc_options, doublet_options=doublet_options, seed=0, backend="cpu"
        )
    except TooFewCellsError as exc:  # omicsprep's own diagnosis
        problem = str(exc)
    if problem:  # one line naming each filter, or that none removed a cell
        assert "\n" not in problem
        assert re.search(r"removed \d|none removed", problem), problem
        return
    assert kept.n_obs >= config["qc"]["min_cells_left"]
    assert metrics["passed"].sum() == kept.n_obs


@WALK
@given(config=section_configs(("normalize", "hvg", "pca", "neighbors", "umap", "leiden", "louvain", "markers")))
def test_accepted_clustering_settings_run_through_every_step(pbmc_300_qc, config):
    adata = pbmc_300_qc.copy()
    markers = run_clustering(adata, options=from_sections(ClusteringOptions, config), seed=0, backend="cpu")
    assert np.isfinite(adata.obsm["X_umap"]).all()
    for algorithm in ("leiden", "louvain"):
        for resolution in config[algorithm]["resolutions"]:
            assert adata.obs[cluster_key(algorithm, resolution)].notna().all()
    assert set(markers["group"]) <= set(
        adata.obs[cluster_key(config["markers"]["algorithm"], config["markers"]["resolution"])]
    )
