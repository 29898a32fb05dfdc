"""The map-style dataset the DataLoader workers run: one ``__getitems__`` call per batch.

A worker reads the whole batch in one transaction / read call and decodes each image into one
preallocated uint8 N×H×W×3 buffer, so a batch crosses the process boundary as a handful of
tensors, never as per-sample Python objects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import ConfigError, CorruptRecordError
from ..formats import DatasetReader
from ..schema import ArrayField, Field, ImageField, LabelField
from ..sharding import rng_for
from .transforms import ImageOp

log = logging.getLogger(__name__)
SKIPPED_KEY = "_feedpipe_skipped"
_MAX_REFILL = 16


class BatchRequest(list):
    """The indices of one batch, what makes its augmentation deterministic, and the ring slot
    (-1: none free) its images are written into."""

    def __init__(self, indices: Sequence[int], epoch: int, number: int, rank: int,
                 slot: int = -1) -> None:
        super().__init__(int(i) for i in indices)
        self.epoch, self.number, self.rank, self.slot = epoch, number, rank, slot

    def __reduce__(self) -> tuple[Any, ...]:
        return BatchRequest, (list(self), self.epoch, self.number, self.rank, self.slot)


@dataclass(frozen=True)
class SlotRef:
    """Stands in for an image tensor written into slot ``index`` of the shared ring (n rows)."""

    index: int
    rows: int


@dataclass(frozen=True)
class _Column:
    field: Field
    shape: tuple[int, ...] | None  # per-sample shape when the column stacks into one array


class BatchDataset(torch.utils.data.Dataset):
    """Reads, decodes and collates whole batches (``__getitems__``) from a format reader."""

    def __init__(self, reader: DatasetReader, fields: Sequence[str], op: ImageOp, *, seed: int,
                 on_error: str) -> None:
        self.reader, self.op, self.seed, self.on_error = reader, op, seed, on_error
        self.columns: list[_Column] = []
        for name in fields:
            if name not in reader.schema:
                raise ConfigError(f"fields: {name!r} is not in the dataset; it has "
                                  f"{reader.schema.names}")
            f = reader.schema[name]
            if isinstance(f, ImageField):
                shape = (*op.size, 3) if op.size else f.shape
                if shape is None:
                    raise ConfigError(f"field {name!r} holds images of varying size: pass "
                                      "size=(H, W) (or an int) to batch them")
                if op.crop == "none" and f.shape and op.size and f.shape[:2] != op.size:
                    raise ConfigError(f"crop='none' but stored images are {f.shape[:2]}, not "
                                      f"size={op.size}; choose crop='resize' or 'center_crop'")
            elif isinstance(f, LabelField):
                shape = ()
            elif isinstance(f, ArrayField) and f.fixed:
                shape = f.shape  # type: ignore[assignment]
            else:
                shape = None
            self.columns.append(_Column(f, shape))
        self.names = [c.field.name for c in self.columns]
        # shared-memory output ring (set by the torch backend when workers run): reusing these
        # pages avoids faulting in a fresh shared-memory segment for every batch
        self.slots: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__(BatchRequest([index], 0, index, 0))

    def __getitems__(self, request: Sequence[int]) -> dict[str, Any]:
        req = request if isinstance(request, BatchRequest) else BatchRequest(request, 0, 0, 0)
        n = len(req)
        out: dict[str, Any] = {}
        for col in self.columns:
            if col.shape is None:
                out[col.field.name] = [None] * n
            elif req.slot >= 0 and col.field.name in self.slots:
                out[col.field.name] = self.slots[col.field.name][req.slot, :n]
            elif isinstance(col.field, LabelField):
                out[col.field.name] = torch.empty(n, dtype=torch.int64)
            else:
                dt = torch.uint8 if isinstance(col.field, ImageField) else \
                    torch.from_numpy(np.empty(0, col.field.dtype)).dtype  # type: ignore[attr-defined]
                out[col.field.name] = torch.empty((n, *col.shape), dtype=dt)
        views = {k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}
        rng = rng_for(self.seed, req.epoch, req.rank, req.number) if self.op.random else None

        def fill(pos: int, stored: dict[str, Any], index: int) -> None:
            for col in self.columns:  # the hot loop: error context is built only on failure
                name, f = col.field.name, col.field
                try:
                    if isinstance(f, ImageField):
                        self.op.apply(stored[name], f.codec, views[name][pos], rng, name)
                    elif name in views:
                        views[name][pos] = stored[name]
                    else:
                        out[name][pos] = f.to_user(stored[name], name)
                except Exception as exc:
                    raise CorruptRecordError(f"{self.reader.describe(index)}: cannot decode "
                                             f"{name}: {exc}") from exc

        skipped: list[str] = []
        if self.on_error == "raise":
            self.reader.visit(req, lambda pos, stored: fill(pos, stored, req[pos]), self.names)
        else:
            self._fill_skipping(req, fill, skipped)
        for col in self.columns:  # variable-shape arrays travel as a list of tensors
            if col.shape is None and isinstance(col.field, ArrayField):
                out[col.field.name] = [torch.from_numpy(np.ascontiguousarray(a))
                                       for a in out[col.field.name]]
        if req.slot >= 0:
            for name in self.slots:
                if name in out:
                    out[name] = SlotRef(req.slot, n)
        if skipped:
            out[SKIPPED_KEY] = skipped
        return out

    def _fill_skipping(self, req: BatchRequest, fill: Any, skipped: list[str]) -> None:
        """on_error="skip": replace each corrupt sample by a seeded substitute, keeping the size."""
        bad: list[int] = []

        def guarded(pos: int, stored: dict[str, Any]) -> None:
            try:
                fill(pos, stored, req[pos])
            except CorruptRecordError as exc:
                bad.append(pos)
                skipped.append(str(exc))

        try:
            self.reader.visit(req, guarded, self.names)
        except CorruptRecordError:  # the read itself failed: go sample by sample
            bad.clear()
            skipped.clear()
            for pos in range(len(req)):
                try:
                    self.reader.visit([req[pos]], lambda _, stored, p=pos: guarded(p, stored),
                                      self.names)
                except CorruptRecordError as exc:
                    bad.append(pos)
                    skipped.append(str(exc))
        rng = rng_for(self.seed, req.epoch, req.rank, req.number, 1)
        for pos in bad:
            for _ in range(_MAX_REFILL):
                sub = int(rng.integers(0, len(self.reader)))
                try:
                    self.reader.visit([sub], lambda _, stored: fill(pos, stored, sub), self.names)
                    break
                except CorruptRecordError as exc:
                    skipped.append(str(exc))
            else:
                raise CorruptRecordError(f"{self.reader.root}: {_MAX_REFILL} substitutes in a row "
                                         "were corrupt; run `feedpipe verify` on the dataset")
