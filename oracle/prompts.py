"""Targets from the config: literal texts, a JSONL file, or random token sequences.

Every problem with the prompts or the model's vocabulary and tokenizer is the user's input, so it
raises ConfigError or ModelError (exit 2) naming the file, the line or the field, never a
traceback. A prompts file is read a line at a time, and refused above `MAX_PROMPTS_BYTES`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from oracle.config import MAX_TOKENS, Config
from oracle.errors import ConfigError, ModelError
from oracle.models.facts import ModelFacts
from oracle.models.facts import reason as _reason
from oracle.models.facts import shown as _shown

# A prompts file holds at most this many bytes, lines of at most MAX_LINE_BYTES, and MAX_PROMPTS prompts:
# beyond them it is a mistake (a wrong file), and reading it would take the runner's memory.
MAX_PROMPTS_BYTES = 256 << 20
MAX_LINE_BYTES = 16 << 20
MAX_PROMPTS = 100_000

Encode = Callable[[str, str], tuple[int, ...]]


@dataclass(frozen=True)
class Target:
    """A prompt whose outputs are checked, as token ids."""

    name: str
    token_ids: tuple[int, ...]


def check_prompts(config: Config) -> None:
    """Fail fast on a missing or oversized prompts file, before any model is made."""
    if config.prompts.file is not None:
        _check_file(config.resolve_path(config.prompts.file))


def load_targets(config: Config, facts: ModelFacts) -> list[Target]:
    """The config's prompts as targets: token ids checked against the model's vocabulary, texts encoded with
    its tokenizer."""
    spec = config.prompts
    if spec.random is not None:
        r = spec.random
        rng = random.Random(r.seed)
        vocab = facts.require_vocab_size()
        return [
            Target(f"random-{i}", tuple(rng.randrange(vocab) for _ in range(rng.randint(r.min_len, r.max_len))))
            for i in range(r.count)
        ]
    if spec.texts is not None:
        encode = _tokenizer(facts.model_dir, facts.require_vocab_size())
        return [Target(f"text-{i}", encode(t, f"prompts.texts.{i}")) for i, t in enumerate(spec.texts)]
    if spec.file is None:
        raise ConfigError("prompts: give exactly one of texts, file, random")
    return _from_jsonl(config.resolve_path(spec.file), facts)


def _tokenizer(model_dir: Path, vocab: int) -> Encode:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelError(f"{path}: no tokenizer; give prompts as token ids or random")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the Rust library raises a bare Exception for a corrupt file
        raise ModelError(f"{path}: not a tokenizer file this version of tokenizers can read ({_reason(e)})") from e

    def encode(text: str, field: str) -> tuple[int, ...]:
        _check_text(text, field)
        try:
            ids = tuple(tok.encode(text, add_special_tokens=False).ids)
        except Exception as e:  # noqa: BLE001 - a tokenizer that cannot encode this text: the text's problem
            raise ConfigError(f"{field}: the tokenizer {path} cannot encode this prompt ({_reason(e)})") from e
        if not ids:
            raise ConfigError(f"{field}: prompt tokenizes to nothing")
        if len(ids) > MAX_TOKENS:
            raise ConfigError(f"{field}: prompt is {len(ids):,} tokens (at most {MAX_TOKENS:,})")
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise ModelError(f"{path}: gives token id {bad} for {field}, outside the model's vocab_size {vocab}")
        return ids

    return encode


def _check_text(text: str, field: str) -> None:
    """A prompt must be text a tokenizer (and every report format) can encode: no lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{field}: not valid Unicode: a lone surrogate U+{ord(text[e.start]):04X} at "
                          f"character {e.start}") from e


def _check_file(path: Path) -> int:
    """The prompts file's size; ConfigError naming it when it is missing, not a file or too large."""
    if not path.exists():
        raise ConfigError(f"prompts.file: {path} not found")
    if not path.is_file():
        raise ConfigError(f"prompts.file: {path} is not a file")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ConfigError(f"prompts.file: cannot read {path} ({e.strerror or e})") from e
    if size > MAX_PROMPTS_BYTES:
        raise ConfigError(f"prompts.file: {path} is {size:,} bytes (at most {MAX_PROMPTS_BYTES:,}); "
                          "split it, or give fewer prompts")
    return size


def _rows(f: BinaryIO, path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, `path:line`, object) for each non-blank line, the line and file sizes checked as read."""
    read = 0
    for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
        where = f"{path}:{n}"
        read += len(raw)
        if len(raw) > MAX_LINE_BYTES:
            raise ConfigError(f"{where}: line is longer than {MAX_LINE_BYTES:,} bytes")
        if read > MAX_PROMPTS_BYTES:  # the file grew while it was read
            raise ConfigError(f"prompts.file: {path} is more than {MAX_PROMPTS_BYTES:,} bytes")
        row = _json_line(raw, where)
        if row is not None:
            yield n, where, row


def _row_name(row: dict[str, Any], n: int, where: str, names: dict[str, int]) -> str:
    """The row's name (`line-N` by default), checked unique; recorded in `names` (name -> line)."""
    name = row.get("name", f"line-{n}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name: must be a non-empty string (got {_shown(name)})")
    _check_text(name, f"{where}: name")
    if name in names:
        raise ConfigError(f"{where}: name: {name!r} is already the name of line {names[name]}")
    names[name] = n
    return name


def _from_jsonl(path: Path, facts: ModelFacts) -> list[Target]:
    _check_file(path)
    vocab = facts.require_vocab_size()
    encode: Encode | None = None  # the tokenizer, loaded at the first text prompt
    targets: list[Target] = []
    names: dict[str, int] = {}
    try:
        from oracle.files import open_regular

        with open_regular(path, MAX_PROMPTS_BYTES, "prompts file") as f:
            for n, where, row in _rows(f, path):
                if len(targets) >= MAX_PROMPTS:
                    raise ConfigError(f"{where}: more than {MAX_PROMPTS:,} prompts")
                name = _row_name(row, n, where, names)
                if "prompt_token_ids" in row:
                    targets.append(Target(name, _token_ids(row["prompt_token_ids"], vocab, where)))
                elif isinstance(row.get("prompt"), str):
                    encode = encode or _tokenizer(facts.model_dir, vocab)
                    targets.append(Target(name, encode(row["prompt"], where)))
                else:
                    raise ConfigError(f"{where}: expected a prompt (string) or prompt_token_ids (list)")
    except OSError as e:
        raise ConfigError(f"prompts.file: cannot read {path} ({e.strerror or e})") from e
    if not targets:
        raise ConfigError(f"prompts.file: {path} holds no prompts")
    return targets


def _json_line(raw: bytes, where: str) -> dict[str, Any] | None:
    """One JSONL line as an object; None for a blank line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from e
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg})") from e
    except RecursionError as e:
        raise ConfigError(f"{where}: not a prompt: JSON nested too deeply") from e
    except ValueError as e:  # an integer of thousands of digits
        raise ConfigError(f"{where}: not a prompt ({_reason(e)})") from e
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected an object with prompt or prompt_token_ids")
    return row


def _token_ids(ids: Any, vocab: int, where: str) -> tuple[int, ...]:
    """A non-empty list of ints in [0, vocab) (booleans are not token ids, though Python counts them as ints)."""
    rule = f"prompt_token_ids must be a non-empty list of ints in [0, {vocab})"
    if not isinstance(ids, list) or not ids:
        raise ConfigError(f"{where}: {rule} (got {_shown(ids)})")
    if len(ids) > MAX_TOKENS:
        raise ConfigError(f"{where}: prompt_token_ids holds {len(ids):,} tokens (at most {MAX_TOKENS:,})")
    for k, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab:
            raise ConfigError(f"{where}: {rule} (item {k} is {_shown(i)})")
    return tuple(ids)
