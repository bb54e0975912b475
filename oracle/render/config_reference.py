"""The config reference, generated from the pydantic models (docs/config-reference.md is its output)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from oracle.config import Config, EngineConfig
from oracle.engines.kinds import BUILTIN


def _type_name(t: object) -> str:
    origin = get_origin(t)
    if origin is None:
        return "null" if t is type(None) else getattr(t, "__name__", str(t))
    if str(origin).endswith("Literal"):
        return " | ".join(repr(a) for a in get_args(t))
    name = _GENERIC_NAMES.get(origin)
    return str(t) if name is None else name(get_args(t))


def _union_name(args: tuple[object, ...]) -> str:
    return " | ".join(_type_name(a) for a in args)


# A generic type's name in the reference, by its origin (`list[int]` -> list).
_GENERIC_NAMES: dict[object, Callable[[tuple[object, ...]], str]] = {
    Union: _union_name,
    types.UnionType: _union_name,
    tuple: lambda args: "[" + ", ".join(_type_name(a) for a in args) + "]",
    list: lambda args: f"list[{_type_name(args[0])}]",
    dict: lambda args: f"map[{_type_name(args[0])}, {_type_name(args[1])}]",
}


def _models(model: type[BaseModel], seen: list[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.append(model)
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                _models(t, seen)
            stack.extend(get_args(t))


def _ordered_models() -> tuple[list[type[BaseModel]], dict[type[BaseModel], str]]:
    """Config's models in the order they are met, each built-in engine's options right after EngineConfig (its
    `options` is a map in the schema); and the engine kind each options model is for."""
    models: list[type[BaseModel]] = []
    _models(Config, models)
    options: list[type[BaseModel]] = []
    engine_options = {row.name: row.options for row in BUILTIN.values() if row.options is not None}
    for m in engine_options.values():
        _models(m, options)
    at = models.index(EngineConfig) + 1
    models[at:at] = [m for m in options if m not in models]
    return models, {m: kind for kind, m in engine_options.items()}


def _default_text(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    if f.default_factory is not None:
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            return "(see section)"
        return repr(f.default_factory())  # type: ignore[call-arg]
    return repr(f.default) if f.default is not PydanticUndefined else ""


def _section(m: type[BaseModel], kind: str | None) -> list[str]:
    """A model's heading, its docstring's first line, and a row per field."""
    out = [f"## {m.__name__}", ""]
    if m.__doc__ and m is not Config:
        out += [m.__doc__.strip().splitlines()[0], ""]
    if kind is not None:
        out += [f"Validated before the run when `engine.kind: {kind}`; unknown options are errors.", ""]
    out += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, f in m.model_fields.items():
        desc = (f.description or "").replace("|", "\\|")
        type_name = _type_name(f.annotation).replace("|", "\\|")
        out.append(f"| `{name}` | `{type_name}` | `{_default_text(f)}` | {desc} |")
    out.append("")
    return out


def render_reference() -> str:
    models, kinds = _ordered_models()
    out = ["# Config reference", "",
           "Generated from `oracle/config.py` and `oracle/engine_options.py` by `oracle config reference`; unknown "
           "fields are errors.", ""]
    for m in models:
        out += _section(m, kinds.get(m))
    return "\n".join(out)
