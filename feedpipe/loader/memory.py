"""The torch backend's batch memory, in one place: how many batches its slot ring holds, their
bytes, and whether /dev/shm has room for them. The backend (``loader.torch.backend.SlotRing``),
``feedpipe doctor`` (/dev/shm) and the tuners (RAM budget) all ask here, so their figures agree
by construction. torch-free: tools import it without starting torch."""

from __future__ import annotations

import shutil
from typing import Any, Mapping

import numpy as np

#: /dev/shm must hold this many times the slot ring before the ring is used
SHM_HEADROOM = 2
#: the least /dev/shm ``feedpipe doctor`` asks for, ring or not (DataLoader's own queues use it)
SHM_FLOOR = 1 << 30
SHM_PATH = "/dev/shm"

Shapes = Mapping[str, "tuple[tuple[int, ...], Any]"]  # dtype: numpy's, or torch's


#: finished batches the feed engine keeps ready ahead of the training step (loader/position.py)
FEED_DEPTH = 2


def ring_slots(workers: int, prefetch: int) -> int:
    """Batches in the slot ring: those ``workers`` keep ``prefetch`` deep, those the feed engine
    keeps ready, plus the one it is finishing and the one in use (in-process: the same without
    workers)."""
    return workers * prefetch + FEED_DEPTH + 2


def itemsize(dtype: object) -> int:
    """Bytes per element of a numpy dtype (or type), or of a torch dtype (torch-free)."""
    size = getattr(dtype, "itemsize", None)
    return size if isinstance(size, int) else np.dtype(dtype).itemsize  # type: ignore[call-overload]


def batch_bytes(shapes: Shapes) -> int:
    """Bytes of one batch whose stacked columns have these (shape, dtype)s."""
    return sum(int(np.prod(s)) * itemsize(d) for s, d in shapes.values())


def ring_bytes(batch: int, workers: int, prefetch: int) -> int:
    """Bytes of the ring of batches of ``batch`` bytes each a loader with ``workers`` and
    ``prefetch`` keeps."""
    return batch * ring_slots(workers, prefetch)


def held_bytes(batch: int, workers: int, prefetch: int) -> int:
    """Host bytes of batches a loader holds at once: its ring, with or without workers (worker
    processes' own memory, interpreter and decoder, is not counted)."""
    return ring_bytes(batch, workers, prefetch)


def shm_free(path: str = SHM_PATH) -> int | None:
    """Free bytes of /dev/shm (None: there is none, or it cannot be read)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def shm_wanted(ring: int) -> int:
    """The /dev/shm free bytes a ring of ``ring`` bytes wants: its headroom."""
    return SHM_HEADROOM * ring


def shm_fits(ring: int, free: int | None) -> bool:
    """Whether /dev/shm with ``free`` bytes holds a ring of ``ring`` bytes with its headroom."""
    return free is not None and free >= shm_wanted(ring)


def size_text(n: int) -> str:
    """Bytes for a message: MiB from 1 MiB up, KiB below (a small ring is not '0 MiB')."""
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n / 1024:,.1f} KiB"
