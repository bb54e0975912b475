"""Secrets kept out of every file and line oracle writes: report.json, the other formats, logs.

A config may hold secrets: `engine.options.api_key`, an environment mapping (`env`, `mode_env`)
with a hub token, a server command line with `--api-key TOKEN`, a URL with a password, a custom
engine's `token` option. A report is uploaded as a CI artifact and its summary is public, so every
such value is replaced by a hint that it was set: `<redacted: set, 40 chars>`.

What counts as a secret, by structure (`redact_tree`):
- a mapping key named like a secret (`api_key`, `HF_TOKEN`, `password`, `auth`, ...): its value;
- a value in an environment mapping (`env`, `mode_env.*`, `environment.env`, `headers`), unless
  the variable is a known determinism setting (`VLLM_BATCH_INVARIANT`, `OMP_NUM_THREADS`, ...);
- in a command line (a list of strings): the word after a secret-named flag (`--api-key X`), the
  value of `--hf-token=X` and of `HF_TOKEN=X`;
- anywhere: the password of a URL (`https://user:PASS@host`), a secret-named query parameter
  (`?api_key=X`), and strings shaped like well-known tokens (`hf_...`, `sk-...`, `ghp_...`, JWTs).

In free text (error messages, log lines: `scrub_text`) the secret values the config held are
replaced wherever they appear, and so are `Authorization:` headers, `Bearer` tokens and
`name=value` pairs with secret names.

Replaying a redacted report cannot know a secret: `restore_secrets` takes each one from the
environment (the variable named in the error), and refuses to run with the hint as the value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

HINT_PREFIX = "<redacted: set"
MIN_SCRUBBED = 6  # shorter secret values are not searched for in free text (they would hit ordinary words)
_HINT = re.compile(r"<redacted: set(?:, \d+ chars)?>")

# Words that make a name a secret's, and names made of them glued (`apikey`, `authtoken`).
_SECRET_WORDS = {"key", "apikey", "token", "secret", "password", "passwd", "pwd", "passphrase", "auth",
                 "authorization", "credential", "credentials", "cookie", "bearer", "pat", "signature",
                 "authtoken", "accesskey", "privatekey", "clientsecret", "sessionid"}
# Mapping keys whose values are environment variables (or HTTP headers): each value is a secret
# unless the variable is a known, harmless determinism setting.
_ENV_KEYS = {"env", "environ", "environment", "extra_env", "mode_env", "headers", "extra_headers"}
_SAFE_VARS = {
    "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "TORCH_DETERMINISTIC",
    "NVIDIA_TF32_OVERRIDE", "PYTHONHASHSEED", "TRITON_INTERPRET", "TOKENIZERS_PARALLELISM",
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "PYTORCH_CUDA_ALLOC_CONF",
    "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_NVLS_ENABLE", "NCCL_ALGO", "NCCL_PROTO",
    "CONTENT-TYPE", "ACCEPT",
}
_SAFE_PREFIXES = ("VLLM_", "ORACLE_KERNELS_", "SGLANG_", "TORCHINDUCTOR_", "TORCH_")
# Every pattern below starts only where a run of the characters it scans begins (a lookbehind, not
# `\b`): else each position inside a long word would start a scan to the word's end, and a 24 KB
# word (a target's name, an engine's error) would take O(n^2), a minute. Linear time is tested by size.
# Shapes of well-known tokens, wherever they appear.
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_])(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_\-]{16,}|sk_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_\-]{16,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_\-]{30,}"
    r"|(?<!-)eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})")
_URL_PASSWORD = re.compile(r"(?P<head>(?<![a-zA-Z0-9+.\-])[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s@/]+)(?=@)")
# `Authorization: Bearer X`, `Bearer X`, `api_key=X`, `"token": "X"`, `--api-key X` in free text.
_AUTH_HEADER = re.compile(r"(?P<head>\b(?:proxy-)?authorization\b['\"]?\s*[:=]\s*['\"]?"
                          r"(?:(?:bearer|basic|token|digest)\s+)?)(?!(?:bearer|basic|token|digest)\b)(?P<secret>[^\s'\",}<]+)",
                          re.IGNORECASE)
_BEARER = re.compile(r"(?P<head>\b(?:bearer|basic)\s+)(?P<secret>(?=[^\s]*[A-Za-z])[A-Za-z0-9._~+/\-]{8,}=*)",
                     re.IGNORECASE)
_NAMED = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_.\-])(?P<name>[A-Za-z0-9_.\-]+)['\"]?\s*(?:=|:\s|:(?=['\"]))\s*['\"]?)"
    r"(?P<secret>[^\s'\",;&}\]<>)]+)")
_FLAG_VALUE = re.compile(r"(?P<head>(?<![A-Za-z0-9_\-])(?P<name>--?[A-Za-z][A-Za-z0-9_\-]*)\s+)(?P<secret>[^\s'\"-][^\s'\"]*)")


def hint(value: Any) -> str:
    """What a redacted value becomes: `<redacted: set, N chars>` (N of its text), or the hint itself."""
    text = value if isinstance(value, str) else str(value)
    if is_hint(text):
        return text
    return f"{HINT_PREFIX}, {len(text)} chars>"


def is_hint(value: Any) -> bool:
    return isinstance(value, str) and _HINT.fullmatch(value) is not None


def has_hint(value: str) -> bool:
    return HINT_PREFIX in value


def is_secret_name(name: str) -> bool:
    """`api_key`, `HF_TOKEN`, `x-api-key`, `clientSecret`, `Authorization`: yes; `max_tokens`, `keys`: no."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    words = [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    return "".join(words) in _SECRET_WORDS


def _safe_var(name: str) -> bool:
    upper = name.upper()
    if is_secret_name(name):
        return False
    return upper in _SAFE_VARS or upper.startswith(_SAFE_PREFIXES)


def redact_tree(value: Any, secrets: set[str] | None = None, *, env: bool = False, key: str | None = None) -> Any:
    """A copy of `value` (JSON-like data) with every secret replaced by its hint; the real values
    found are added to `secrets` (for `scrub_text`)."""
    found = secrets if secrets is not None else set()
    return _redact(value, found, env, key)


def _redact(value: Any, found: set[str], env: bool, key: str | None) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value  # a secret is text: numbers under a secret-looking name (`key_dim: 64`) are kept
    named = key is not None and is_secret_name(key)
    if named or _unknown_variable(value, env, key):
        return _hidden(value, found, named)
    if isinstance(value, dict):
        return _redact_dict(value, found, env, key)
    if isinstance(value, list):
        return _redact_list(value, found)
    return _redact_string(value, found) if isinstance(value, str) else value


def _redact_dict(value: dict[Any, Any], found: set[str], env: bool, key: str | None) -> dict[Any, Any]:
    # Inside an environment mapping, a nested mapping (`mode_env.invariant`) is one too.
    inner_env = env or (key is not None and key.lower() in _ENV_KEYS)
    return {k: _redact(v, found, inner_env, str(k)) for k, v in value.items()}


def _unknown_variable(value: Any, env: bool, key: str | None) -> bool:
    """A string in an environment mapping whose variable is not a known determinism setting."""
    return key is not None and env and isinstance(value, str) and not _safe_var(key)


def _hidden(value: Any, found: set[str], named: bool) -> Any:
    """A secret's value as its hint (a container's as one hint, every scalar in it found); an empty value or
    a hint already stays as it is."""
    if isinstance(value, (dict, list)):
        _collect(value, found)
        return hint(_flat(value))
    if isinstance(value, str) and (value == "" or is_hint(value)):
        return value
    # An unknown variable's value (`MY_DTYPE: bfloat16`) is hidden here, but searched for in free
    # text only when it looks like a token: else every "bfloat16" in a message would go too.
    if named or _looks_like_token(str(value)):
        found.add(str(value))
    return hint(value)


def _redact_list(value: list[Any], found: set[str]) -> list[Any]:
    """A list of strings is a command line; any other list is redacted element by element."""
    if value and all(isinstance(x, str) for x in value):
        return _redact_argv(value, found)
    return [_redact(v, found, False, None) for v in value]


def _looks_like_token(value: str) -> bool:
    return (len(value) >= 16 and not any(c.isspace() for c in value) and any(c.isdigit() for c in value)
            and any(c.isalpha() for c in value))


def _flat(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def _collect(value: Any, found: set[str]) -> None:
    """Every scalar inside a redacted container is a secret too (it may appear in an error message)."""
    if isinstance(value, dict):
        for v in value.values():
            _collect(v, found)
    elif isinstance(value, list):
        for v in value:
            _collect(v, found)
    elif value is not None and not isinstance(value, bool) and str(value) and not is_hint(value):
        found.add(str(value))


def _redact_argv(argv: list[str], found: set[str]) -> list[str]:
    """A command line: `--api-key X`, `--api-key=X`, `HF_TOKEN=X`, plus every string's own rules."""
    out: list[str] = []
    secret_next = False
    for word in argv:
        if secret_next and not is_hint(word) and word:
            found.add(word)
            out.append(hint(word))
            secret_next = False
            continue
        secret_next = word.startswith("-") and "=" not in word and is_secret_name(word.lstrip("-"))
        out.append(word if secret_next else _redact_word(word, found))
    return out


def _redact_word(word: str, found: set[str]) -> str:
    """A command line's word: the value of `--api-key=X` and of `HF_TOKEN=X`, else a lone string's rules."""
    name, eq, val = word.partition("=")
    if eq and val and not is_hint(val) and re.fullmatch(r"-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*", name) \
            and is_secret_name(name.lstrip("-")):
        found.add(val)
        return f"{name}={hint(val)}"
    return _redact_string(word, found)


def _redact_string(text: str, found: set[str]) -> str:
    """A lone string: URL passwords, secret-named query parameters and token-shaped words."""
    def url_password(m: re.Match[str]) -> str:
        found.add(m.group("secret"))
        return m.group("head") + hint(m.group("secret"))

    def query(m: re.Match[str]) -> str:
        if not is_secret_name(m.group("name")) or m.string.startswith(HINT_PREFIX, m.start("secret")):
            return m.group()
        found.add(m.group("secret"))
        return m.group("head") + hint(m.group("secret"))

    def shaped(m: re.Match[str]) -> str:
        found.add(m.group())
        return hint(m.group())

    text = _URL_PASSWORD.sub(url_password, text)
    if "://" in text and "?" in text:
        text = re.sub(r"(?P<head>[?&](?P<name>[A-Za-z0-9_.\-]+)=)(?P<secret>[^&#\s]+)", query, text)
    return _TOKEN_SHAPES.sub(shaped, text)


# The secret values of every config this process has read: a line printed outside a report (an
# error's message, a log line) is scrubbed of them too. It only grows; scrubbing more is harmless.
_KNOWN: set[str] = set()


def remember(secrets: Iterable[str]) -> None:
    """Add secret values that every later `scrub_text` removes, wherever they appear."""
    _KNOWN.update(s for s in secrets if len(s) >= MIN_SCRUBBED)


def known_secrets() -> frozenset[str]:
    return frozenset(_KNOWN)


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Free text (an error message, a log line) without secrets: the known values, wherever they
    appear, then Authorization headers, bearer tokens, `secret_name=value`, `--secret-flag value`,
    URL passwords and token-shaped words, plus the values `remember` was given."""
    if not text or not isinstance(text, str):
        return text
    for value in sorted({s for s in (*secrets, *_KNOWN) if len(s) >= MIN_SCRUBBED}, key=len, reverse=True):
        if value in text:
            text = text.replace(value, hint(value))

    def sub(m: re.Match[str]) -> str:
        secret = m.group("secret")
        if has_hint(secret) or m.string.startswith(HINT_PREFIX, m.start("secret")):
            return m.group()  # already redacted (a known value replaced above)
        return m.group("head") + hint(secret)

    def named(m: re.Match[str]) -> str:
        name, secret = m.group("name").lstrip("-"), m.group("secret")
        # `KeyError: 'x'` is an exception's name; `expected_token: 512` a number: neither is a secret.
        if (not is_secret_name(name) or name.lower().endswith(("error", "exception", "warning", "authorization"))
                or len(secret) < 4 or not re.search("[A-Za-z]", secret)):
            return m.group()
        return sub(m)

    text = _AUTH_HEADER.sub(sub, text)
    text = _BEARER.sub(sub, text)
    text = _NAMED.sub(named, text)
    text = _FLAG_VALUE.sub(named, text)
    return _redact_string(text, set())


def scrub_tree(value: Any, secrets: Iterable[str] = ()) -> Any:
    """Every string in JSON-like data through `scrub_text` (keys are kept)."""
    known = tuple(secrets)
    if isinstance(value, str):
        return scrub_text(value, known)
    if isinstance(value, dict):
        return {k: scrub_tree(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_tree(v, known) for v in value]
    return value


def redact_document(data: dict[str, Any], structured: Iterable[str] = (), *, verbatim: Iterable[str] = (),
                    secrets: Iterable[str] = ()) -> dict[str, Any]:
    """The content of a file a run writes (report.json, shard-results.npz's meta, a golden file), without
    secrets: the one path every such file goes through.

    `structured`: dotted paths of the subtrees that are settings (the config, the environment, an
    engine's description: `modes.*.engine`, `*` any key) redacted by structure (`redact_tree`: a key named
    like a secret, an environment mapping's values, a command line's `--api-key X`); then every string
    of the document is scrubbed (`scrub_text`) of the secret values found, of those `remember` was given
    and of token-shaped text, except the subtrees named in `verbatim` (a report's config: redacted by
    structure only, so that replay rebuilds it as it was)."""
    found = {*secrets, *_KNOWN}
    out = _copy(data)
    for dotted in structured:
        _map_at(out, dotted.split("."), lambda node: redact_tree(node, found))
    kept = {k: out.pop(k) for k in verbatim if k in out}
    out = scrub_tree(out, found)
    out.update(kept)
    return out  # type: ignore[no-any-return]


def _map_at(node: Any, keys: list[str], fn: Any) -> None:
    """Replace, in place, each value at the path `keys` below `node` (`*` matches every key) by fn(value)."""
    if not isinstance(node, dict) or not keys:
        return
    head, rest = keys[0], keys[1:]
    for k in (list(node) if head == "*" else [head] if head in node else []):
        if rest:
            _map_at(node[k], rest, fn)
        else:
            node[k] = fn(node[k])


def redacted_paths(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], str]]:
    """Where a redacted config holds hints: (path, the hint or the string that holds one)."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            found += redacted_paths(v, (*path, str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += redacted_paths(v, (*path, i))
    elif isinstance(value, str) and has_hint(value):
        found.append((path, value))
    return found


def secret_variable(path: tuple[str | int, ...]) -> str:
    """The environment variable that gives a redacted value back: ORACLE_SECRET_ENGINE_OPTIONS_API_KEY."""
    return "ORACLE_SECRET_" + re.sub(r"[^A-Za-z0-9]+", "_", "_".join(str(p) for p in path)).strip("_").upper()


def restore_secrets(config: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                    source: str = "report.json") -> dict[str, Any]:
    """The config with each redacted value taken from the environment: an environment mapping's entry
    from the variable of the same name, `api_key` from OPENAI_API_KEY, anything else from
    `secret_variable(path)`. Raises ConfigError naming every variable still to set, so a replay never
    runs with `<redacted: ...>` as a key."""
    from oracle.errors import ConfigError

    environ = os.environ if environ is None else environ
    data: Any = _copy(config)
    missing: list[str] = []
    for path, held in redacted_paths(data):
        # The variable holds the field's whole value (for `--hf-token=<redacted>`: `--hf-token=TOKEN`).
        names = _variables_for(path) if is_hint(held) else [secret_variable(path)]
        value = next((environ[n] for n in names if environ.get(n)), None)
        if value is None:
            missing.append(f"{'.'.join(str(p) for p in path)} (set {' or '.join(names)})")
        else:
            _set(data, path, value)
    if missing:
        raise ConfigError(f"{source}: the report's config had secrets, redacted when it was written; set them in "
                          f"the environment to replay: {'; '.join(missing)}")
    return data  # type: ignore[no-any-return]


def _variables_for(path: tuple[str | int, ...]) -> list[str]:
    names = []
    parent = [str(p).lower() for p in path[:-1]]
    last = path[-1]
    if isinstance(last, str) and any(p in _ENV_KEYS for p in parent) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", last):
        names.append(last)
    if last == "api_key":
        names.append("OPENAI_API_KEY")
    names.append(secret_variable(path))
    return names


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _set(data: Any, path: tuple[str | int, ...], value: str) -> None:
    node = data
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
