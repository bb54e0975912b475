"""The config's text: YAML read safely (no duplicate keys, no alias bombs), every string one a file can hold, a
dotted `--set`, and the file:line an error names."""

from __future__ import annotations

import re
from typing import Any

import yaml

from oracle.config_base import MAX_YAML_ALIASES, MAX_YAML_NODES
from oracle.errors import ConfigError

_SURROGATE = re.compile("[\ud800-\udfff]")


def load_yaml(text: str, source: str) -> Any:
    """safe_load, refusing duplicate keys, recursive aliases and alias bombs (checked before expanding)."""
    try:
        # The reader checks every character as it is built: a NUL or another control byte raises here.
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}{_yaml_where(e, text)}: malformed YAML: {_yaml_problem(e)}") from e
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_yaml_graph(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}{_yaml_where(e, text)}: malformed YAML: {_yaml_problem(e)}") from e
    except RecursionError as e:
        raise ConfigError(f"{source}: malformed YAML: nested too deeply") from e
    finally:
        loader.dispose()


def _yaml_where(e: yaml.YAMLError, text: str) -> str:
    """`:LINE` of a YAML error, or nothing. A reader error (a forbidden character) has a position, not a mark."""
    mark = getattr(e, "problem_mark", None)
    if mark is not None:
        return f":{mark.line + 1}"
    if isinstance(e, yaml.reader.ReaderError):
        return f":{text[: e.position].count(chr(10)) + 1}"
    return ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.reader.ReaderError):
        return (f"character U+{e.character:04X} is not allowed in YAML; remove it, or write it as an escape "
                "in a double-quoted string")
    lines = str(e).splitlines()
    return str(getattr(e, "problem", None) or (lines[0] if lines else type(e).__name__))


def check_yaml_graph(root: yaml.Node, source: str) -> None:
    """Duplicate keys, alias count and expanded size, walking the composed graph once (aliases are
    shared nodes there: nothing is expanded)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    aliases = 0

    def fail(node: yaml.Node, path: list[str], message: str) -> ConfigError:
        field = ".".join(path) or "<root>"
        return ConfigError(f"{source}:{node.start_mark.line + 1}: {field}: {message}")

    def size(node: yaml.Node, path: list[str]) -> int:
        nonlocal aliases
        key = id(node)
        if key in active:
            raise fail(node, path, "recursive YAML alias")
        if key in sizes:
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise fail(node, path, f"more than {MAX_YAML_ALIASES} YAML aliases")
            return sizes[key]
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            for k, v in node.value:
                name = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if (k.tag, name) in seen:
                        raise fail(k, [*path, name], f"duplicate key (first on line {seen[(k.tag, name)]})")
                    seen[(k.tag, name)] = k.start_mark.line + 1
                total += size(k, [*path, name]) + size(v, [*path, name])
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                total += size(item, [*path, str(i)])
        active.discard(key)
        sizes[key] = total
        if total > MAX_YAML_NODES:
            raise fail(node, path, f"expands to more than {MAX_YAML_NODES:,} YAML nodes (aliases)")
        return total

    size(root, [])


def where(source: str, text: str | None, loc: tuple[Any, ...]) -> str:
    """`file:line` of the field at `loc`, or the file alone where its text or the field's line is not known."""
    line = _line_of(text, loc) if text else None
    return f"{source}:{line}" if line else source


def shown_input(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def check_strings(data: Any, source: str, text: str | None) -> None:
    """Every key and string is text a file can hold: no lone surrogates (no encoding writes them), and
    no NUL byte (no path, argument or variable can hold one) except inside a prompt's text."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while stack:  # iterative: a report's config may be nested as deep as its JSON parser allowed
        loc, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                _check_string(str(k), (*loc, str(k)), source, text, key=True)
                stack.append(((*loc, str(k)), v))
        elif isinstance(value, (list, tuple)):
            stack.extend(((*loc, i), v) for i, v in enumerate(value))
        elif isinstance(value, str):
            _check_string(value, loc, source, text)


def _check_string(value: str, loc: tuple[str | int, ...], source: str, text: str | None, key: bool = False) -> None:
    problem = _string_problem(value, loc, key)
    if problem is not None:
        field = ".".join(str(x) for x in loc) or "<root>"
        raise ConfigError(f"{where(source, text, loc)}: {field}: {'key ' if key else ''}{problem}")


def _string_problem(value: str, loc: tuple[str | int, ...], key: bool) -> str | None:
    """A lone surrogate, or a NUL byte outside a prompt's text; None for a string a file can hold."""
    surrogate = _SURROGATE.search(value)
    if surrogate is not None:
        return f"not valid Unicode: a lone surrogate U+{ord(surrogate.group()):04X} at character {surrogate.start()}"
    if "\x00" in value and (key or loc[:2] != ("prompts", "texts")):
        return f"holds a NUL byte at character {value.index(chr(0))}"
    return None


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for depth, k in enumerate(keys[:-1]):
        child = node.setdefault(k, {})
        if depth == 1 and keys[0] == "checks" and isinstance(child, (str, bool)):
            # A check's shorthand (`drift: report`, a bare `off`): its requirement, so a --set of another of the
            # check's fields (checks.drift.localize) keeps it instead of being dropped.
            child = node[k] = {"requirement": child if isinstance(child, str) else ("required" if child else "off")}
        if not isinstance(child, dict):
            return  # the file's value is not a mapping: validation names it
        node = child
    node[keys[-1]] = value


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest YAML node on `loc` that exists in the file."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(key)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line
