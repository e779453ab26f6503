"""config/README.md: generated from the config schema, current, and naming every key with its right default."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from conftest import REPO

from omicsprep import config_reference as reference

README = REPO / "config" / "README.md"
SCHEMA = yaml.safe_load((REPO / "config" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
REGENERATE = "run python -m omicsprep.config_reference > config/README.md"


def schema_keys(node: dict, path: str = "") -> dict[str, dict]:
    """Every key under ``node`` by dotted path, each with its schema (``#/definitions/`` references followed).

    Written apart from the module's walk, so that a key it skips or misnames shows here.
    """
    keys = {}
    for name, child in node.get("properties", {}).items():
        if "$ref" in child:
            definition = SCHEMA["definitions"][child["$ref"].removeprefix("#/definitions/")]
            child = {**definition, **{k: v for k, v in child.items() if k != "$ref"}}
        keys[f"{path}{name}"] = child
        keys.update(schema_keys(child, f"{path}{name}."))
    return keys


def shown_defaults(text: str) -> dict[str, Any]:
    """The default each table row of ``text`` shows for its key, read back as YAML (``None`` for none)."""
    defaults = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        key, default = (cell.strip("`").replace("\\|", "|") for cell in cells[:2])
        assert key not in defaults, f"{key} has two rows"
        defaults[key] = None if default == reference.NO_DEFAULT else yaml.safe_load(default)
    return defaults


def wrong_defaults(text: str) -> dict[str, tuple[Any, Any]]:
    """The keys of ``text`` whose shown default is not the schema's: key to (shown, schema's)."""
    keys = schema_keys(SCHEMA)
    shown = shown_defaults(text)
    return {
        key: (value, keys[key].get("default"))
        for key, value in shown.items()
        if value != keys[key].get("default") or type(value) is not type(keys[key].get("default"))
    }


def test_the_readme_is_what_the_schema_generates():
    assert README.read_text(encoding="utf-8") == reference.config_reference(SCHEMA), REGENERATE


def test_every_key_of_the_schema_has_a_row_and_every_row_a_key_of_the_schema():
    keys = schema_keys(SCHEMA)
    leaves = {key for key, node in keys.items() if "properties" not in node}
    assert {"seed", "qc.filter.min_genes", "qc.gene_groups", "backend_per_rule.merge"} <= leaves
    assert len(leaves) > 150
    shown = set(shown_defaults(README.read_text(encoding="utf-8")))
    assert leaves - shown == set(), REGENERATE
    assert shown - set(keys) == set()


def test_the_defaults_shown_are_the_schemas():
    defaults = shown_defaults(README.read_text(encoding="utf-8"))
    # Keys whose leaf name recurs elsewhere with another default: a default taken from the wrong section shows.
    assert defaults["seed"] == 0
    assert defaults["cells.seed"] == 0
    assert defaults["cells.ambient.decontx.seed"] == 12345
    assert defaults["pca.n_comps"] == 50
    assert defaults["protein.n_comps"] == 20
    assert defaults["atac.lsi.n_comps"] == 30
    assert defaults["hvg.flavor"] == "seurat_v3"
    assert defaults["coexpression.min_cells"] == 50
    assert defaults["coexpression.per_cluster.min_cells"] == 200
    assert defaults["neighbors.n_neighbors"] == 15
    assert defaults["multiome.wnn.n_neighbors"] == 20
    assert defaults["leiden.resolutions"] == [1.0]
    assert defaults["qc.filter.max_genes"] is None
    assert defaults["qc.gene_groups"]["hb"] == r"(?i)^hb[abdegmqz]\d?(-|$)"  # its | escaped in the table
    assert defaults["umi.skip_gene_regex"] == "^(__|Unassigned)"
    assert wrong_defaults(README.read_text(encoding="utf-8")) == {}


@pytest.mark.parametrize(
    ("key", "wrong"),
    [("cells.ambient.decontx.seed", "`0`"), ("coexpression.per_cluster.min_cells", "`50`"), ("seed", "`null`")],
)
def test_a_default_from_the_wrong_key_is_caught(key, wrong):
    row = next(line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith(f"| `{key}` |"))
    cells = row.split(" | ")
    broken = README.read_text(encoding="utf-8").replace(row, " | ".join([cells[0], wrong, *cells[2:]]))
    assert set(wrong_defaults(broken)) == {key}


def test_the_allowed_values_and_meaning_come_from_the_schema():
    rows = {
        line.split(" | ")[0].strip("| `"): line
        for line in README.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `")
    }
    assert "one of `seurat_v3`, `seurat`, `cell_ranger`" in rows["hvg.flavor"]
    assert "integer in [0, 4294967295]" in rows["seed"]  # through $ref
    assert "number in (0, 1]" in rows["cells.fdr"]
    assert "integer ≥ 0, or `null`" in rows["qc.filter.min_genes"]
    assert "list of number > 0; at least 1 item" in rows["leiden.resolutions"]
    assert "list of integer ≥ 0; 2 items" in rows["cells.ambient.soupx.soup_range"]
    assert "mapping of any key to string" in rows["qc.gene_groups"]
    assert "pct_counts_&lt;group> is computed for each" in rows["qc.gene_groups"]
    assert "Genes detected in fewer cells are dropped." in rows["qc.min_cells_per_gene"]


def test_values_are_written_as_yaml_reads_them():
    assert reference._value("seurat_v3") == "seurat_v3"
    assert reference._value("1.0") == '"1.0"'  # a string YAML would read as a number
    assert reference._value("yes") == '"yes"'
    assert reference._value("*alias") == '"*alias"'  # not YAML at all
    assert reference._value("") == '""'
    assert reference._value(None) == "null"
    assert reference._value({"a": [1, 2]}) == '{"a": [1, 2]}'
    assert reference._code("a|b") == r"`a\|b`"
    assert reference._code("`x`") == "`` `x` ``"


def test_the_command_prints_the_reference(capsys):
    reference.main()
    assert capsys.readouterr().out == README.read_text(encoding="utf-8")


SCHEMA_KEYWORDS = {
    "type", "default", "description", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "items", "properties", "additionalProperties", "minItems", "maxItems", "$ref", "required", "pattern", "uniqueItems",
}  # fmt: skip


def test_every_schema_node_holds_only_schema_keywords():
    """An unquoted comma in a one-line YAML mapping ends the description and makes a stray key of the rest."""
    stray = {
        path: set(node) - SCHEMA_KEYWORDS for path, node in schema_keys(SCHEMA).items() if set(node) - SCHEMA_KEYWORDS
    }
    assert stray == {}
