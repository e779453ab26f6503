"""The workflow's configuration: YAML read by libyaml, checked against its JSON schema with defaults filled in.

The workflow (``rules/common.smk``) and ``omicsprep warm-kernels`` read it alike.
"""

from __future__ import annotations

from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators


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
