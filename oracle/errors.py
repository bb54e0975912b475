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
