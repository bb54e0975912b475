"""`engine.device` against the torch that is installed, before any model is made: a GPU config on a CPU
build of torch is a config error (exit 2) naming the field, not an engine error after a checkpoint was built
and its first tensor failed to move."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from oracle.errors import ConfigError

if TYPE_CHECKING:
    from oracle.config import EngineConfig


def check_device(cfg: EngineConfig) -> None:
    """ConfigError when `engine.device` names CUDA and this torch cannot give it: a build without CUDA, no
    device visible, or an index past the devices there are. Imports torch only for a CUDA device. Called for
    an engine that runs the model in this process (its row's `uses_device`: oracle.engines.check_device)."""
    device = cfg.device
    if not device.startswith("cuda"):
        return
    import torch

    if torch.version.cuda is None:
        raise ConfigError(f"engine.device: {device}, but this torch has no CUDA (torch {torch.__version__}, a CPU "
                          "build): install a CUDA build of torch (pip install torch), or set engine.device: cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise ConfigError(f"engine.device: {device}, but no CUDA device is visible to torch {torch.__version__} "
                          "(check the driver and CUDA_VISIBLE_DEVICES), or set engine.device: cpu")
    index = device.partition(":")[2]
    if index and (not index.isdigit() or int(index) >= count):
        raise ConfigError(f"engine.device: {device}, but torch sees {count} CUDA device(s) (cuda:0 to cuda:{count - 1})")


def cores() -> int:
    """The CPU cores this process may run on."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_threads_apart(cfg: EngineConfig) -> bool:
    """The native row's `forks_beside` (oracle.forked_mode): on a CPU, a fixed number of threads per engine
    (`engine.num_threads`), cores for two such engines at once, one rank (tensor parallel starts processes of its
    own), and `os.fork`."""
    from oracle.engine_options import NativeOptions

    return (hasattr(os, "fork") and cfg.device == "cpu" and cfg.num_threads is not None
            and 2 * cfg.num_threads <= cores() and cfg.options_as(NativeOptions).tensor_parallel_size == 1)
