"""How a bad inventory file is explained: YAML's problems and pydantic's validation errors,
each as one line naming the key path, what was expected and what was found.

A model may list in a `NOT_KEYS` class attribute the fields that the file does not set (they
are never offered as allowed keys).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from dflash_ops.core.errors import InventoryError


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: two `eval:` entries would quietly drop a host)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first}): each key once per mapping",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """'line L, column C: not valid YAML: what' (a reader error has no line: its offset)."""
    where = getattr(exc, "problem_mark", None)
    if where is not None:
        problem = getattr(exc, "problem", None) or str(exc)
        return f"line {where.line + 1}, column {where.column + 1}: not valid YAML: {problem}"
    if isinstance(exc, yaml.reader.ReaderError):
        return (
            f"offset {exc.position}: not valid YAML: character #x{exc.character:04x} ({exc.reason})"
        )
    return f"not valid YAML: {exc}"


def validation_error(
    path: Path, exc: ValidationError, prefix: tuple, model: type[BaseModel]
) -> InventoryError:
    lines = [_explain(error, prefix, model) for error in exc.errors()]
    return InventoryError(f"{path}: " + f"\n{path}: ".join(lines))


def _explain(error: dict, prefix: tuple, model: type[BaseModel]) -> str:
    names, inner = _resolve(model, error["loc"])
    key = ".".join(str(part) for part in (*prefix, *names))
    kind, found = error["type"], error.get("input")
    if kind == "missing":
        return f"{key}: required key is missing"
    if kind == "extra_forbidden":
        allowed = _keys_of(inner) if inner else []
        close = difflib.get_close_matches(str(names[-1]), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{key}: unknown key{hint}; allowed here: {', '.join(sorted(allowed))}"
    if kind == "union_tag_invalid":
        expected = error["ctx"]["expected_tags"].replace("'", "")
        return f"{key}.kind: expected one of {expected}, found {describe(error['ctx']['tag'])}"
    if kind == "union_tag_not_found":
        kinds = ", ".join(_tags_of(inner, names[-1]) if inner else [])
        return f"{key}.kind: required key is missing (one of {kinds})"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key}: expected a mapping, found {describe(found)}"
    if kind == "list_type":
        return f"{key}: expected a list, found {describe(found)}"
    if kind == "string_type" and isinstance(found, int | float):
        return f'{key}: expected a string, found {describe(found)}; quote it: "{found}"'
    expected = error["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
    return f"{key}: expected {expected}, found {describe(found)}"


def _keys_of(model: type[BaseModel]) -> list[str]:
    hidden = getattr(model, "NOT_KEYS", ())
    return [name for name in model.model_fields if name not in hidden]


def _tags_of(model: type[BaseModel], name: str) -> list[str]:
    """The `kind` values a tagged-union field accepts (pct, rootfs, docker …)."""
    field = model.model_fields.get(name)
    members = _models_in(field.annotation) if field else []
    return [tag for m in members for tag in get_args(m.model_fields["kind"].annotation)]


def _resolve(model: type[BaseModel], loc: tuple) -> tuple[list, type[BaseModel] | None]:
    """Walk an error location through the models: the key names without the tags that a
    discriminated union inserts ('pct', 'docker' …), and the model holding the last key."""
    names: list = []
    parts = list(loc)
    current: type[BaseModel] | None = model
    while parts:
        part = parts.pop(0)
        if part == "[key]":  # pydantic's marker of an error in a mapping's key
            continue
        names.append(part)
        field = current.model_fields.get(str(part)) if current else None
        nested = _models_in(field.annotation) if field else []
        if field and get_origin(field.annotation) is dict and parts:
            names.append(parts.pop(0))  # a mapping of models: the next loc entry is its key
        if len(nested) > 1 and parts:  # a tagged union: the next loc entry is the tag
            tag = parts.pop(0)
            nested = [m for m in nested if get_args(m.model_fields["kind"].annotation) == (tag,)]
        if parts:
            current = nested[0] if nested else None
    return names, current


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict | list) and not value:
        return "an empty mapping" if isinstance(value, dict) else "an empty list"
    kind = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)
    shown = repr(value) if not isinstance(value, dict | list) else ""
    return f"{shown} ({kind})" if shown else kind
