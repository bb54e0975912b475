"""Which fields of a report's config would run code if the config were run again.

`oracle replay` and `oracle localize` re-run the config stored in a report. A report from someone
else's CI can name a custom engine class, `preload` modules, a server command, environment variables
of a started process (LD_PRELOAD, PYTHONPATH, ...) or vLLM arguments that import classes or load a
model's own code: running it runs their code. Those fields are refused unless the user says they trust
the report (`--trust-report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle.errors import ConfigError

if TYPE_CHECKING:
    from oracle.engines.kinds import EngineKind


def code_loading_fields(config: Mapping[str, Any]) -> list[str]:
    """Dotted names of the fields in `config` (a report's `config`) that load or run code.

    A kind that is neither built in nor installed through the `oracle.engines` entry point names code
    (`module:Class`); `preload` imports modules; the rest is the kind's row's `code_options` (a started
    server's command and environment, vLLM's engine_args that import classes by name, ...). Nothing
    named by the report is imported to find out."""
    engine = config.get("engine")
    if not isinstance(engine, Mapping):
        return []
    found = []
    row = _row_of(engine)
    if row is None or row.user_code:
        found.append("engine.kind")
    if engine.get("preload"):
        found.append("engine.preload")
    options = engine.get("options")
    if isinstance(options, Mapping):
        code = row.code_options(options) if row is not None else _any_kind_code_options(options)
        found += [f"engine.options.{name}" for name in code]
    return found


def _row_of(engine: Mapping[str, Any]) -> EngineKind | None:
    """The row of a report's engine kind, built in or installed, without importing any code the report names;
    None for a `module:Class` kind, an unknown one, or an installed entry point that does not load (its config
    cannot be trusted blind)."""
    from oracle.engines.kinds import known_row

    kind = engine.get("kind", "native")
    try:
        return known_row(kind) if isinstance(kind, str) else None
    except ConfigError:
        return None


def _any_kind_code_options(options: Mapping[str, Any]) -> list[str]:
    """A kind not known here: every option that loads code for any known kind."""
    from oracle.engines.kinds import BUILTIN

    names: list[str] = []
    for row in BUILTIN.values():
        names += [n for n in row.code_options(options) if n not in names]
    return names


def require_trust(report_path: Path, config: Mapping[str, Any], trusted: bool) -> None:
    """ConfigError (exit 2) naming the fields when the report's config would run code and `trusted` is off."""
    fields = code_loading_fields(config)
    if fields and not trusted:
        raise ConfigError(f"{report_path}: its config runs code when re-run ({', '.join(fields)}); pass "
                          "--trust-report if you trust where this report came from")


def named_server(config: Mapping[str, Any]) -> str | None:
    """The server a report's config sends requests to, named by the report (the URL its kind's row reads from
    `engine.options`: an openai engine's `base_url`), or None (the engine runs here, or the config starts its
    server: `command`, gated as code)."""
    engine = config.get("engine")
    options = engine.get("options") if isinstance(engine, Mapping) else None
    if not isinstance(engine, Mapping) or not isinstance(options, Mapping):
        return None
    row = _row_of(engine)
    return row.server_url(options) if row is not None else None


def replay_command(report_path: str | Path, trial_id: int, config: Mapping[str, Any], verb: str = "replay") -> str:
    """The command that re-runs a trial of this report; with --trust-report where its config loads code or
    sends credentials to the server it names (the user's own run: they wrote that config)."""
    flag = " --trust-report" if code_loading_fields(config) or named_server(config) else ""
    return f"oracle {verb} {report_path} --trial {trial_id}{flag}"
