"""The map-style dataset the DataLoader workers run: one ``__getitems__`` call per batch, read in
one transaction and decoded into preallocated buffers, so a batch crosses the process boundary
as a handful of tensors, never as per-sample Python objects.
"""

from __future__ import annotations

import difflib
import logging
import struct
import traceback
import zlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch

from ..dataset.registry import DatasetReader
from ..errors import (
    BadInputError,
    ConfigError,
    CorruptRecordError,
    FeedpipeError,
    TransformError,
)
from ..schema.fields import ArrayField, Field, ImageField, LabelField
from ..schema.geometric import BoxesField
from ..schema.imaging import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_PIXELS_PER_BYTE,
    DEFAULT_MAX_SCANS,
    decode_mask_png,
)
from ..schema.masks import MaskField, TargetField
from .foreign import sample_transform
from .labels import Collector, Moved, Ragged, batch_keys, check_keys, collects
from .order import SampleRngs
from .sampler import BatchRequest, rng_for
from .torch.convert import Conversion
from .torch.device_decode import EncodedBatch, plan_encoded
from .transforms import Geometry, ImageOp

log = logging.getLogger(__name__)
SKIPPED_KEY = "_feedpipe_skipped"
FALLBACK_KEY = "_feedpipe_fallback"  # records whose JPEG only Pillow could decode
ERROR_KEY = "_feedpipe_error"  # a worker's typed error, sent as its batch (see raise_carried)
_MAX_REFILL = 16
#: what reading and decoding a damaged record raises. Anything else from a sample, or a
#: ConfigError, is a bug or a bad option: it propagates, never a "corrupt" sample that
#: on_error="skip" would silently replace.
DECODE_ERRORS = (CorruptRecordError, BadInputError, ValueError, OSError, EOFError, SyntaxError,
                 zlib.error, struct.error)


@dataclass(frozen=True)
class SlotRef:
    """Stands in for an image tensor written into slot ``index`` of the shared ring (n rows)."""

    index: int
    rows: int


@dataclass(frozen=True)
class _Column:
    field: Field
    shape: tuple[int, ...] | None  # per-sample shape when the column stacks into one array
    dtype: np.dtype | None  # batch dtype of a stacked column
    #: how fill() writes a sample's value (collect: keypoints, boxes, text, padded arrays)
    role: Literal["image", "encoded", "mask", "target", "collect", "stack", "list"]


def _torch_int(dt: np.dtype) -> np.dtype:
    """uint8 stays; wider unsigned ints become int32 (torch has no general uint16 before 2.3)."""
    return dt if dt == np.uint8 or dt.kind == "i" else np.dtype(np.int32)


def target_batch_dtype(f: TargetField) -> np.dtype:
    """Batch dtype of a target: integer label-like keep theirs, else float16 or float32."""
    if f.interp == "nearest" and not f.quantized and np.dtype(f.dtype).kind in "ui":
        return _torch_int(np.dtype(f.dtype))
    return np.dtype(np.float16) if np.dtype(f.dtype) == np.float16 else np.dtype(np.float32)


def _write_back(view: torch.Tensor, value: Any, name: str) -> None:
    """Copy a transform's value into the batch row: same shape and dtype only (no silent cast)."""
    t = torch.as_tensor(value)
    if t.shape != view.shape or t.dtype != view.dtype:
        raise ValueError(f"returned {name!r} as {t.dtype} {tuple(t.shape)}; the batch holds "
                         f"{view.dtype} {tuple(view.shape)} (images as C×H×W uint8)")
    # numpy's copy: one thread (torch's splits a 224² image over its threads: ~12 ms a sample
    # in-process on a busy 2-core machine)
    np.copyto(view.numpy(), t.detach().as_subclass(torch.Tensor).numpy())


def _boxes_back(moved: Moved, pos: int, name: str, keys: list[str],
                values: dict[str, Any]) -> None:
    """A transform's boxes of sample ``pos`` (with one value per box in each of ``keys``)."""
    boxes = np.asarray(values[name], np.float32)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"returned {name!r} of shape {boxes.shape}; boxes are M×4 xyxy")
    cols = [np.asarray(values[k], np.int64).reshape(-1) for k in keys]
    for k, c in zip(keys, cols, strict=True):
        if len(c) != len(boxes):
            raise ValueError(f"returned {len(boxes)} boxes in {name!r} but {len(c)} values in "
                             f"{k!r}: return one per box")
    moved.values[pos] = boxes
    moved.ints[pos] = np.stack(cols, 1)  # type: ignore[index]


def _not_given(name: str, given: list[str], collected: Sequence[str]) -> str:
    """Why ``transform=`` may not return ``name``: a typo, or a field collated after it runs."""
    if name in collected:
        return (f"returned {name!r}: keypoints, boxes, text and padded arrays are transformed "
                "and collated for the whole batch after transform= runs; change them in "
                "batch_transforms= instead")
    near = difflib.get_close_matches(name, given, 1)
    return (f"returned {name!r}, which is not one of the fields it was given {given}"
            + (f" (did you mean {near[0]!r}?)" if near else "")
            + "; it may change those only (load a field with fields= to change it)")


def check_fields(reader: DatasetReader, fields: Sequence[str]) -> None:
    """Refuse field names the dataset lacks, all at once, each with its did-you-mean."""
    unknown = [name for name in fields if name not in reader.schema]
    if unknown:
        near = {n: difflib.get_close_matches(n, reader.schema.names, 1) for n in unknown}
        said = ", ".join(f"{n!r}" + (f" (did you mean {near[n][0]!r}?)" if near[n] else "")
                         for n in unknown)
        raise ConfigError(f"fields: {said} not in the dataset; it has {reader.schema.names}",
                          option="fields")


def raise_carried(batch: dict[str, Any]) -> None:
    """Raise the typed error a worker sent in place of a batch (see ``__getitems__``)."""
    exc = batch.get(ERROR_KEY)
    if exc is not None:
        raise exc


def _at(req: BatchRequest, pos: int, index: int | None) -> int:
    """The sample filled in at batch position ``pos``: ``index`` when given (a substitute)."""
    return req[pos] if index is None else index


class BatchDataset(torch.utils.data.Dataset):
    """Reads, decodes and collates whole batches (``__getitems__``) from a format reader."""

    def __init__(self, reader: DatasetReader, fields: Sequence[str], op: ImageOp, *, seed: int,
                 on_error: str, encoded_images: bool = False,
                 max_pixels: int | None = None, ragged: Ragged = "pad",
                 min_box_fraction: float = 0.0,
                 transform: Callable[..., Any] | None = None) -> None:
        recorded = reader.decode_limits()
        op = replace(op, max_pixels=int(max_pixels or recorded.get("max_pixels")
                                        or DEFAULT_MAX_PIXELS),
                     max_scans=op.max_scans or recorded.get("max_scans") or DEFAULT_MAX_SCANS,
                     max_pixels_per_byte=op.max_pixels_per_byte
                     or recorded.get("max_pixels_per_byte") or DEFAULT_MAX_PIXELS_PER_BYTE)
        self.reader, self.op, self.seed, self.on_error = reader, op, seed, on_error
        self.encoded_images = encoded_images  # decoded on the device (see device_decode.py)
        self.ragged, self.min_box_fraction = ragged, min_box_fraction
        self._rngs = SampleRngs()  # each sample's generator for transform (reused: see there)
        self.convert: Conversion | None = None  # images converted here (set by the torch backend)
        self._decoded: dict[str, np.ndarray] = {}
        if encoded_images and op.affine is not None:
            raise ConfigError("decode_on='device' leaves images encoded in the workers, where "
                              "affine= resamples the decoded image: use decode_on='cpu'",
                              option="decode_on")
        self.columns: list[_Column] = []
        check_fields(reader, fields)
        for name in fields:
            f = reader.schema[name]
            dtype: np.dtype | None = None
            role = "stack"
            if isinstance(f, ImageField):
                role = "encoded" if encoded_images else "image"
                shape = (*op.size, 3) if op.size else f.shape
                if shape is None:
                    raise ConfigError(f"field {name!r}: the dataset records no image size "
                                      "(encoded images are stored as they come, each its own "
                                      "size), so a batch needs one: pass size=(H, W) (or an "
                                      "int); the loader resizes or crops to it", option="size")
                if op.crop == "none" and f.shape and op.size and f.shape[:2] != op.size:
                    raise ConfigError(f"crop='none' but stored images are {f.shape[:2]}, not "
                                      f"size={op.size}; choose crop='resize' or 'center_crop'",
                                      option="crop")
                dtype = np.dtype(np.uint8)
                if encoded_images:
                    shape = dtype = None
            elif isinstance(f, (MaskField, TargetField)):
                role = "mask" if isinstance(f, MaskField) else "target"
                hw = op.size or (tuple(f.shape[:2]) if f.shape and None not in f.shape[:2]
                                 else None)
                if hw is None:
                    raise ConfigError(f"field {name!r} varies in size with the images: pass "
                                      "size=(H, W) (or an int) to batch it", option="size")
                extra = f.shape[2:] if isinstance(f, TargetField) else ()
                shape = (*hw, *extra)  # type: ignore[arg-type]
                dtype = _torch_int(np.dtype(f.dtype)) if isinstance(f, MaskField) \
                    else target_batch_dtype(f)
                fill = op.affine.mask_fill if op.affine is not None else 0
                if dtype.kind in "iu" and not np.iinfo(dtype).min <= fill <= np.iinfo(dtype).max:
                    raise ConfigError(f"affine: mask_fill={fill} does not fit field {name!r} "
                                      f"({dtype}, {np.iinfo(dtype).min}..{np.iinfo(dtype).max})",
                                      option="affine")
            elif collects(f, ragged):
                shape, role = None, "collect"
            elif isinstance(f, LabelField):
                shape, dtype = (), np.dtype(np.int64)
            elif isinstance(f, ArrayField) and f.fixed:
                shape, dtype = f.shape, np.dtype(f.dtype)  # type: ignore[assignment]
            else:
                shape, role = None, "list"
            self.columns.append(_Column(f, shape, dtype, role))  # type: ignore[arg-type]
        check_keys([c.field for c in self.columns], ragged)
        self.transform = None if transform is None \
            else sample_transform(transform, [c.field for c in self.columns])
        # the image goes first: its decode fixes the geometry the masks and targets follow
        self.columns.sort(key=lambda c: not isinstance(c.field, ImageField))
        self.names = [c.field.name for c in self.columns]
        self._roles = [(c.field.name, c.role, c.field) for c in self.columns]
        self.slots: dict[str, list[torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__(BatchRequest([index], 0, index, 0))

    def __getitems__(self, request: Sequence[int]) -> dict[str, Any]:
        try:
            return self._batch(request)
        except FeedpipeError as exc:
            worker = torch.utils.data.get_worker_info()
            if worker is None:
                raise
            # DataLoader re-raises a worker's exception as its type and traceback text only
            # (key, file and cause lost): sent as the batch, it is raised whole
            exc.add_note(f"(raised in DataLoader worker process {worker.id}:)\n"
                         + "".join(traceback.format_exception(exc)).rstrip())
            return {ERROR_KEY: exc}

    def _batch(self, request: Sequence[int]) -> dict[str, Any]:
        req = request if isinstance(request, BatchRequest) else BatchRequest(request, 0, 0, 0)
        n = len(req)
        out: dict[str, Any] = {}
        staged = self.convert.images if self.convert is not None else ()
        for col in self.columns:
            if col.shape is None:
                out[col.field.name] = [None] * n
            elif col.field.name in staged:
                out[col.field.name] = torch.from_numpy(self._decode_batch(col.field.name, n,
                                                                          col.shape))
            elif req.slot >= 0 and col.field.name in self.slots:
                out[col.field.name] = self.slots[col.field.name][req.slot][:n]
            else:
                out[col.field.name] = torch.from_numpy(np.empty((n, *col.shape), col.dtype))
        views = {k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}
        rng = rng_for(self.seed, req.epoch, req.rank, req.number) if self.op.random else None
        fallbacks: dict[int, str] = {}  # by batch position: a retried or refilled one replaces
        collected = {c.field.name: Collector(c.field, n, self.op.size, self.ragged,
                                             self.min_box_fraction)
                     for c in self.columns if c.role == "collect"}

        op, apply = self.op, self.op.apply
        user = self._transformer(req, out) if self.transform is not None else None
        moved: dict[str, Moved] = {}  # keypoints and boxes on the canvas, for transform=
        # transform= runs once every sample is filled (interleaved with the decodes, ~12% slower)
        transformed: dict[int, int] = {}  # batch position -> sample filled in there

        def fill(pos: int, stored: dict[str, Any], index: int | None = None) -> None:
            """Sample ``pos`` from its stored values; ``index``: a substitute's, not ``req[pos]``."""
            geo: Geometry | None = None
            for name, role, f in self._roles:  # the hot loop: error context only on failure
                try:
                    if role == "image":
                        geo = apply(stored[name], f.codec, views[name][pos], rng, name)
                        if geo.fallback:
                            fallbacks[pos] = self._named(_at(req, pos, index))
                    elif role == "stack":
                        views[name][pos] = stored[name]
                    elif role == "encoded":  # decoded on the device: checked here, in the worker
                        data = bytes(stored[name])
                        op.check_jpeg(data, name)
                        geo, progressive = plan_encoded(op, data, rng, name, op.max_pixels)
                        pixels = None
                        if progressive:  # decoded here: slow on the device, rare after packing
                            pixels = np.empty((*(op.size or f.shape[:2]), 3), np.uint8)
                            op.decode_planned(data, geo, pixels, name)
                        out[name][pos] = (np.frombuffer(data, np.uint8), geo,
                                          _at(req, pos, index), pixels)
                    elif role == "mask":
                        m = stored[name]
                        m = decode_mask_png(m, name, max_pixels=op.max_pixels) \
                            if f.codec == "png" else m
                        geo = geo or op.plan(m.shape[0], m.shape[1], rng)
                        op.apply_mask(m, geo, views[name][pos], name)
                    elif role == "target":
                        t = stored[name]
                        geo = geo or op.plan(t.shape[0], t.shape[1], rng)
                        op.apply_target(t, f, geo, views[name][pos], name)
                    elif role == "collect":
                        collected[name].put(pos, stored[name], geo, name)
                    else:
                        out[name][pos] = f.to_user(stored[name], name)
                except ConfigError:
                    raise
                except DECODE_ERRORS as exc:
                    raise self.reader.corrupt(_at(req, pos, index),
                                              f"cannot decode {name}: {exc}", exc) from exc
            if user is not None:
                transformed[pos] = _at(req, pos, index)

        skipped: list[str] = []
        if self.on_error == "raise":
            self.reader.visit(req, fill, self.names)
        else:
            self._fill_skipping(req, fill, skipped)
        if user is not None:
            moved = {name: c.moved() for name, c in collected.items() if c.geometric}
            for pos in sorted(transformed):
                user(pos, transformed[pos], moved)
        for name, collector in collected.items():  # transformed and padded once per batch
            del out[name]
            out.update(collector.finish(moved.get(name)))
        for col in self.columns:  # variable-shape arrays travel as a list of tensors
            if col.role == "collect":
                continue
            if col.shape is None and isinstance(col.field, ImageField):
                files, geos, idx, pixels = zip(*out[col.field.name], strict=True) if n else ((),) * 4
                done = {i: p for i, p in enumerate(pixels) if p is not None}
                out[col.field.name] = EncodedBatch.pack(
                    [np.empty(0, np.uint8) if i in done else f for i, f in enumerate(files)],
                    [g[:4] for g in geos], [g.flip for g in geos], idx, done)
            elif col.shape is None and isinstance(col.field, ArrayField):
                out[col.field.name] = [torch.from_numpy(np.ascontiguousarray(a))
                                       for a in out[col.field.name]]
        if self.convert is not None:
            into = {k: self.slots[k][req.slot] for k in staged
                    if req.slot >= 0 and k in self.slots}
            out.update(self.convert({k: out[k] for k in staged}, req.epoch, req.rank, req.number,
                                    into))
        if req.slot >= 0:
            for name in self.slots:
                if name in out:
                    out[name] = SlotRef(req.slot, n)
        if skipped:
            out[SKIPPED_KEY] = skipped
        if fallbacks:
            out[FALLBACK_KEY] = list(fallbacks.values())
        return out

    def _decode_batch(self, name: str, n: int, shape: tuple[int, ...]) -> np.ndarray:
        """This worker's reused uint8 batch of image ``name``, decoded into before conversion."""
        buf = self._decoded.get(name)
        if buf is None or len(buf) < n:
            buf = self._decoded[name] = np.empty((n, *shape), np.uint8)
        return buf[:n]

    def _named(self, index: int) -> str:
        """A record for a message: where it is stored and, when kept, its source file."""
        source = getattr(self.reader, "source_of", lambda _: None)(index)
        return self.reader.describe(index) + (f" [source file: {source}]" if source else "")

    def _transformer(self, req: BatchRequest, out: dict[str, Any]
                     ) -> Callable[[int, int, dict[str, Moved]], None]:
        """The user's ``transform`` on views of row ``pos`` (sample ``index``), written back."""
        fn, seed, epoch = self.transform, self.seed, req.epoch
        rngs = self._rngs
        stacked = [c.field.name for c in self.columns if c.shape is not None]
        images = {c.field.name for c in self.columns if isinstance(c.field, ImageField)}
        boxes = {c.field.name: batch_keys(c.field, self.ragged)[1:-1] for c in self.columns
                 if isinstance(c.field, BoxesField)}
        listed = [c.field.name for c in self.columns if c.shape is None and c.role != "collect"]
        collected = [c.field.name for c in self.columns if c.role == "collect"]

        def run(pos: int, index: int, moved: dict[str, Moved]) -> None:
            views = {name: out[name][pos].permute(2, 0, 1) if name in images else out[name][pos]
                     for name in stacked}
            geo: dict[str, Any] = {}  # keypoints and boxes: views of the moved values
            for name, m in moved.items():
                if name in boxes:
                    ints = torch.from_numpy(m.ints[pos])  # type: ignore[index]
                    geo[name] = torch.from_numpy(m.values[pos])
                    geo.update({k: ints[:, j] for j, k in enumerate(boxes[name])})
                else:
                    views[name] = torch.from_numpy(m.values[pos])
                    views[f"{name}_visible"] = torch.from_numpy(m.visible[pos])  # type: ignore[index]
            sample = {**views, **geo, **{name: out[name][pos] for name in listed}}
            given = list(sample)  # (the function may add keys to it in place)
            try:
                got = fn(sample, rngs(seed, epoch, index))  # type: ignore[misc]
                got = sample if got is None else got
                for name, value in got.items():
                    if name in views:
                        if value is not views[name]:
                            _write_back(views[name], value, name)
                    elif name in listed:
                        out[name][pos] = value
                    elif name not in given:
                        raise ValueError(_not_given(name, given, [
                            c for c in collected if c not in given]))
                for name, keys in boxes.items():
                    if any(k in got and got[k] is not geo.get(k) for k in (name, *keys)):
                        _boxes_back(moved[name], pos, name, keys, {**geo, **got})
            except Exception as exc:
                source = self.reader.source_of(index)
                raise TransformError(
                    f"{self.reader.root}: transform failed on sample "
                    f"{self.reader.key_of(index)}" + (f" (from {source})" if source else "")
                    + f": {type(exc).__name__}: {exc}", dataset=self.reader.root,
                    file=source, key=self.reader.key_of(index)) from exc

        return run

    def _fill_skipping(self, req: BatchRequest, fill: Any, skipped: list[str]) -> None:
        """on_error="skip": replace each corrupt sample by a seeded substitute, keeping the size."""
        bad: dict[int, CorruptRecordError] = {}  # by batch position

        def guarded(pos: int, stored: dict[str, Any]) -> None:
            try:
                fill(pos, stored, req[pos])
            except CorruptRecordError as exc:
                bad[pos] = exc

        try:
            self.reader.visit(req, guarded, self.names)
        except CorruptRecordError:  # the read itself failed: go sample by sample
            bad.clear()
            for pos in range(len(req)):
                try:
                    self.reader.visit([req[pos]], lambda _, stored, p=pos: guarded(p, stored),
                                      self.names)
                except CorruptRecordError as exc:
                    bad[pos] = exc
        # named by key and source file, read after the batch's transaction has ended
        skipped += [str(self.reader.located(exc)) for exc in bad.values()]
        rng = rng_for(self.seed, req.epoch, req.rank, req.number, 1)
        for pos in bad:
            for _ in range(_MAX_REFILL):
                sub = int(rng.integers(0, len(self.reader)))
                try:
                    self.reader.visit([sub], lambda _, stored: fill(pos, stored, sub),  # noqa: B023
                                      self.names)  # (called at once, inside this iteration)
                    break
                except CorruptRecordError as exc:
                    skipped.append(str(exc))
            else:
                raise CorruptRecordError(f"{self.reader.root}: {_MAX_REFILL} substitutes in a row "
                                         "were corrupt; run `feedpipe verify` on the dataset")
