"""The torch backend's output ring: the batch buffers workers fill, allocated once.

A slot's life: the feed thread's request stream takes a free slot for each batch it asks a worker
for (:meth:`SlotRing.acquire`); the worker writes the batch into it and names it by
:class:`~feedpipe.loader.dataset.SlotRef` (:meth:`SlotRing.resolve` turns that back into the
slot's rows); the feed thread then gives it back (:meth:`SlotRing.release`) once its copy to the
device has completed (a CUDA event, :meth:`SlotRing.release_after`), or *lends* it: the batch the
caller gets is the slot itself (no copy), and it returns to the ring once nothing in this process
refers to it. The slots are registered with CUDA once (page-locked in place, so a copy from one
is a DMA with no staging). Its sizes and the /dev/shm check come from
:mod:`feedpipe.loader.memory`, which ``feedpipe doctor`` and the tuners share.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from typing import Any

import numpy as np
import torch

from ..dataset import SlotRef
from ..memory import (
    Shapes,
    batch_bytes,
    ring_bytes,
    ring_slots,
    shm_fits,
    shm_free,
    shm_wanted,
    size_text,
)

log = logging.getLogger("feedpipe.loader")

SLOT_KEY = "_feedpipe_slot"
LEND_MIN_BYTES = 1 << 12  # smaller ring columns are copied out, so keeping them pins no slot
SHM_DOCS = "docs/containers.md"  # where a too-small /dev/shm is explained (Docker, Kubernetes)


def _use_count(t: torch.Tensor) -> int:
    """References to ``t``'s storage in this process: tensors, views and numpy arrays over it
    (torch's count), plus Python references to its ``untyped_storage()`` object, which torch's
    count leaves out (a caller may keep only the storage)."""
    storage = t.untyped_storage()
    return _STORAGE_USE_COUNT(storage._cdata) + sys.getrefcount(storage)


# torch's own storage reference count (torch._C); without it slots are never lent, only copied
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


class SlotRing:
    """Output buffers that workers (or, without workers, the feed thread) fill and the feed thread
    recycles.

    A fresh shared-memory segment per batch costs page faults for every batch, a noticeable share
    of a worker's time (benchmarks/RESULTS.md); reusing a small ring removes that. Each slot has
    its own storage, so a lent slot's reference count is its own. ``shared=False`` (in-process
    loading): plain memory, the same reuse. Thread-safe: the feed thread and the caller's thread
    (which lets go of lent batches) both reach it.
    """

    def __init__(self, shapes: Shapes, count: int, *, shared: bool = True) -> None:
        self.count = count
        self.tensors = {name: [_buffer(shape, dtype, shared) for _ in range(count)]
                        for name, (shape, dtype) in shapes.items()}
        self._lock = threading.Lock()
        self._free: deque[int] = deque(range(count))
        self._lent: list[int] = []
        self._copying: deque[tuple[int, Any]] = deque()  # (slot, its device copy's event)
        self._base = [self._refs(i) for i in range(count)]
        self._registered: list[int] = []  # data pointers page-locked with cudaHostRegister

    @classmethod
    def for_loader(cls, shapes: Shapes, workers: int, prefetch: int,
                   warn: bool = True) -> SlotRing | None:
        """The ring for a loader whose batches stack ``shapes``: shared memory with workers
        (None, with a warning, when /dev/shm lacks the headroom: each batch then gets fresh
        shared memory; ``warn`` False: a caller with a smaller ring to try next says nothing),
        plain memory without (None where slots cannot be lent). No stacked column: nothing to
        ring (None, no warning)."""
        if not shapes:
            return None
        if not workers:
            return cls(shapes, ring_slots(0, 0), shared=False) if cls.can_lend() else None
        need, free = ring_bytes(batch_bytes(shapes), workers, prefetch), shm_free()
        if not shm_fits(need, free):
            say = log.warning if warn else log.debug
            say("not enough shared memory for a %s batch ring (/dev/shm has %s free, the ring "
                "wants %s); each batch gets fresh shared memory instead, which is slower. In a "
                "container, give /dev/shm more room: %s", size_text(need),
                "no" if free is None else size_text(free), size_text(shm_wanted(need)), SHM_DOCS)
            return None
        return cls(shapes, ring_slots(workers, prefetch))

    @property
    def nbytes(self) -> int:
        """Bytes the ring holds (memory.ring_bytes of its batches)."""
        return self.count * sum(v[0].nbytes for v in self.tensors.values())

    @staticmethod
    def can_lend() -> bool:
        return _STORAGE_USE_COUNT is not None

    def _refs(self, slot: int) -> int:
        return sum(_use_count(t[slot]) for t in self.tensors.values()) \
            if self.can_lend() else 0

    def acquire(self) -> int:
        """A free slot, or -1 when all are in flight or lent (the worker then allocates a fresh
        buffer). A slot whose device copy is still running is waited for: it is done in
        microseconds, and a fresh buffer would cost page faults and an unpinned copy."""
        with self._lock:
            if not self._free:
                self._settle_copies(wait=bool(self._copying))
            if not self._free and self._lent:
                self._reclaim()
            return self._free.popleft() if self._free else -1

    def release(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)

    def release_after(self, slot: int, event: Any) -> None:
        """Give ``slot`` back once ``event`` (recorded after its device copy) has completed."""
        with self._lock:
            self._copying.append((slot, event))
            self._settle_copies(wait=False)

    def lend(self, slot: int) -> None:
        """The slot's tensors were handed to the caller; it comes back once they are let go."""
        with self._lock:
            self._lent.append(slot)

    def reclaim(self) -> None:
        """Take back the lent slots nothing refers to any more (the caller let go of them)."""
        with self._lock:
            self._reclaim()

    def reset(self) -> None:
        """A new stream of requests: nothing of an abandoned one is in flight any more (slots the
        caller still holds stay lent; copies still running finish first)."""
        with self._lock:
            self._settle_copies(wait=True)
            self._reclaim()
            self._free = deque(s for s in range(self.count) if s not in self._lent)

    def resolve(self, batch: dict[str, Any]) -> int:
        """A batch from a worker names its slot by :class:`SlotRef`s: put the slot's rows in
        their place; returns the slot number (-1: none)."""
        slot = -1
        for k, v in list(batch.items()):
            if isinstance(v, SlotRef):
                batch[k] = self.tensors[k][v.index][: v.rows]
                slot = v.index
        return slot

    def _reclaim(self) -> None:
        if self._lent:
            kept = [s for s in self._lent if self._refs(s) > self._base[s]]
            self._free.extend(s for s in self._lent if s not in kept)
            self._lent = kept

    def _settle_copies(self, wait: bool) -> None:
        """Free the slots whose copies are done; ``wait``: at least the oldest one."""
        while self._copying:
            slot, event = self._copying[0]
            if not event.query():
                if not wait:
                    return
                event.synchronize()
            wait = False
            self._copying.popleft()
            self._free.append(slot)

    # -- page-locking for CUDA --------------------------------------------------------------------
    def register(self) -> str | None:
        """Page-lock every slot in place (``cudaHostRegister``), so copies from a slot are DMAs
        with no staging copy; each slot's pages are touched first (faulted in once, here, not
        during the first copies). Returns None, or why it could not (then nothing stays
        registered: a container's locked-memory limit, ``ulimit -l``)."""
        cudart = torch.cuda.cudart()
        for ts in self.tensors.values():
            for t in ts:
                storage = t.untyped_storage()
                ptr, size = storage.data_ptr(), storage.nbytes()
                if not size:
                    continue
                t.zero_()
                err = cudart.cudaHostRegister(ptr, size, 0)
                if int(err) != 0:
                    self.unregister()
                    return f"cudaHostRegister of {size_text(size)} failed with CUDA error " \
                           f"{int(err)} ({cudart.cudaGetErrorString(err)})"
                self._registered.append(ptr)
        return None

    @property
    def registered(self) -> bool:
        return bool(self._registered)

    def unregister(self) -> None:
        """Undo :meth:`register` (before the slots' memory is freed)."""
        if self._registered:
            cudart = torch.cuda.cudart()
            for ptr in self._registered:
                cudart.cudaHostUnregister(ptr)
            self._registered = []

    def __del__(self) -> None:
        if self._registered:
            self.unregister()


def _buffer(shape: tuple[int, ...], dtype: np.dtype | torch.dtype, shared: bool) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype) if isinstance(dtype, torch.dtype) \
        else torch.from_numpy(np.empty(shape, dtype))
    return t.share_memory_() if shared else t
