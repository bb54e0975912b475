"""Dataclasses as JSON and back, driven by their fields' types: one codec for every field, so a field added
to a dataclass is written and read with no edit here, or refused (TypeError naming it) when its codec is
built, at import of the module that builds it.

What each type becomes, exactly enough to read back bitwise what was written:
- str, int, float, bool: themselves (a float as its repr, through json); a Literal: its value, read back
  only if it is one of the Literal's;
- `X | None`: null or X; list[X], tuple[X, ...], tuple[A, B]: a list, read back as the declared sequence;
- a mapping with str keys: an object; with other keys: a list of [key, value] pairs;
- a dataclass: an object of its fields, every one of them and no other on reading;
- a TypedDict: an object of the keys it holds, each by its declared type; a key it does not declare is
  refused on reading;
- `Any`: JSON as it is (an object's `to_json()`, a tuple as a list); a key of type Any reads a list back
  as a tuple (a key must be hashable);
- `Row`: an array stored beside the JSON (`Rows`); the JSON holds its key.

`retype` gives a field a more exact type than its declared one (`list[Any]` that holds arrays). Reading
checks every value against its type: a tampered document raises TypeError, ValueError or KeyError naming
the place.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np


class Row:
    """Marks an array that is stored beside the JSON (`Rows`), by key."""


class Rows:
    """The arrays a document stores beside its JSON: `add` while encoding, `get` while decoding."""

    def __init__(self, arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self.arrays: dict[str, np.ndarray] = dict(arrays or {})

    def add(self, row: Any) -> str:
        key = f"r{len(self.arrays)}"
        self.arrays[key] = np.asarray(row)
        return key

    def get(self, key: Any) -> np.ndarray:
        if not isinstance(key, str):
            raise TypeError(f"row key {key!r} is not a string")
        return self.arrays[key]


@dataclass(frozen=True)
class Codec:
    """A type's encoding: `encode(value, rows)` -> JSON, `decode(json, rows)` -> the value. `same`: the JSON
    types that decode to themselves, unchanged (a str, an int, ...): a container of them is checked at once,
    not element by element."""

    encode: Callable[[Any, Rows], Any]
    decode: Callable[[Any, Rows], Any]
    same: frozenset[type] = frozenset()


Retype = Mapping[tuple[type, str], Any]


def codec_for(tp: Any, retype: Retype | None = None) -> Codec:
    """The codec of `tp`; TypeError naming the field when a type in it has no encoding, or when `retype`
    names a field that `tp` does not hold."""
    builder = _Builder(dict(retype or {}))
    codec = builder.build(tp, getattr(tp, "__name__", str(tp)))
    if builder.unused:
        raise TypeError(f"retype: {sorted(f'{c.__name__}.{n}' for c, n in builder.unused)} are no fields of {tp}")
    return codec


def _plain(v: Any) -> Any:
    """A value of type Any as JSON: an object's to_json(), mappings and sequences element by element."""
    if hasattr(v, "to_json"):
        return _plain(v.to_json())
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _hashable(v: Any) -> Any:
    """A key of type Any as read from JSON: lists (JSON's tuples) back to tuples."""
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def _expect(v: Any, kinds: tuple[type, ...], where: str) -> Any:
    """`v` when it is one of `kinds` (a bool only where bool is named: JSON's true is no int)."""
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise TypeError(f"{where}: {type(v).__name__} {str(v)[:40]!r} where the type says {names}")
    return v


def _scalar(kind: type, where: str) -> Codec:
    accepted: tuple[type, ...] = (int, float) if kind is float else (kind,)
    return Codec(lambda v, rows: kind(v), lambda v, rows: kind(_expect(v, accepted, where)), frozenset({kind}))


_ANY = Codec(lambda v, rows: _plain(v), lambda v, rows: v)
_ANY_KEY = Codec(lambda v, rows: _plain(v), lambda v, rows: _hashable(v))
_ROW = Codec(lambda v, rows: rows.add(v), lambda v, rows: rows.get(v))


def _one_of(values: tuple[Any, ...], where: str) -> Codec:
    def decode(v: Any, rows: Rows) -> Any:
        if not any(v == x and type(v) is type(x) for x in values):
            raise ValueError(f"{where}: {str(v)[:40]!r} is none of {values}")
        return v

    return Codec(lambda v, rows: v, decode)


def _optional(inner: Codec) -> Codec:
    return Codec(lambda v, rows: None if v is None else inner.encode(v, rows),
                 lambda v, rows: None if v is None else inner.decode(v, rows),
                 inner.same | {type(None)} if inner.same else frozenset())


def _sequence(make: Callable[[Any], Any], item: Codec, where: str) -> Codec:
    def decode(v: Any, rows: Rows) -> Any:
        if item.same and all(type(x) in item.same for x in _expect(v, (list,), where)):
            return make(v)  # token ids, logprobs: checked at once
        return make(item.decode(x, rows) for x in _expect(v, (list,), where))

    return Codec(lambda v, rows: [item.encode(x, rows) for x in v], decode)


def _fixed_tuple(items: list[Codec], where: str) -> Codec:
    def decode(v: Any, rows: Rows) -> tuple[Any, ...]:
        if len(_expect(v, (list,), where)) != len(items):
            raise ValueError(f"{where}: {len(v)} items where the type says {len(items)}")
        if all(type(x) in c.same for c, x in zip(items, v, strict=True)):
            return tuple(v)  # top-2 pairs: checked at once
        return tuple(c.decode(x, rows) for c, x in zip(items, v, strict=True))

    return Codec(lambda v, rows: [c.encode(x, rows) for c, x in zip(items, v, strict=True)], decode)


def _str_mapping(value: Codec, where: str) -> Codec:
    def decode(v: Any, rows: Rows) -> dict[str, Any]:
        return {_expect(k, (str,), f"{where} key"): value.decode(x, rows) for k, x in _expect(v, (dict,), where).items()}

    return Codec(lambda v, rows: {str(k): value.encode(x, rows) for k, x in v.items()}, decode)


def _pair_mapping(key: Codec, value: Codec, where: str) -> Codec:
    def decode(v: Any, rows: Rows) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for pair in _expect(v, (list,), where):
            if len(_expect(pair, (list,), where)) != 2:
                raise ValueError(f"{where}: an entry of {len(pair)} items, not [key, value]")
            k = key.decode(pair[0], rows)
            if k in out:
                raise ValueError(f"{where}: key {k!r} twice")
            out[k] = value.decode(pair[1], rows)
        return out

    return Codec(lambda v, rows: [[key.encode(k, rows), value.encode(x, rows)] for k, x in v.items()], decode)


class _Builder:
    """Builds the codec of a type; a dataclass met twice shares one."""

    def __init__(self, retype: dict[tuple[type, str], Any]) -> None:
        self.retype = retype
        self.unused = set(retype)
        self.dataclasses: dict[type, Codec] = {}

    def build(self, tp: Any, where: str) -> Codec:
        """`where`: the field it is the type of, for the error that names it."""
        if tp is Any or tp is Row:
            return _ANY if tp is Any else _ROW
        if tp in (str, int, float, bool):
            return _scalar(tp, where)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclasses.get(tp) or self._dataclass(tp)
        if typing.is_typeddict(tp):
            return self._typeddict(tp, where)
        rule = _GENERIC_RULES.get(typing.get_origin(tp))
        codec = None if rule is None else rule(self, typing.get_args(tp), where)
        if codec is None:
            raise TypeError(f"{where}: type {tp} has no JSON encoding (oracle.shards.codec): give the field a "
                            "type the codec reads, or a `retype` entry")
        return codec

    def _union(self, args: tuple[Any, ...], where: str) -> Codec | None:
        if len(args) != 2 or type(None) not in args:
            return None  # only `X | None`: a value's JSON does not say which of two types it was
        return _optional(self.build(next(a for a in args if a is not type(None)), where))

    def _list(self, args: tuple[Any, ...], where: str) -> Codec | None:
        return _sequence(list, self.build(args[0], f"{where}[item]"), where) if len(args) == 1 else None

    def _tuple(self, args: tuple[Any, ...], where: str) -> Codec | None:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sequence(tuple, self.build(args[0], f"{where}[item]"), where)
        if not args or Ellipsis in args:
            return None
        return _fixed_tuple([self.build(a, f"{where}[{i}]") for i, a in enumerate(args)], where)

    def _mapping(self, args: tuple[Any, ...], where: str) -> Codec | None:
        if len(args) != 2:
            return None
        key, value = args
        value_codec = self.build(value, f"{where}[value]")
        if key is str:
            return _str_mapping(value_codec, where)
        key_codec = _ANY_KEY if key is Any else self.build(key, f"{where}[key]")
        return _pair_mapping(key_codec, value_codec, where)

    def _literal(self, args: tuple[Any, ...], where: str) -> Codec | None:
        return _one_of(args, where)

    def _typeddict(self, tp: Any, where: str) -> Codec:
        codecs = {k: self.build(v, f"{where}.{k}") for k, v in typing.get_type_hints(tp).items()}

        def decode(v: Any, rows: Rows) -> dict[str, Any]:
            unknown = sorted(set(_expect(v, (dict,), where)) - set(codecs), key=str)
            if unknown:
                raise KeyError(f"{where}: unknown keys {unknown}")
            return {k: codecs[k].decode(x, rows) for k, x in v.items()}

        return Codec(lambda v, rows: {k: codecs[k].encode(x, rows) for k, x in v.items()}, decode)

    def _dataclass(self, cls: type) -> Codec:
        try:
            hints = typing.get_type_hints(cls)
        except NameError as e:
            raise TypeError(f"{cls.__name__}: its field types do not resolve at run time ({e}); import them "
                            "outside `if TYPE_CHECKING:`") from e
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        # Filled after the placeholder is cached, so a dataclass that holds itself builds too.
        codecs: dict[str, Codec] = {}

        def encode(v: Any, rows: Rows) -> dict[str, Any]:
            return {n: c.encode(getattr(v, n), rows) for n, c in codecs.items()}

        expected = frozenset(names)
        same: list[tuple[str, frozenset[type]]] = []  # the fields whose JSON is their value, when of these types

        def decode(v: Any, rows: Rows) -> Any:
            if _expect(v, (dict,), cls.__name__).keys() != expected:
                missing, unknown = sorted(expected - set(v)), sorted(set(v) - expected, key=str)
                raise KeyError(f"{cls.__name__}: fields missing {missing}, unknown {unknown}")
            if not all(type(v[n]) in types for n, types in same):
                return cls(**{n: c.decode(v[n], rows) for n, c in codecs.items()})  # raises, naming the field
            return cls(**{n: v[n] if c.same else c.decode(v[n], rows) for n, c in codecs.items()})

        self.dataclasses[cls] = Codec(encode, decode)
        for n in names:
            self.unused.discard((cls, n))
            codecs[n] = self.build(self.retype.get((cls, n), hints[n]), f"{cls.__name__}.{n}")
        same.extend((n, c.same) for n, c in codecs.items() if c.same)
        return self.dataclasses[cls]


# A generic type's rule, by its origin (`list[int]` -> list): the codec, or None for a shape it cannot encode.
_GENERIC_RULES: dict[Any, Callable[[_Builder, tuple[Any, ...], str], Codec | None]] = {
    Literal: _Builder._literal, Union: _Builder._union, types.UnionType: _Builder._union, list: _Builder._list,
    tuple: _Builder._tuple, dict: _Builder._mapping, Mapping: _Builder._mapping,
}
