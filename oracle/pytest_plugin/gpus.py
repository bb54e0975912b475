"""pytest-xdist: one GPU per worker when several are visible, within the caller's CUDA_VISIBLE_DEVICES.

The controller lists the devices the caller lets the session see (CUDA_VISIBLE_DEVICES as given:
indexes or UUIDs, in the caller's order; when unset, every GPU `nvidia-smi -L` lists) and hands
worker `gwK` the K-th of them, round robin; the worker sets CUDA_VISIBLE_DEVICES to that one device
in its own environment before any test imports torch. With one device or none nothing changes, and
`--oracle-gpu-per-worker off` leaves every worker the caller's devices.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

ENV = "CUDA_VISIBLE_DEVICES"


def count_gpus() -> int:
    """GPUs `nvidia-smi -L` lists (0 without nvidia-smi or when it fails); torch is not imported."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def visible_devices(env: Mapping[str, str], count: Callable[[], int] = count_gpus) -> list[str]:
    """The caller's devices: CUDA_VISIBLE_DEVICES's entries when set (empty: none), else 0..count-1."""
    if ENV in env:
        return [d.strip() for d in env[ENV].split(",") if d.strip()]
    return [str(i) for i in range(count())]


def worker_device(worker_id: str, devices: Sequence[str]) -> str | None:
    """The device of xdist worker `gwK` (K-th, round robin), or None when fewer than two are visible."""
    if len(devices) < 2 or not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return None
    return devices[int(worker_id[2:]) % len(devices)]
