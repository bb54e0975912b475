"""Which engine a mode's n-th instance is: the cross_instance check starts a mode's engine a second time.

In-process engines and engines that start their own server (`engine.options.command`) are simply built
again. A mode of the openai engine given a list of pre-started servers
(`engine.options.base_url: {invariant: [URL, URL], production: URL}`) reaches instance i at the list's
item i (the last one past its end); a single URL is the same server for every instance, which the
check reports as vacuous.
"""

from __future__ import annotations

from oracle.config import EngineConfig
from oracle.engines.contract import Mode


def instance_config(cfg: EngineConfig, mode: Mode, index: int) -> EngineConfig:
    """`cfg` (the openai engine's: its row's `instance`) with the mode's URL list (if any) resolved to
    instance `index`'s server."""
    base = cfg.options.get("base_url")
    if not isinstance(base, dict) or not isinstance(base.get(mode), list):
        return cfg
    urls = base[mode]
    resolved = {**base, mode: urls[min(index, len(urls) - 1)]}
    for other, value in resolved.items():
        if isinstance(value, list):
            resolved[other] = value[0]
    return cfg.model_copy(update={"options": {**cfg.options, "base_url": resolved}})
