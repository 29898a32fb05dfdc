"""Memory for the tuners: host RAM available and the bytes a loader's batches take (a process's
peak resident memory: :mod:`feedpipe.tools.rss`)."""

from __future__ import annotations

import gc
import os
from typing import Any

from ...loader.memory import held_bytes
from ...loader.protocol import Loader
from ..machine import memory


def host_available_bytes() -> int:
    """RAM the kernel could give this machine's processes now (MemAvailable), in bytes."""
    avail = memory()["available"]
    return avail if avail is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf(
        "SC_PAGE_SIZE")


def sample_bytes(loader: Loader) -> int:
    """Bytes one sample occupies in a batch as the loader holds it before the device (uint8
    images, masks, targets, labels; DALI's output image): the unit of its ring and prefetch
    queue. Any backend: read from the loader protocol's ``describe()``."""
    return loader.describe().sample_bytes


def loader_ram_bytes(per_sample: int, batch_size: int, workers: int, prefetch: int) -> int:
    """Host bytes of batches of ``batch_size`` samples of ``per_sample`` bytes a loader holds at
    once (:func:`feedpipe.loader.memory.held_bytes`, the arithmetic the backend's ring uses)."""
    return held_bytes(per_sample * batch_size, workers, prefetch)


def free_device_memory(device: Any) -> None:
    """Collect garbage and, on CUDA, return cached blocks and reset the peak counters."""
    gc.collect()
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
