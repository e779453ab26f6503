"""The workflow's configuration: YAML read by libyaml, checked against its JSON schema with defaults filled in.

The workflow (``rules/common.smk``) and ``omicsprep warm-kernels`` read it alike; the workflow
also checks the settings that only fail together (:func:`check_settings_together`).
"""

from __future__ import annotations

from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

from omicsprep.errors import InputError
from omicsprep.options import MergeOptions, from_config


def read_yaml(text: str) -> Any:
    """YAML text as Python values, by libyaml where PyYAML has it (about 8x faster than its Python parser)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def fill_defaults(config: dict, schema: dict) -> None:
    """Check ``config`` against ``schema``, filling in, in place, each missing property's default.

    jsonschema's recipe, as ``snakemake.utils.validate(set_default=True)`` uses it, on a
    schema already read (that function reads its file again, with PyYAML's Python parser).

    Raises
    ------
    jsonschema.ValidationError
        The first problem found.
    """
    check_properties = Draft202012Validator.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: dict, instance: Any, subschema: dict) -> Any:
        for name, property_schema in properties.items():
            if "default" in property_schema and isinstance(instance, dict):
                instance.setdefault(name, property_schema["default"])
        yield from check_properties(validator, properties, instance, subschema)

    validators.extend(Draft202012Validator, {"properties": set_defaults})(schema).validate(config)


def checked_config(config: dict, schema: dict) -> dict:
    """``config``, checked against ``schema`` with defaults filled in, in place.

    Snakemake reads nested values given with --config (``markers={resolution: 2.0}``)
    as text, and ``null`` too: text where the schema wants a number, a boolean, a list or
    null is read as YAML first.

    Raises
    ------
    InputError
        Every problem, named with its key, on one line.
    """
    validator = Draft202012Validator(schema)
    while True:
        retyped = False
        for error in validator.iter_errors(config):
            if error.validator in ("type", "enum") and isinstance(error.instance, str) and error.absolute_path:
                value = read_yaml(error.instance)
                # A type error is mended by the type alone: the value's other checks then name their own problem.
                wanted = {"type": error.validator_value} if error.validator == "type" else error.schema
                if not isinstance(value, str) and Draft202012Validator(wanted).is_valid(value):
                    _set_nested(config, list(error.absolute_path), value)
                    retyped = True
        if not retyped:
            break
    problems = [
        f"{'.'.join(map(str, error.absolute_path)) or 'config'}: {error.message}"
        for error in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if problems:
        raise InputError("config: " + "; ".join(problems) + " (keys and defaults: config/schemas/config.schema.yaml)")
    fill_defaults(config, schema)
    return config


def _set_nested(mapping: dict, keys: list, value: Any) -> None:
    for key in keys[:-1]:
        mapping = mapping[key]
    mapping[keys[-1]] = value


def check_settings_together(config: dict, *, rna_samples: list[str]) -> None:
    """Refuse settings that the schema allows one by one but not together.

    Raises
    ------
    InputError
        The markers' resolution not among their algorithm's, a merge of fewer than two RNA
        samples (``rna_samples``), merge.integration's ``use`` not among its methods or scANVI
        without scVI or labels, or more neighbour components than PCA computes.
    """
    markers = config["markers"]
    resolutions = config[markers["algorithm"]]["resolutions"]
    if markers["resolution"] not in resolutions:
        raise InputError(
            f"config: markers.resolution {markers['resolution']} is not among "
            f"{markers['algorithm']}.resolutions {resolutions}"
        )
    if config["merge"]["enabled"] and len(rna_samples) < 2:
        raise InputError(
            f"config: merge.enabled needs two RNA samples or more; the sheet has {len(rna_samples)} "
            f"({', '.join(rna_samples) or 'none'}): a merge of one says nothing of batches"
        )
    try:
        from_config(MergeOptions, config["merge"])
    except ValueError as exc:
        raise InputError(f"config: {exc}") from None
    n_pcs, n_comps = config["neighbors"]["n_pcs"], config["pca"]["n_comps"]
    if n_pcs > n_comps:
        raise InputError(
            f"config: neighbors.n_pcs {n_pcs} is more than pca.n_comps {n_comps}: "
            "the neighbour graph can use only the components PCA computes"
        )
