"""The torch backend: DataLoader worker processes fill a ring of batch slots, and the feed
engine's thread finishes each batch on the device (:mod:`feedpipe.loader.position`).

Per batch, in the feed thread: the worker's batch arrives as slot numbers; on CUDA the slot is
copied to the device with ``non_blocking=True`` on a side stream (the ring is page-locked in
place, so the copy is a DMA), converted there (normalize, dtype, channels-last, the batch
operations), and an event is recorded; the slot goes back to the ring once the copy's event has
passed. On a CPU device the workers convert their own batches into the slots (the conversion is
:mod:`~feedpipe.loader.torch.convert`, the same code), and the batch handed out is the slot
itself, lent until the caller lets go of it. JPEGs left encoded for nvJPEG are decoded here too
(:mod:`~feedpipe.loader.torch.device_decode`).
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
import weakref
from collections import deque
from dataclasses import replace
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from ...dataset.registry import DatasetReader
from ...errors import ConfigError, LoaderError
from ...schema.masks import ignore_index_of
from ...workers import single_threaded
from ..config import LoaderConfig
from ..dataset import FALLBACK_KEY, SKIPPED_KEY, BatchDataset, SlotRef, raise_carried
from ..labels import RaggedList
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
from ..position import INDEX_KEY, VALID_KEY, EpochPosition, FeedEngine, Position, Ready
from ..protocol import LoaderView
from ..sampler import BatchRequest, PlanSampler, World
from ..transforms import ImageOp
from .convert import Conversion, layout
from .device_decode import DeviceDecoder, EncodedBatch

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

    A slot's life: the request stream takes a free slot for each batch it asks a worker for
    (:meth:`acquire`); the worker writes the batch into it and names it by
    :class:`~feedpipe.loader.dataset.SlotRef` (:meth:`resolve`); the feed thread gives it back
    (:meth:`release`) once its copy to the device has completed (:meth:`release_after`), or lends
    it: the batch the caller gets is the slot itself, back in the ring once nothing refers to it.
    Sizes and the /dev/shm check come from :mod:`feedpipe.loader.memory`.
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



def _worker_init(_: int) -> None:
    """DataLoader ``worker_init_fn``: :func:`feedpipe.workers.single_threaded`."""
    single_threaded()


def _identity(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


class Requests:
    """The DataLoader's batch sampler: this rank's batches from a position on, endlessly across
    epochs (each epoch's plan in turn), each with a free ring slot to be written into. It runs in
    the feed thread, inside the DataLoader iterator; ``sent`` is what it asked for, in order, so
    the batches coming back are known by position."""

    def __init__(self, planner: PlanSampler, rank: int, ring: SlotRing | None) -> None:
        self.planner, self.rank, self.ring = planner, rank, ring
        self.at = (0, 0)
        self.sent: deque[tuple[int, int]] = deque()

    def __iter__(self) -> Iterator[BatchRequest]:
        epoch, start = self.at
        self.sent.clear()  # (a DataLoader reset has drained what the last stream asked for)
        if self.ring is not None:
            self.ring.reset()
        ahead = self.planner.reader.plan_ahead  # remote shards: prefetch in plan order
        while True:
            plan = self.planner.plan(epoch)
            if not plan:
                return  # an epoch with nothing for this rank: the stream waits to be reopened
            for number in range(start, len(plan)):
                ahead(plan, number)
                slot = self.ring.acquire() if self.ring is not None else -1
                self.sent.append((epoch, number))
                yield BatchRequest(plan[number], epoch, number, self.rank, slot)
            epoch, start = epoch + 1, 0


class DeviceStage:
    """Finishes a worker's batch in the feed thread: slots resolved, tensors on the device,
    encoded JPEGs decoded, what the workers did not convert converted, ``uneven="mask"``'s
    fields added; then the slot is given back (after its copy, or once the caller lets go)."""

    def __init__(self, cfg: LoaderConfig, device: torch.device, planner: PlanSampler,
                 rank: int, conversion: Conversion | None, ring: SlotRing | None,
                 decoder: DeviceDecoder | None, size: tuple[int, int] | None,
                 converted: tuple[str, ...] = ()) -> None:
        self.device, self.planner, self.rank = device, planner, rank
        conversion = conversion.to(device) if conversion is not None else None
        # images the workers converted into their slots, stored as Conversion.output lays out
        self.converted, self.channels_last = converted, cfg.output.channels_last
        self.conversion, self.ring, self.decoder, self.size = conversion, ring, decoder, size
        self.mask = cfg.sampler.uneven == "mask"
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._slot_storage = [] if ring is None else [
            {t[i].untyped_storage().data_ptr() for t in ring.tensors.values()}
            for i in range(ring.count)]
        if ring is not None and self.side is not None and cfg.workers.pin_memory:
            why = ring.register()
            if why is not None:
                log.warning("feedpipe loader: the batch ring could not be page-locked in place "
                            "(%s); the feed thread copies each batch into pinned memory first "
                            "instead (raise the locked-memory limit, `ulimit -l`, to avoid it)",
                            why)
        self.pinned = bool(cfg.workers.pin_memory)

    @torch.no_grad()
    def finish(self, batch: dict[str, Any], epoch: int, number: int,
               following: Position) -> Ready:
        """The batch as the caller gets it, and what the caller's thread still waits on; a
        worker's error it carries is raised (whole: key, file, cause; the engine hands it to the
        caller's thread)."""
        raise_carried(batch)
        skipped = batch.pop(SKIPPED_KEY, None)
        fallbacks = batch.pop(FALLBACK_KEY, None)
        notes = (skipped or [], fallbacks or []) if skipped or fallbacks else None
        slot = self.ring.resolve(batch) if self.ring is not None else -1
        if slot >= 0:
            for k in self.converted:
                batch[k] = layout(batch[k], self.channels_last)
        if self.side is None:
            out = self._on_cpu(batch, slot, epoch, number)
            return Ready(following, out, notes=notes)
        with torch.cuda.stream(self.side):
            out = self._to_device(batch, slot)
            if self.conversion is not None:
                out = self.conversion(out, epoch, self.rank, number)
            self._mask(out, epoch, number)
            event = torch.cuda.Event()
            event.record(self.side)
        tensors = tuple(t for v in out.values()
                        for t in (v if isinstance(v, list) else (v,))
                        if isinstance(t, torch.Tensor) and t.is_cuda)
        return Ready(following, out, event, tensors, notes)

    def _on_cpu(self, batch: dict[str, Any], slot: int, epoch: int,
                number: int) -> dict[str, Any]:
        out = {k: self._decoded(v) for k, v in batch.items()}
        if self.conversion is not None:
            out = self.conversion(out, epoch, self.rank, number)
        self._mask(out, epoch, number)
        if slot >= 0:  # lend the slot where the batch is the slot itself; copy out small columns
            held = self._slot_storage[slot]
            lend = False
            for k, v in out.items():
                if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in held:
                    if v.nbytes >= LEND_MIN_BYTES and self.ring.can_lend():  # type: ignore[union-attr]
                        lend = True
                    else:
                        out[k] = v.clone()
            self.ring.lend(slot) if lend else self.ring.release(slot)  # type: ignore[union-attr]
        return out

    def _decoded(self, v: Any) -> Any:
        if isinstance(v, EncodedBatch):
            return self.decoder(v, self.size)  # type: ignore[misc,arg-type]
        if isinstance(v, RaggedList):  # ragged="list": per-sample views of one tensor
            return v.split(self.device)
        return v

    def _to_device(self, batch: dict[str, Any], slot: int) -> dict[str, Any]:
        """Every tensor of ``batch`` on the device, copied on the side stream; a ring slot from
        its page-locked pages (else through a pinned staging copy, made here, never in the
        training thread); the slot goes back once its copy has passed."""
        out = {}
        direct = slot >= 0 and self.ring.registered  # type: ignore[union-attr]
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):  # (torch's pinned allocator keeps a staging
                # buffer until the copy that reads it has passed)
                v = (v if direct or not self.pinned else v.pin_memory()).to(self.device,
                                                                             non_blocking=True)
            else:
                v = self._decoded(v)
            out[k] = v
        if slot >= 0:
            copied = torch.cuda.Event()
            copied.record(self.side)
            if direct:
                self.ring.release_after(slot, copied)  # type: ignore[union-attr]
            else:  # the staging copy has read it already
                self.ring.release(slot)  # type: ignore[union-attr]
        return out

    def _mask(self, out: dict[str, Any], epoch: int, number: int) -> None:
        """``uneven="mask"``: ``valid`` (a real sample, not padding) and ``index`` (its sample)."""
        if self.mask:
            indices = self.planner.plan(epoch)[number]
            real = self.planner.real(epoch, number)
            out[VALID_KEY] = (torch.arange(len(indices)) < real).to(self.device)
            out[INDEX_KEY] = torch.from_numpy(indices).to(self.device)


class TorchStream:
    """The torch backend's decode stage for the feed engine: the DataLoader's workers fed an
    endless request stream, their batches finished by the :class:`DeviceStage`."""

    def __init__(self, dl: DataLoader, requests: Requests, stage: DeviceStage) -> None:
        self.dl, self.requests, self.stage = dl, requests, stage
        self._it: Any = None

    def open(self, at: Position) -> Iterator[Ready]:
        epoch, start, _ = at
        self.requests.at = (epoch, start)
        self._it = iter(self.dl)  # workers start once; later, a reset drains the last stream
        return self._ready(self._it)

    def _ready(self, it: Any) -> Iterator[Ready]:
        sent, planner, stage = self.requests.sent, self.requests.planner, self.stage
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except RuntimeError as exc:  # DataLoader(timeout=): Workers(batch_timeout=)
                if not self.dl.timeout or "timed out" not in str(exc):
                    raise
                raise LoaderError(f"{self.describe(sent[0])} took more than "
                                  f"{self.dl.timeout:g} s in a worker (Workers(batch_timeout=)): "
                                  "a transform= that never returns, a stalled read; the "
                                  "workers were stopped") from exc
            epoch, number = sent.popleft()
            following = (epoch, number + 1, planner.segment(epoch)) \
                if number + 1 < len(planner.plan(epoch)) \
                else (epoch + 1, 0, planner.segment(epoch + 1))
            yield stage.finish(batch, epoch, number, following)

    def describe(self, at: tuple[Any, ...]) -> str:
        """Batch ``number`` of ``epoch`` for a message: its first samples' keys."""
        epoch, number = at[0], at[1]
        plan = self.requests.planner.plan(epoch)
        if number >= len(plan):
            return f"batch {number} of epoch {epoch}"
        reader = self.requests.planner.reader
        keys = [reader.key_of(int(i)) for i in plan[number][:6]]
        more = f" and {len(plan[number]) - 6} more" if len(plan[number]) > 6 else ""
        return f"batch {number} of epoch {epoch} of {reader.root} (samples " \
               f"{', '.join(map(str, keys))}{more})"

    def abort(self) -> None:
        """Stop the workers of an iteration that raised (a worker's error, Ctrl-C) now, in this
        process: persistent workers start afresh with the next stream."""
        it, self._it = self._it, None
        stop = getattr(it, "_shutdown_workers", None)  # torch's multi-process iterator only
        if stop is not None:
            stop()
        if getattr(self.dl, "_iterator", None) is it:
            self.dl._iterator = None
        if self.stage.ring is not None:  # nothing is in flight to a worker any more
            self.stage.ring.reset()

    def close(self) -> None:
        self.abort()
        if self.stage.ring is not None:
            self.stage.ring.unregister()


class TorchLoader(EpochPosition):
    """What ``make_loader`` returns for the torch backend: iterate it once per epoch (a
    :class:`~feedpipe.loader.protocol.Loader`)."""

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World,
                 device: torch.device, decoder: DeviceDecoder | None = None) -> None:
        fields = cfg.fields_in(reader.schema)
        if not fields:
            raise ConfigError(f"{reader.root}: no 'image' or 'label' field; pass fields=[...] "
                              f"from {reader.schema.names}", option="fields")
        self.reader, self.config, self.world, self.device = reader, cfg, world, device
        images = tuple(f for f in fields  # (an unknown name: BatchDataset names it)
                       if f in reader.schema and reader.schema[f].kind == "image")
        self.batch_dataset = BatchDataset(
            reader, fields, ImageOp.of(cfg), seed=cfg.seed, on_error=cfg.workers.on_error,
            encoded_images=decoder is not None, max_pixels=cfg.workers.max_pixels,
            ragged=cfg.output.ragged,
            min_box_fraction=cfg.output.min_box_fraction, transform=cfg.transform)
        cols = self.batch_dataset.columns
        floats = tuple(c.field.name for c in cols if c.field.kind == "target"
                       and c.dtype is not None and c.dtype.kind == "f")
        conversion = Conversion.of(cfg, images, floats, [c.field for c in cols])
        self.planner = PlanSampler(reader, cfg, world)
        self._surface()
        size = cfg.size
        if decoder is not None:
            decoder.describe = reader.describe
            size = size or next(tuple(c.field.shape[:2]) for c in cols if c.field.kind == "image")
        # the workers (or, in-process, the feed thread running the dataset) convert the images
        # into the slots on a CPU device; the feed thread converts the rest, and everything on
        # CUDA (after the copy: a quarter of the bytes cross as uint8)
        in_workers = device.type == "cpu" and decoder is None and conversion.image_only \
            and conversion.changes_images
        self.ring: SlotRing | None = None
        workers = int(cfg.num_workers)  # type: ignore[arg-type]
        if workers or device.type == "cpu":  # in-process on CPU: lent plain memory
            prefetch = int(cfg.workers.prefetch_factor or 0)
            self.ring = SlotRing.for_loader(self._ring_shapes(conversion if in_workers else None),
                                            workers, prefetch, warn=not in_workers)
            if self.ring is None and in_workers and workers:
                # no room in /dev/shm for slots of float images: uint8 slots (a quarter of the
                # bytes, and so of any fresh shared memory), converted in the feed thread
                in_workers = False
                self.ring = SlotRing.for_loader(self._ring_shapes(None), workers, prefetch)
            if self.ring is not None:
                self.batch_dataset.slots = self.ring.tensors
        if in_workers:
            self.batch_dataset.convert = replace(conversion, floats=())
            conversion = replace(conversion, images=(), ops=None)
        self._requests = Requests(self.planner, world.rank, self.ring)
        kwargs: dict[str, Any] = {}
        if workers:
            kwargs = dict(prefetch_factor=cfg.workers.prefetch_factor, persistent_workers=True,
                          multiprocessing_context=cfg.workers.multiprocessing_context,
                          timeout=cfg.workers.batch_timeout or 0)
        # its own generator: a DataLoader iterator draws a seed when it starts, which from the
        # global one would shift the caller's random stream at moments of the feed thread's
        dl = DataLoader(self.batch_dataset, batch_sampler=self._requests, num_workers=workers,
                        collate_fn=_identity, worker_init_fn=_worker_init,
                        generator=torch.Generator().manual_seed(cfg.seed), **kwargs)
        self.stage = DeviceStage(cfg, device, self.planner, world.rank,
                                 conversion if conversion.images or conversion.floats
                                 or conversion.ops else None, self.ring, decoder, size,
                                 images if in_workers else ())
        self.engine = FeedEngine(TorchStream(dl, self._requests, self.stage),
                                 f"feedpipe-feed-{reader.root.name}")
        weakref.finalize(self, self.engine.close)
        self._epoch = 0
        self._consumed = 0
        self._skipped_before = 0
        self.skipped: list[str] = []
        self.decoder_fallbacks: list[str] = []  # records whose JPEG only Pillow could decode
        self.classes: tuple[str, ...] = reader.classes
        self.ignore_index: int | None = ignore_index_of(reader.schema)

    def describe(self) -> LoaderView:
        """The resolved settings (see :class:`~feedpipe.loader.protocol.LoaderView`)."""
        cfg, image = self.config, next((c.field for c in self.batch_dataset.columns
                                     if c.field.kind == "image"), None)
        workers = int(cfg.num_workers)  # type: ignore[arg-type]
        return LoaderView(
            backend="torch", root=str(self.reader.root), format=self.reader.format_name,
            codec=getattr(image, "codec", None), num_samples=len(self.reader),
            batch_size=cfg.batch_size, num_workers=workers,
            prefetch_factor=cfg.workers.prefetch_factor if workers  # type: ignore[arg-type]
            else None,
            pin_memory=bool(cfg.workers.pin_memory) and self.device.type == "cuda",
            device=self.device.type, decode_threads=0,
            size=cfg.size or (tuple(image.shape[:2]) if image is not None and image.shape
                              and None not in image.shape[:2] else None),
            sample_bytes=batch_bytes(self._ring_shapes()) // cfg.batch_size)

    def _ring_shapes(self, conversion: Conversion | None = None
                     ) -> dict[str, tuple[tuple[int, ...], Any]]:
        """A slot's tensors: every stacked column, labels included, so that a batch from a
        worker crosses as slot numbers only; images in the output's dtype and layout where the
        workers convert them (``conversion``; default: as this loader's workers do)."""
        conv, b = conversion or self.batch_dataset.convert, self.config.batch_size
        shapes = {}
        for c in self.batch_dataset.columns:
            if c.shape is None or c.dtype is None:
                continue
            shape, dtype = (b, *c.shape), c.dtype
            if conv is not None and c.field.name in conv.images:
                shape, dtype = conv.output(shape)  # type: ignore[arg-type,assignment]
            shapes[c.field.name] = (shape, dtype)
        return shapes

    def _note(self, notes: tuple[list[str], list[str]]) -> None:
        skipped, fallbacks = notes
        self.skipped.extend(skipped)
        self.decoder_fallbacks.extend(fallbacks)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One epoch from its first batch (or, once, from where ``load_state_dict`` says)."""
        self._skipped_before = len(self.skipped)
        return super().__iter__()

    def _epoch_done(self, epoch: int) -> None:
        n = len(self.skipped) - self._skipped_before
        if n:
            warnings.warn(f"{self.reader.root}: skipped {n} corrupt record(s) in epoch "
                          f"{epoch} (on_error='skip'); first: {self.skipped[self._skipped_before]}",
                          stacklevel=4)
