"""Options built from the workflow's configuration sections."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar, get_origin, get_type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Options = TypeVar("Options", bound="DataclassInstance")


def from_config(options_class: type[Options], section: Mapping[str, Any]) -> Options:
    """``options_class`` from a configuration section; absent keys keep their defaults.

    Sub-sections become the nested options, and lists become tuples where the field is one.

    Parameters
    ----------
    options_class
        An options dataclass of this module.
    section
        Its configuration section (the workflow's, validated by the schema).

    Raises
    ------
    ValueError
        A key that is not a field of ``options_class``.
    """
    names = [option.name for option in fields(options_class)]
    unknown = sorted(set(section) - set(names))
    if unknown:
        raise ValueError(f"{options_class.__name__}: unknown keys {unknown} (known: {', '.join(names)})")
    types = get_type_hints(options_class)
    values = {}
    for key, value in section.items():
        if is_dataclass(types[key]):
            values[key] = from_config(types[key], value)
        elif get_origin(types[key]) is tuple:
            values[key] = tuple(value)
        else:
            values[key] = value
    return options_class(**values)


def from_sections(options_class: type[Options], config: Mapping[str, Any]) -> Options:
    """``options_class`` whose every field is a whole section of the workflow's configuration.

    As :class:`ClusteringOptions` and :class:`EmbeddingOptions` gather sections ``normalize``
    through ``markers`` (:func:`from_config` on each).
    """
    return from_config(options_class, {option.name: config[option.name] for option in fields(options_class)})
