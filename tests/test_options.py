"""Stage options: built from configuration sections, with the config schema's defaults."""

from __future__ import annotations

import dataclasses
import inspect
from typing import get_type_hints

import pytest
import yaml
from conftest import REPO

from omicsprep import options
from omicsprep.options import (
    AlignOptions,
    AtacOptions,
    BamOptions,
    CellOptions,
    ClusteringOptions,
    CoexpressionOptions,
    DoubletOptions,
    EmbeddingOptions,
    LeidenOptions,
    MarkersOptions,
    MergeOptions,
    MultiomeOptions,
    ProteinOptions,
    QcOptions,
    UmiOptions,
    from_config,
)

SCHEMA = yaml.safe_load((REPO / "config" / "schemas" / "config.schema.yaml").read_text())
# Each options class and its configuration section; None: its fields are top-level sections.
SECTIONS = {
    QcOptions: "qc",
    DoubletOptions: "doublets",
    ClusteringOptions: None,
    EmbeddingOptions: None,
    CoexpressionOptions: "coexpression",
    ProteinOptions: "protein",
    AtacOptions: "atac",
    MultiomeOptions: "multiome",
    MergeOptions: "merge",
    UmiOptions: "umi",
    CellOptions: "cells",
    AlignOptions: "align",
}


def schema_defaults(node: dict) -> dict:
    """The defaults the schema fills into an object: its properties', nested objects' likewise."""
    return {
        key: schema_defaults(spec) if "properties" in spec else spec["default"]
        for key, spec in node["properties"].items()
    }


def nested_classes(options_class: type) -> list[type]:
    """The options class and, recursively, the classes of its nested options."""
    types = get_type_hints(options_class)
    found = [options_class]
    for field in dataclasses.fields(options_class):
        if dataclasses.is_dataclass(types[field.name]):
            found += nested_classes(types[field.name])
    return found


def field_paths(value: object, prefix: str = "") -> set[str]:
    """Dotted paths of a dataclass's fields, nested ones included."""
    if not dataclasses.is_dataclass(value):
        return set()
    paths = set()
    for field in dataclasses.fields(value):
        paths |= {prefix + field.name} | field_paths(getattr(value, field.name), f"{prefix}{field.name}.")
    return paths


def dict_paths(value: object, prefix: str = "") -> set[str]:
    if not isinstance(value, dict):
        return set()
    return {path for key, item in value.items() for path in {prefix + key} | dict_paths(item, f"{prefix}{key}.")}


@pytest.mark.parametrize("options_class", list(SECTIONS), ids=lambda c: c.__name__)
def test_defaults_are_the_config_schemas(options_class):
    section = SECTIONS[options_class]
    if section is None:
        defaults = {
            field.name: schema_defaults(SCHEMA["properties"][field.name]) for field in dataclasses.fields(options_class)
        }
    else:
        defaults = schema_defaults(SCHEMA["properties"][section])
    # The same keys, nested alike (gene_groups, a free mapping, is compared as a value).
    schema_paths = {path for path in dict_paths(defaults) if not path.startswith("gene_groups.")}
    assert field_paths(options_class()) == schema_paths
    assert from_config(options_class, defaults) == options_class()


def test_every_options_class_is_checked_against_the_schema():
    covered = {nested for options_class in SECTIONS for nested in nested_classes(options_class)}
    defined = {
        value
        for value in vars(options).values()
        if inspect.isclass(value)
        and dataclasses.is_dataclass(value)
        and value.__module__.startswith(f"{options.__name__}.")
    }
    assert defined <= covered


def test_nested_sections_become_nested_options_and_lists_tuples():
    built = from_config(
        ClusteringOptions,
        {"leiden": {"resolutions": [0.5, 1]}, "markers": {"resolution": 0.5, "n_genes": 10}},
    )
    assert built.leiden == LeidenOptions(resolutions=(0.5, 1))
    assert built.markers == MarkersOptions(resolution=0.5, n_genes=10)
    assert built.pca == ClusteringOptions().pca  # absent: the default
    umi = from_config(UmiOptions, {"method": "unique", "bam": {"gene_tag": "XF"}})
    assert umi.bam == BamOptions(gene_tag="XF")
    assert umi.method == "unique"


def test_provenance_of_built_options_is_the_section():
    """Options built from a whole section give it back (provenance records them as they came)."""
    section = schema_defaults(SCHEMA["properties"]["coexpression"])
    assert dataclasses.asdict(from_config(CoexpressionOptions, section)) == section


@pytest.mark.parametrize(
    ("section", "unknown"),
    [({"n_genes": 10, "top_n": 5}, "top_n"), ({"metacells": {"methods": "knn"}}, "methods")],
)
def test_unknown_keys_are_refused(section, unknown):
    with pytest.raises(ValueError, match=f"unknown keys \\['{unknown}'\\]"):
        from_config(CoexpressionOptions, section)


def test_the_configuration_gets_the_schemas_defaults_as_snakemake_fills_them():
    # omicsprep.configuration fills them as snakemake.utils.validate(set_default=True) does,
    # on the shipped config and on a partial one (defaults of nested sections too).
    import copy

    from snakemake.utils import validate

    from omicsprep.configuration import fill_defaults, read_yaml

    schema_path = REPO / "config" / "schemas" / "config.schema.yaml"
    for config in (yaml.safe_load((REPO / "config" / "config.yaml").read_text()), {"samples": "s.tsv", "qc": {}}):
        ours, snakemakes = copy.deepcopy(config), copy.deepcopy(config)
        fill_defaults(ours, read_yaml(schema_path.read_text()))
        validate(snakemakes, schema=str(schema_path), set_default=True)
        assert ours == snakemakes
