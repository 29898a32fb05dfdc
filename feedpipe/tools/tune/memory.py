"""Memory for the tuners: host RAM available and the bytes a loader's batches take (a process's
peak resident memory: :mod:`feedpipe.tools.rss`)."""

from __future__ import annotations

import gc
import os
from typing import Any

from ..machine import memory


def host_available_bytes() -> int:
    """RAM the kernel could give this machine's processes now (MemAvailable), in bytes."""
    avail = memory()["available"]
    return avail if avail is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf(
        "SC_PAGE_SIZE")


def free_device_memory(device: Any) -> None:
    """Collect garbage and, on CUDA, return cached blocks and reset the peak counters."""
    gc.collect()
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
