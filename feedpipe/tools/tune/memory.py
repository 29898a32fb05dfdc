"""Measuring memory for the tuners: a process's peak resident memory, host RAM, loader buffers.

CPU trials are judged by the kernel's own high-water mark: on Linux, writing ``5`` to
``/proc/self/clear_refs`` resets ``VmHWM`` (peak resident set size) to the current RSS, so a trial
reads its exact peak afterwards, with no sampling thread that could miss a short spike. Between
trials ``malloc_trim(0)`` hands freed heap pages back to the kernel (the CPU counterpart of
``torch.cuda.empty_cache``), so memory a large trial freed but glibc kept resident does not
inflate the next one, and :func:`exact_heap` makes glibc serve every allocation over 64 KiB
with its own mapping, returned at free: otherwise glibc's adaptive mmap threshold lets the same
trial's peak wander from run to run (measured: three trials of a tiny CNN at batch 64 read 64, 70
and 90 MiB with it; 48, 49 and 49 MiB with the threshold fixed). Where ``clear_refs`` is not
available a thread samples RSS every millisecond with psutil.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from ...errors import MissingDependencyError
from ...loader.protocol import Loader
from ...loader.torch.backend import SlotRing
from ..machine import memory

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(key: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"{_STATUS} has no {key} line")


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


@lru_cache(maxsize=1)
def _libc() -> Any:
    """The C library's symbols as loaded into this process (None where that is not possible)."""
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None


def _libc_trim() -> None:
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


@contextmanager
def exact_heap() -> Iterator[None]:
    """Make resident memory track live allocations while measuring (glibc; elsewhere a no-op).

    Afterwards the thresholds are left where glibc's adaptive ones settle for large tensors (mmap
    above 32 MiB, trim above 64 MiB): glibc cannot switch adaptation back on.
    """
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, 64 << 10)
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        mallopt(_M_TRIM_THRESHOLD, 64 << 20)


def _kernel_peak_available() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        _status_bytes("VmHWM")
        return True
    except OSError:
        return False


class HostPeak:
    """Peak resident memory of this process during a window: ``reset()``, run, ``peak()``."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.kernel = _kernel_peak_available()
        self.interval_s = interval_s
        self._proc: Any = None
        self._max = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.kernel:
            try:
                import psutil
            except ImportError as exc:
                raise MissingDependencyError(
                    "measuring peak memory on this platform needs psutil: pip install psutil"
                ) from exc
            self._proc = psutil.Process()

    def rss(self) -> int:
        """Current resident set size in bytes."""
        return _status_bytes("VmRSS") if self.kernel else int(self._proc.memory_info().rss)

    def reset(self) -> None:
        """Hand freed heap pages back, then start a new window at the current RSS (collect
        garbage first: :func:`free_device_memory`)."""
        self.stop()
        _libc_trim()
        if self.kernel:
            _CLEAR_REFS.write_text("5")
            return
        self._max = self.rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._max = max(self._max, self.rss())

    def peak(self) -> int:
        """Highest RSS (bytes) since the last ``reset()``."""
        if self.kernel:
            return _status_bytes("VmHWM")
        return max(self._max, self.rss())

    def stop(self) -> None:
        """End the sampling thread, if one runs."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None


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
    """Host bytes of batches a loader holds at once.

    With workers, the torch backend keeps its ring of :meth:`SlotRing.slots` batches; without
    workers one batch is built at a time. Worker processes' own memory (interpreter, decoder) is
    not counted.
    """
    slots = SlotRing.slots(workers, prefetch) if workers else 1
    return per_sample * batch_size * slots


def free_device_memory(device: Any) -> None:
    """Collect garbage and, on CUDA, return cached blocks and reset the peak counters."""
    gc.collect()
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
