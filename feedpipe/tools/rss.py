"""Resident memory, measured one way: :class:`HostPeak` (this process's peak) for
``feedpipe tune``'s batch-size search, :class:`ProcessTreeSampler` (that, plus the children's)
for ``feedpipe bench``.

On Linux writing ``5`` to ``/proc/self/clear_refs`` resets ``VmHWM`` (peak RSS), so a trial reads
its exact peak with no sampling thread to miss a spike; elsewhere a thread samples RSS every
millisecond. Between trials ``malloc_trim(0)`` hands freed heap back, and :func:`exact_heap` gives
every allocation over 64 KiB its own mapping: glibc's adaptive mmap threshold otherwise made one
trial's peak wander (measured: 64, 70 and 90 MiB for three trials of a tiny CNN at batch 64; 48,
49 and 49 MiB with the threshold fixed).
"""

from __future__ import annotations

import ctypes
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import psutil

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
    Afterwards the freed heap is trimmed and the thresholds left where glibc's adaptive ones
    settle for large tensors (mmap above 32 MiB, trim above 64 MiB): adaptation cannot be
    switched back on."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, 64 << 10)
    try:
        yield
    finally:
        _libc_trim()
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
        self.interval_s, self._proc, self._max = interval_s, psutil.Process(), 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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


class ProcessTreeSampler:
    """Peak RSS of this process (:class:`HostPeak`) and of the children started inside a ``with``
    block (their summed RSS, shared pages counted in each, sampled every ``interval`` s), and the
    tree's CPU time. A child's CPU time is its last sample: end the block while they live."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.me = psutil.Process()
        self.host = HostPeak()
        self.peak_main = self.peak_workers = 0
        self.wall = self.cpu_s = 0.0
        self._cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="feedpipe-sampler")

    def _sample(self) -> None:
        try:
            kids = self.me.children(recursive=True)
        except psutil.Error:
            return
        total = 0
        for k in kids:
            if k.pid in self._before:  # not started by the measured code
                continue
            try:
                with k.oneshot():
                    total += k.memory_info().rss
                    t = k.cpu_times()
                    self._cpu[k.pid] = t.user + t.system
            except psutil.Error:  # exited between listing and reading
                continue
        self.peak_workers = max(self.peak_workers, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "ProcessTreeSampler":
        t = self.me.cpu_times()
        self._cpu0, self._t0 = t.user + t.system, time.perf_counter()
        self._before = {k.pid for k in self.me.children(recursive=True)}
        self.host.reset()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sample()
        self._stop.set()
        self._thread.join()
        self.peak_main = self.host.peak()
        self.host.stop()
        self.wall = time.perf_counter() - self._t0
        t = self.me.cpu_times()
        self.cpu_s = t.user + t.system - self._cpu0 + sum(self._cpu.values())
