"""Targets from the config: literal texts, a JSONL file, or random token sequences."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from oracle.config import Config
from oracle.errors import ConfigError, ModelError


@dataclass(frozen=True)
class Target:
    """A prompt whose outputs are checked, as token ids."""

    name: str
    token_ids: tuple[int, ...]


def vocab_size_of(model_dir: Path) -> int:
    path = model_dir / "config.json"
    try:
        return int(json.loads(path.read_text())["vocab_size"])
    except (OSError, KeyError, ValueError) as e:
        raise ModelError(f"{path}: cannot read vocab_size ({e})") from e


def check_prompts(config: Config) -> None:
    """Fail fast on a missing prompts file, before any model is made."""
    if config.prompts.file is not None and not config.resolve_path(config.prompts.file).is_file():
        raise ConfigError(f"prompts.file: {config.resolve_path(config.prompts.file)} not found")


def load_targets(config: Config, model_dir: Path) -> list[Target]:
    spec = config.prompts
    if spec.random is not None:
        r = spec.random
        rng = random.Random(r.seed)
        vocab = vocab_size_of(model_dir)
        return [
            Target(f"random-{i}", tuple(rng.randrange(vocab) for _ in range(rng.randint(r.min_len, r.max_len))))
            for i in range(r.count)
        ]
    if spec.texts is not None:
        encode = _tokenizer(model_dir)
        return [Target(f"text-{i}", encode(t, f"prompts.texts.{i}")) for i, t in enumerate(spec.texts)]
    assert spec.file is not None
    return _from_jsonl(config.resolve_path(spec.file), model_dir)


def _tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelError(f"{path}: no tokenizer; give prompts as token ids or random")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))

    def encode(text: str, field: str) -> tuple[int, ...]:
        ids = tuple(tok.encode(text, add_special_tokens=False).ids)
        if not ids:
            raise ConfigError(f"{field}: prompt tokenizes to nothing")
        return ids

    return encode


def _from_jsonl(path: Path, model_dir: Path) -> list[Target]:
    if not path.is_file():
        raise ConfigError(f"prompts.file: {path} not found")
    vocab = vocab_size_of(model_dir)
    encode = None
    targets = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg})") from e
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected an object with prompt or prompt_token_ids")
        name = str(row.get("name", f"line-{n}"))
        if "prompt_token_ids" in row:
            ids = row["prompt_token_ids"]
            if not ids or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
                raise ConfigError(f"{where}: prompt_token_ids must be a non-empty list of ints in [0, {vocab})")
            targets.append(Target(name, tuple(ids)))
        elif isinstance(row.get("prompt"), str):
            encode = encode or _tokenizer(model_dir)
            targets.append(Target(name, encode(row["prompt"], where)))
        else:
            raise ConfigError(f"{where}: expected a prompt (string) or prompt_token_ids (list)")
    if not targets:
        raise ConfigError(f"prompts.file: {path} holds no prompts")
    return targets
