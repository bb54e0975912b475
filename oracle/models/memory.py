"""How much memory a model may take here: RAM available (within the container's limit), or a CUDA
device's free memory. Each reader returns None when it cannot tell, and the size check is skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Memory:
    """Bytes a model may take, and what they are ("RAM available", "free memory of cuda:0")."""

    bytes: int
    what: str


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            parts = rest.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * 1024  # kB
    return None


def _cgroup_headroom(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The container's memory limit minus what it uses (cgroup v2, then v1); None without a limit."""
    dirs = [root]
    with contextlib.suppress(OSError):
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::/") and line.strip() != "0::/":
                dirs.insert(0, root / line.strip()[4:])
    for d in dirs:
        limit, used = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        if limit is not None and used is not None:
            return max(0, limit - used)
    limit, used = _read_int(root / "memory" / "memory.limit_in_bytes"), _read_int(root / "memory" / "memory.usage_in_bytes")
    if limit is not None and used is not None and limit < 1 << 60:  # v1 says "no limit" with a huge number
        return max(0, limit - used)
    return None


def ram_available() -> Memory | None:
    """RAM this process could still take: MemAvailable, within a cgroup limit; sysconf elsewhere."""
    found = [n for n in (_meminfo_available(), _cgroup_headroom()) if n is not None]
    if not found:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            pages = os.sysconf("SC_AVPHYS_PAGES") if "SC_AVPHYS_PAGES" in os.sysconf_names else os.sysconf(
                "SC_PHYS_PAGES")
            found.append(pages * os.sysconf("SC_PAGE_SIZE"))
    return Memory(min(found), "RAM available") if found else None


def cuda_free(device: str) -> Memory | None:
    """Free memory of the CUDA device `device` (an in-process engine's), or None when torch cannot see it."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.device(device).index
        free, _ = torch.cuda.mem_get_info(index if index is not None else torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - no device, a bad index: the engine reports it itself
        return None
    return Memory(int(free), f"free memory of {device}")


class _Info(ctypes.Structure):
    """NVML's nvmlMemory_t."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def gpu_total() -> int | None:
    """Total memory of the first GPU this process may use (CUDA_VISIBLE_DEVICES' first entry, else GPU 0), read
    through NVML: no CUDA context in this process. None without NVML or that GPU."""

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
    except (OSError, AttributeError):
        return None
    try:
        handle = ctypes.c_void_p()
        info = _Info()
        found = (nvml.nvmlDeviceGetHandleByIndex_v2(int(first), ctypes.byref(handle)) if first.isdigit()
                 else nvml.nvmlDeviceGetHandleByUUID(first.encode(), ctypes.byref(handle)))
        if found != 0 or nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) != 0:
            return None
        return int(info.total)
    except AttributeError:
        return None
    finally:
        nvml.nvmlShutdown()


def gpus_free() -> Memory | None:
    """Free memory of every NVIDIA GPU together, read through NVML: no CUDA context in this process (a
    worker process of its own, such as vLLM's, takes the devices). None without NVML or GPUs."""

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
    except (OSError, AttributeError):  # no driver, or one without these entry points
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
            return None
        total = 0
        for i in range(count.value):
            handle = ctypes.c_void_p()
            info = _Info()
            if (nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0
                    or nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) != 0):
                return None
            total += int(info.free)
    except AttributeError:
        return None
    finally:
        nvml.nvmlShutdown()
    return Memory(total, f"free memory of {count.value} GPU{'s' if count.value > 1 else ''}")
