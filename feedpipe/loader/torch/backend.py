"""The torch backend: a tuned DataLoader plus a device stage that prefetches on a side CUDA stream.

Workers produce uint8 NHWC batches; the main process pins them (DataLoader's pin thread), copies
them with ``non_blocking=True`` on a side stream one batch ahead, and converts / normalizes /
lays out on the device. On CPU the same code runs without streams.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from ...dataset.registry import DatasetReader
from ...errors import ConfigError
from ...schema.masks import ignore_index_of
from ...workers import single_threaded
from ..augment import batch_ops
from ..config import LoaderConfig
from ..dataset import FALLBACK_KEY, SKIPPED_KEY, BatchDataset, raise_carried
from ..labels import RaggedList
from ..order import batch_seed
from ..position import EpochPosition, refuse_nested_workers
from ..protocol import LoaderView
from ..sampler import PlanSampler, World
from ..transforms import ImageOp
from . import cpu_convert
from .device_decode import DeviceDecoder, EncodedBatch
from .ring import _LEND_MIN_BYTES, SLOT_KEY, SlotRing
from .worker_ops import WorkerOps, normalize, unit_mean_std

log = logging.getLogger("feedpipe.loader")


def _worker_init(_: int) -> None:
    """DataLoader ``worker_init_fn``: :func:`feedpipe.workers.single_threaded`."""
    single_threaded()


def _identity(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


class DeviceStage:
    """Moves uint8 batches to the device and converts them there; one batch ahead on CUDA."""

    def __init__(self, cfg: LoaderConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.image_fields: tuple[str, ...] = ()
        self.float_fields: tuple[str, ...] = ()  # targets resampled as values: float32 out
        self.ring: SlotRing | None = None  # set when batches are filled into a ring of slots
        self.decoder: DeviceDecoder | None = None  # set when JPEGs are decoded on the device
        self.fallbacks: list[str] = []  # records whose JPEG only Pillow could decode
        self.size: tuple[int, int] | None = cfg.size
        self.dtype = getattr(torch, cfg.dtype)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.moves = device.type != "cpu"  # on CPU, ``.to(device)`` is a no-op call per field
        # with workers on a CPU device, conversions run on this thread only: the workers own
        # the cores, and torch's thread count is the user's (cpu_convert)
        self.one_thread = device.type == "cpu" and bool(cfg.num_workers)
        self._mean = self._std = None
        # (mean, 1/std) in [0, 1] units: the batch operations' images are normalized as they are
        # (scaling them back to 0..255 first cost a pass over the batch)
        unit = unit_mean_std(cfg)
        self._unit = None if unit is None else (unit[0].to(device), unit[1].to(device))
        if cfg.mean is not None and cfg.dtype != "uint8":
            self._mean = torch.tensor(cfg.mean, device=device).mul(255).view(1, 3, 1, 1)
            self._std = torch.tensor(cfg.std, device=device).mul(255).reciprocal().view(1, 3, 1, 1)
        self._np_norm = (None, None) if self._mean is None or not self.one_thread else (
            self._mean.view(3).numpy(), self._std.view(3).numpy())  # type: ignore[union-attr]
        # batch operations (feedpipe.loader.augment) on images before normalization: uint8, or
        # float in [0, 1]; each batch draws from a generator seeded by (seed, epoch, rank, batch)
        self.batch_ops = batch_ops(cfg.batch_transforms)
        # the batch operations ran in the workers (worker_ops.WorkerOps): images arrive final
        self.in_workers = False
        self.at: tuple[int, int, int] = (0, 0, 0)  # (epoch, rank, batch) of the next batch

    def convert(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Copy (non_blocking from pinned memory) and convert one batch; runs on self.stream.

        Ring-slot tensors are copied out first into cached pinned memory for CUDA, so the slot is
        recycled at once. On CPU a conversion (normalizing, float targets) reads the slot directly
        and releases it; a field that needs no conversion is handed out *as the slot itself* (no
        copy): the slot goes back to the ring only once nothing refers to it (see SlotRing), so
        keeping batches is safe, and a caller that lets go of each batch gets the ring's speed.
        Float targets become float32; masks arrive as batched (uint8, or int32 for uint16
        masks: call ``.long()`` for ``cross_entropy``, as with DALI or torchvision).
        """
        slot = batch.pop(SLOT_KEY, -1)
        fallbacks = batch.pop(FALLBACK_KEY, None)
        if fallbacks:
            self.fallbacks.extend(fallbacks)
        ring = self.ring if slot >= 0 else None
        lend = False
        out = {}
        for k, v in batch.items():
            if isinstance(v, EncodedBatch):
                v = self._image(self.decoder(v, self.size))  # type: ignore[misc,arg-type]
            elif isinstance(v, RaggedList):  # ragged="list": per-sample views of one tensor
                v = v.split(self.device)
            elif isinstance(v, torch.Tensor):
                if ring is not None and k in ring.tensors:
                    if self.device.type == "cuda":
                        v = v.pin_memory()
                    elif not self._converts(k, v):
                        if ring.can_lend() and v.nbytes >= _LEND_MIN_BYTES:
                            lend = True
                        else:  # labels and other small columns: a copy costs less than a slot
                            v = v.clone()
                if self.moves:
                    v = v.to(self.device, non_blocking=True)
                if k in self.image_fields:
                    v = self._image(v)
                elif k in self.float_fields:
                    v = cpu_convert.to_float32(v) if self.one_thread else v.float()
            out[k] = v
        if ring is not None:
            ring.settle(slot, lend)
        return self._operate(out) if self.batch_ops is not None else out

    def begin(self, epoch: int, rank: int, start: int) -> None:
        """An iteration of ``epoch`` on ``rank`` starts at batch ``start``."""
        self.at = (epoch, rank, start)

    def _operate(self, out: dict[str, Any]) -> dict[str, Any]:
        """Run the batch operations on images in [0, 1] (or uint8), then normalize them."""
        epoch, rank, number = self.at
        self.at = (epoch, rank, number + 1)
        gen = torch.Generator().manual_seed(batch_seed(self.cfg.seed, epoch, rank, number))
        before = torch.get_num_threads()
        if self.one_thread:  # torch kernels here, while the workers own the cores
            torch.set_num_threads(1)
        try:
            out = self.batch_ops(out, gen)  # type: ignore[misc]
            for k in self.image_fields:
                out[k] = self._normalize(out[k])
        finally:
            if self.one_thread:
                torch.set_num_threads(before)
        return out

    def _converts(self, name: str, v: torch.Tensor) -> bool:
        """Whether converting ``name`` on this device already yields a new tensor."""
        if name in self.image_fields:
            return not self.in_workers and (self.cfg.dtype != "uint8" or not self.cfg.channels_last
                                            or self.batch_ops is not None)
        return name in self.float_fields and v.dtype != torch.float32

    def _image(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_workers:  # operated on and normalized: N×H×W×3 float32 seen as N×3×H×W
            return x.permute(0, 3, 1, 2)
        if self.batch_ops is not None:  # in [0, 1] (or uint8), normalized after the operations
            x = x.permute(0, 3, 1, 2)
            if self.cfg.dtype == "uint8":
                return x.clone(memory_format=torch.channels_last)
            if self.one_thread:  # one numpy pass (uint8 × float32(1/255)), the same values
                return cpu_convert.image(x.permute(0, 2, 3, 1), torch.float32, None, None, True)
            return x.float().mul_(1 / 255)
        if self.one_thread:
            return cpu_convert.image(x, self.dtype, *self._np_norm, self.cfg.channels_last)
        x = x.permute(0, 3, 1, 2)  # NHWC storage seen as NCHW: channels_last for free
        return self._normalize(x)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 (or float in [0, 1] after batch operations) N×C×H×W to the output dtype."""
        if x.is_floating_point() and self.batch_ops is not None:
            if self._unit is not None:
                x = self._per_channel(x, *self._unit)
            if self.dtype != torch.float32:
                x = x.to(self.dtype)
        elif self.cfg.dtype != "uint8":
            x = x.float()  # normalize in float32, then narrow: fp16/bf16 keep their precision
            if self._mean is not None:
                x = self._per_channel(x, self._mean, self._std)  # type: ignore[arg-type]
            else:
                x = x.mul_(1 / 255)
            if self.dtype != torch.float32:
                x = x.to(self.dtype)
        return x if self.cfg.channels_last else x.contiguous()

    _per_channel = staticmethod(normalize)

    def __call__(self, batches: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if self.stream is None:
            it = iter(batches)
            while True:
                if self.ring is not None:  # before the DataLoader asks the sampler for a slot
                    self.ring.reclaim()
                b = next(it, None)
                if b is None:
                    return
                yield self.convert(b)
        current = torch.cuda.current_stream(self.device)
        pending = None
        for b in batches:
            with torch.cuda.stream(self.stream):
                nxt = self.convert(b)
            if pending is not None:
                yield pending
            current.wait_stream(self.stream)
            for v in nxt.values():  # tensors made on the side stream are used on the current one
                if isinstance(v, torch.Tensor) and v.is_cuda:
                    v.record_stream(current)
            pending = nxt
        if pending is not None:
            yield pending


class TorchLoader(EpochPosition):
    """What ``make_loader`` returns for the torch backend: iterate it once per epoch (a
    :class:`~feedpipe.loader.protocol.Loader`)."""

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World,
                 device: torch.device, decoder: DeviceDecoder | None = None) -> None:
        fields = cfg.fields_in(reader.schema)
        if not fields:
            raise ConfigError(f"{reader.root}: no 'image' or 'label' field; pass fields=[...] "
                              f"from {reader.schema.names}", option="fields")
        self.reader, self.cfg, self.world, self.device = reader, cfg, world, device
        op = ImageOp.of(cfg)
        self.stage = DeviceStage(cfg, device)
        images = tuple(f for f in fields  # (an unknown name: BatchDataset names it)
                       if f in reader.schema and reader.schema[f].kind == "image")
        staged = None if decoder is not None else WorkerOps.of(cfg, self.stage.batch_ops, device,
                                                                images)
        if staged is not None:
            self.stage.batch_ops, self.stage.in_workers = None, True
        self.batch_dataset = BatchDataset(
            reader, fields, op, seed=cfg.seed, on_error=cfg.on_error,
            encoded_images=decoder is not None, max_pixels=cfg.max_pixels, ragged=cfg.ragged,
            min_box_fraction=cfg.min_box_fraction, transform=cfg.transform, batch_stage=staged)
        self.planner = PlanSampler(reader, cfg, world)
        self._surface()
        if decoder is not None:
            decoder.describe = reader.describe
            self.stage.decoder = decoder
            self.stage.size = self.stage.size or next(
                tuple(c.field.shape[:2]) for c in self.batch_dataset.columns
                if c.field.kind == "image")
        self.ring: SlotRing | None = None
        cols = self.batch_dataset.columns
        self.stage.image_fields = tuple(c.field.name for c in cols if c.field.kind == "image")
        self.stage.float_fields = tuple(c.field.name for c in cols if c.field.kind == "target"
                                        and c.dtype is not None and c.dtype.kind == "f")
        kwargs: dict[str, Any] = {}
        if cfg.num_workers:
            kwargs = dict(prefetch_factor=cfg.prefetch_factor,
                          persistent_workers=cfg.persistent_workers,
                          multiprocessing_context=cfg.multiprocessing_context)
        if cfg.num_workers or device.type == "cpu":  # in-process on CPU: lent plain memory
            ring = SlotRing.for_loader(self._ring_shapes(cfg), int(cfg.num_workers),
                                       int(cfg.prefetch_factor or 0))
            if ring is not None:
                self._use_ring(ring)
        self._dl = DataLoader(self.batch_dataset, batch_sampler=self.planner,
                              num_workers=cfg.num_workers, collate_fn=_identity,
                              pin_memory=bool(cfg.pin_memory) and device.type == "cuda",
                              worker_init_fn=_worker_init, **kwargs)
        self._epoch = 0
        self._consumed = 0
        self._skipped_before = 0
        self.skipped: list[str] = []
        self.classes: tuple[str, ...] = reader.classes
        self.ignore_index: int | None = ignore_index_of(reader.schema)

    def describe(self) -> LoaderView:
        """The resolved settings (see :class:`~feedpipe.loader.protocol.LoaderView`)."""
        cfg, image = self.cfg, next((c.field for c in self.batch_dataset.columns
                                     if c.field.kind == "image"), None)
        workers = int(cfg.num_workers)  # type: ignore[arg-type]
        return LoaderView(
            backend="torch", root=str(self.reader.root), format=self.reader.format_name,
            codec=getattr(image, "codec", None), num_samples=len(self.reader),
            batch_size=cfg.batch_size, num_workers=workers,
            prefetch_factor=cfg.prefetch_factor if workers else None,  # type: ignore[arg-type]
            pin_memory=bool(cfg.pin_memory) and self.device.type == "cuda",
            device=self.device.type, decode_threads=0,
            size=cfg.size or (tuple(image.shape[:2]) if image is not None and image.shape
                              and None not in image.shape[:2] else None),
            sample_bytes=sum(int(np.prod(s)) * np.dtype(d).itemsize  # the ring's columns
                             for (_, *s), d in self._ring_shapes(cfg).values()))

    def _ring_shapes(self, cfg: LoaderConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """A slot's tensors: every stacked column, labels included, so that a batch from a
        worker crosses as slot numbers only."""
        staged = self.stage.in_workers  # images arrive as the operations' float32 batches
        return {c.field.name: ((cfg.batch_size, *c.shape), np.dtype(np.float32)
                               if staged and c.field.kind == "image" else c.dtype)
                for c in self.batch_dataset.columns if c.shape is not None and c.dtype is not None}

    def _use_ring(self, ring: SlotRing) -> None:
        self.ring = ring
        self.batch_dataset.slots = ring.tensors
        self.planner.ring = ring
        self.stage.ring = ring

    @property
    def decoder_fallbacks(self) -> list[str]:
        """Records (described by name) whose JPEG simplejpeg refused and Pillow decoded."""
        return self.stage.fallbacks

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One epoch from its first batch (or, once, from where ``load_state_dict`` says)."""
        refuse_nested_workers(self.cfg)
        epoch, start = self._begin()
        self.planner.epoch, self.planner.start = epoch, start
        self.stage.begin(epoch, self.world.rank, start)
        if self.ring is not None:
            self.ring.reset()
        self._skipped_before = len(self.skipped)
        yield from self._hand_out(self.stage(self._batches()), epoch, start)

    def _epoch_done(self, epoch: int) -> None:
        n = len(self.skipped) - self._skipped_before
        if n:
            warnings.warn(f"{self.reader.root}: skipped {n} corrupt record(s) in epoch "
                          f"{epoch} (on_error='skip'); first: {self.skipped[self._skipped_before]}",
                          stacklevel=4)

    def _batches(self) -> Iterator[dict[str, Any]]:
        batches = iter(self._dl)
        try:
            for batch in batches:
                raise_carried(batch)
                skipped = batch.pop(SKIPPED_KEY, None)
                if skipped:
                    self.skipped.extend(skipped)
                if self.ring is not None:
                    self.ring.resolve(batch)
                yield batch
        except GeneratorExit:
            raise  # the consumer stopped early: persistent workers stay for the next epoch
        except BaseException:
            _stop_workers(self._dl, batches)
            raise


def _stop_workers(dl: DataLoader, batches: Any) -> None:
    """Stop the workers of an epoch that raised (a worker's CorruptRecordError, Ctrl-C) now, in
    this process. The exception's traceback keeps the DataLoader iterator alive in a reference
    cycle; left to the garbage collector, it could be freed inside the *next* loader's forked
    workers, whose ``__del__`` then prints "AssertionError: can only test a child process" once
    per worker. Stopped here, its ``__del__`` has nothing left to do."""
    stop = getattr(batches, "_shutdown_workers", None)  # torch's multi-process iterator only
    if stop is not None:
        stop()
    if getattr(dl, "_iterator", None) is batches:  # persistent workers: start afresh next time
        dl._iterator = None
