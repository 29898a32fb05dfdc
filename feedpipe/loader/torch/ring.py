"""The torch backend's output ring: the batch buffers workers fill and the main process recycles.

One owner for a slot's life: :class:`SlotRing` hands slot numbers to the sampler's requests
(``acquire``), turns a worker's :class:`~feedpipe.loader.dataset.SlotRef` back into the slot's
rows (``resolve``), and takes the slot back when the device stage is done (``settle``), at once or
once the caller lets go of a lent batch (``reclaim``). Its sizes and the /dev/shm check come from
:mod:`feedpipe.loader.memory`, which ``feedpipe doctor`` and the tuners share.
"""

from __future__ import annotations

import logging
import sys
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
_LEND_MIN_BYTES = 1 << 12  # smaller ring columns are copied out, so keeping them pins no slot


def _use_count(t: torch.Tensor) -> int:
    """References to ``t``'s storage in this process: tensors, views and numpy arrays over it
    (torch's count), plus Python references to its ``untyped_storage()`` object, which torch's
    count leaves out (a caller may keep only the storage)."""
    storage = t.untyped_storage()
    return _STORAGE_USE_COUNT(storage._cdata) + sys.getrefcount(storage)


# torch's own storage reference count (torch._C); without it slots are never lent, only copied
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


class SlotRing:
    """Output buffers that workers (or, without workers, the main process on CPU) fill and the
    main process recycles.

    A fresh shared-memory segment per batch costs page faults for every batch, a noticeable share
    of a worker's time (benchmarks/RESULTS.md); reusing a small ring removes that. The main
    process owns the ring: the sampler hands a free slot to each request, and the device stage
    either releases it once the batch has been copied out (pinned/device memory, or a converted
    tensor), or *lends* it: the batch handed to the caller is the slot itself (no copy), and the
    slot returns to the ring only once nothing in this process refers to it any more (its storage's
    reference count is back to the ring's own), so a batch the caller keeps is never overwritten.
    Each slot has its own storage so that count is per slot. ``shared=False`` (in-process
    loading): plain memory, the same reuse. A fresh batch there costs page-fault system time per
    image: little of the decode-bound loader, more of decode-free raw data
    (benchmarks/RESULTS.md).
    """

    def __init__(self, shapes: Shapes, count: int, *,
                 shared: bool = True) -> None:
        self.count = count
        self.tensors = {name: [_buffer(shape, dtype, shared) for _ in range(count)]
                        for name, (shape, dtype) in shapes.items()}
        self._free: deque[int] = deque(range(count))
        self._lent: list[int] = []
        self._base = [self._refs(i) for i in range(count)]

    @classmethod
    def for_loader(cls, shapes: Shapes, workers: int, prefetch: int) -> SlotRing | None:
        """The ring for a loader whose batches stack ``shapes``: shared memory with workers
        (None, with a warning, when /dev/shm lacks the headroom: each batch then gets fresh
        shared memory), plain memory without (None where slots cannot be lent). No stacked
        column: nothing to ring (None, no warning)."""
        if not shapes:
            return None
        if not workers:
            return cls(shapes, ring_slots(0, 0), shared=False) if cls.can_lend() else None
        need, free = ring_bytes(batch_bytes(shapes), workers, prefetch), shm_free()
        if not shm_fits(need, free):
            log.warning("not enough shared memory for a %s batch ring (/dev/shm has %s free, "
                        "the ring wants %s); each batch gets fresh shared memory instead. In a "
                        "container, give /dev/shm more room: docs/containers.md",
                        size_text(need), "no" if free is None else size_text(free),
                        size_text(shm_wanted(need)))
            return None
        return cls(shapes, ring_slots(workers, prefetch))

    @property
    def nbytes(self) -> int:
        """Bytes the ring holds (memory.ring_bytes of its batches)."""
        return self.count * batch_bytes(
            {k: (tuple(v[0].shape), v[0].numpy().dtype) for k, v in self.tensors.items()})

    @staticmethod
    def can_lend() -> bool:
        return _STORAGE_USE_COUNT is not None

    def _refs(self, slot: int) -> int:
        return sum(_use_count(t[slot]) for t in self.tensors.values()) \
            if self.can_lend() else 0

    def acquire(self) -> int:
        """A free slot, or -1 when all are in flight (the worker then allocates a fresh buffer)."""
        return self._free.popleft() if self._free else -1

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def lend(self, slot: int) -> None:
        """The slot's tensors were handed to the caller; :meth:`reclaim` takes it back later."""
        self._lent.append(slot)

    def reclaim(self) -> None:
        """Return the lent slots nothing refers to any more (the caller let go of the batch)."""
        if self._lent:
            kept = [s for s in self._lent if self._refs(s) > self._base[s]]
            self._free.extend(s for s in self._lent if s not in kept)
            self._lent = kept

    def reset(self) -> None:
        """Start of an iteration: nothing from an abandoned one is in flight any more (slots the
        caller still holds stay lent)."""
        self.reclaim()
        self._free = deque(s for s in range(self.count) if s not in self._lent)

    def resolve(self, batch: dict[str, Any]) -> None:
        """A batch from a worker names its slot by :class:`SlotRef`s: put the slot's rows in
        their place and the slot number under :data:`SLOT_KEY` (the device stage settles it)."""
        for k, v in list(batch.items()):
            if isinstance(v, SlotRef):
                batch[k] = self.tensors[k][v.index][: v.rows]
                batch[SLOT_KEY] = v.index

    def settle(self, slot: int, lent: bool) -> None:
        """The device stage is done with ``slot``: handed out as it is (lent) or copied out."""
        self.lend(slot) if lent else self.release(slot)


def _buffer(shape: tuple[int, ...], dtype: np.dtype, shared: bool) -> torch.Tensor:
    t = torch.from_numpy(np.empty(shape, dtype))
    return t.share_memory_() if shared else t
