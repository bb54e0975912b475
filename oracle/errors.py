"""Errors a user can cause, each with the exit code the CLI turns it into."""

from __future__ import annotations


class OracleError(Exception):
    """Base of every error the CLI reports as one line and an exit code."""

    exit_code = 2


class ConfigError(OracleError):
    """A config file, a field in it, or a command-line argument is wrong (exit 2)."""

    exit_code = 2


class ModelError(OracleError):
    """A model path is missing or holds no loadable checkpoint (exit 2)."""

    exit_code = 2


class EngineError(OracleError):
    """An engine failed to start, raised, died or did not answer (exit 3)."""

    exit_code = 3


def exit_called(e: SystemExit) -> str:
    """Which exit an engine or a user's module called: `sys.exit(0)`, or what oracle.lifecycle.exit_trap's
    ExitCalled (a SystemExit subclass) says of its `os._exit`."""
    return str(e) if type(e) is not SystemExit else f"sys.exit({e.code!r})"


def engine_error(e: BaseException, during: str = "") -> OracleError:
    """What the run reports for anything an engine raised, the one place it is worded: an OracleError as it
    is (it already names the field or the file), an exit call named, anything else an EngineError (exit 3)
    naming the exception. `during` names the call when it is not generate (`reset_prefix_cache`)."""
    if isinstance(e, OracleError):
        return e
    where = f" in {during}" if during else ""
    if isinstance(e, SystemExit):
        return EngineError(f"engine called {exit_called(e)}{where}")
    return EngineError(f"engine raised {type(e).__name__}{where}: {e}")
