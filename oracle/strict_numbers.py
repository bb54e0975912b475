"""Numbers in a config are numbers: `trials: true` is refused, not read as 1.

pydantic's lax mode takes a bool for an int or a float field (True == 1); strict mode would also refuse the
YAML list a `[min, max]` pair is written as. So every config model (oracle.config, oracle.engine_options)
holds `refuse_bools` as a before-validator of all its fields: a field whose type holds int or float and not
bool refuses a bool, alone or inside a list, a tuple or a dict's values.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import ValidationInfo

_NUMBERS = (int, float)


def _leaves(annotation: Any) -> set[Any]:
    """The plain types an annotation is made of (`tuple[int, int] | None` -> {int, NoneType})."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return {type(a) for a in args}
    if not args:
        return {annotation}
    found: set[Any] = set()
    for a in args:
        if a is not Ellipsis:
            found |= _leaves(a)
    if origin is not None and origin not in (typing.Union, types.UnionType):
        found.add(origin)
    return found


def counts_only(annotation: Any) -> bool:
    """The field takes numbers and never a bool (`int`, `float | None`, `tuple[int, int]`; not `bool`, not Any)."""
    leaves = _leaves(annotation)
    return bool(leaves & set(_NUMBERS)) and bool not in leaves and Any not in leaves


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, bool) for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, bool) for v in value.values())
    return False


def refuse_bools(cls: Any, value: Any, info: ValidationInfo) -> Any:
    """A pydantic before-validator for every field (`field_validator("*", mode="before")`)."""
    if info.field_name is not None and _holds_bool(value):
        field = cls.model_fields.get(info.field_name)
        if field is not None and counts_only(field.annotation):
            raise ValueError("a number, not true/false")
    return value
