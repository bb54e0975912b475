"""oracle: a determinism test oracle for LLM inference.

The front door: `run(config) -> Report` runs every check of a config; `load_config(path)` reads one (`Config`);
`Report` is what a run gives (report.json); `Engine` is the contract an engine meets. Each is imported on first
use, so `import oracle` (and `oracle --help`) loads none of them.

    import oracle

    report = oracle.run(oracle.load_config("configs/tiny.yaml"))
    assert report.exit_code() == 0
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Config", "Engine", "Report", "load_config", "run"]

# name -> the module that holds it (by name, not an import statement: every module imports this package first, so
# an import of them here, even for typing, would close a circle)
_FRONT = {"run": "oracle.runner", "load_config": "oracle.config", "Config": "oracle.config",
          "Report": "oracle.report", "Engine": "oracle.engines.contract"}


def __getattr__(name: str) -> Any:
    if name in _FRONT:
        import importlib

        return getattr(importlib.import_module(_FRONT[name]), name)
    raise AttributeError(f"module 'oracle' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_FRONT])
