"""The config reference, generated from the pydantic models (docs/config-reference.md is its output)."""

from __future__ import annotations

import types
from typing import Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from oracle.config import Config, EngineConfig
from oracle.engines.kinds import BUILTIN


def _type_name(t: object) -> str:
    origin = get_origin(t)
    if origin is None:
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t.__name__
        return "null" if t is type(None) else getattr(t, "__name__", str(t))
    args = get_args(t)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if str(origin).endswith("Literal"):
        return " | ".join(repr(a) for a in args)
    if origin is tuple:
        return "[" + ", ".join(_type_name(a) for a in args) + "]"
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return f"map[{_type_name(args[0])}, {_type_name(args[1])}]"
    return str(t)


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


def render_reference() -> str:
    models: list[type[BaseModel]] = []
    _models(Config, models)
    # Each built-in engine's options, right after EngineConfig (its `options` is a map in the schema).
    options: list[type[BaseModel]] = []
    engine_options = {row.name: row.options for row in BUILTIN.values() if row.options is not None}
    for m in engine_options.values():
        _models(m, options)
    at = models.index(EngineConfig) + 1
    models[at:at] = [m for m in options if m not in models]
    kinds = {m: kind for kind, m in engine_options.items()}
    out = ["# Config reference", "",
           "Generated from `oracle/config.py` and `oracle/engine_options.py` by `oracle config reference`; unknown "
           "fields are errors.", ""]
    for m in models:
        out += [f"## {m.__name__}", ""]
        if m.__doc__ and m is not Config:
            out += [m.__doc__.strip().splitlines()[0], ""]
        if m in kinds:
            out += [f"Validated before the run when `engine.kind: {kinds[m]}`; unknown options are errors.", ""]
        out += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, f in m.model_fields.items():
            if f.is_required():
                default = "required"
            elif f.default_factory is not None:
                default = "(see section)" if isinstance(f.annotation, type) and issubclass(
                    f.annotation, BaseModel) else repr(f.default_factory())  # type: ignore[call-arg]
            else:
                default = repr(f.default) if f.default is not PydanticUndefined else ""
            desc = (f.description or "").replace("|", "\\|")
            kind = _type_name(f.annotation).replace("|", "\\|")
            out.append(f"| `{name}` | `{kind}` | `{default}` | {desc} |")
        out.append("")
    return "\n".join(out)
