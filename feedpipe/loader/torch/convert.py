"""A batch's last steps, one implementation wherever they run: uint8 N×H×W×3 images to the output
dtype, normalization and layout, the batch operations, float targets to float32.

Where they run (:class:`~feedpipe.loader.torch.backend.TorchLoader` decides): on a CPU device
with workers, in the worker that made the batch, writing into the batch's ring slot (the main
process is then no serial stage, and the training thread receives the slot itself); otherwise
in the loader's feed thread, on the batch's device. The arithmetic is the same torch operations
either way (a worker runs torch on one thread), so the batches are the same bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from ...schema.fields import Field
from .. import augment
from ..augment import BatchOps, ColorJitter, RandomErasing, RandomGrayscale, batch_ops
from ..config import LoaderConfig
from ..order import batch_seed

#: built-in steps that read and change only ``batch["image"]``: a worker can run them on its batch
IMAGE_ONLY = (ColorJitter, RandomGrayscale, RandomErasing)


def normalize(x: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor) -> torch.Tensor:
    """``(x - mean) * inv_std`` in place, per channel of an N×C×H×W float tensor. On the CPU
    over a channels-last batch's rows of W×C values: the same values, ~2.5x faster than
    broadcasting over an inner length of 3."""
    nhwc = x.permute(0, 2, 3, 1)
    if x.device.type != "cpu" or not nhwc.is_contiguous():
        return x.sub_(mean).mul_(inv_std)
    rows = nhwc.view(x.shape[0] * x.shape[2], -1)
    width = x.shape[3]
    rows.sub_(mean.view(-1).repeat(width)).mul_(inv_std.view(-1).repeat(width))
    return x


@dataclass(frozen=True)
class Conversion:
    """What turns a batch of uint8 N×H×W×3 images (and stored targets) into the batch the user
    gets. Picklable: a worker process runs it on its batch under any start method."""

    dtype: torch.dtype
    channels_last: bool
    mean: torch.Tensor | None       # 1×3×1×1 float32 in 0..255 units (no batch operations)
    inv_std: torch.Tensor | None
    unit_mean: torch.Tensor | None  # the same in 0..1 units, after the batch operations
    unit_inv_std: torch.Tensor | None
    ops: BatchOps | None
    seed: int
    images: tuple[str, ...] = ()
    floats: tuple[str, ...] = ()    # targets resampled as values: float32 out

    @classmethod
    def of(cls, cfg: LoaderConfig, images: tuple[str, ...] = (),
           floats: tuple[str, ...] = (), fields: Sequence[Field] | None = None) -> Conversion:
        """The conversion ``cfg`` asks for, of a batch of ``fields`` (what another library's
        batch augmentation gets besides the image: masks, keypoints, boxes)."""
        mean = std = unit_mean = unit_inv = None
        out = cfg.output
        if out.mean is not None and out.std is not None and out.dtype != "uint8":
            mean = torch.tensor(out.mean).mul(255).view(1, 3, 1, 1)
            std = torch.tensor(out.std).mul(255).reciprocal().view(1, 3, 1, 1)
            unit_mean = torch.tensor(out.mean).view(1, 3, 1, 1)
            unit_inv = torch.tensor(out.std).reciprocal().view(1, 3, 1, 1)
        return cls(getattr(torch, out.dtype), out.channels_last, mean, std, unit_mean, unit_inv,
                   batch_ops(cfg.batch_transforms, fields), cfg.seed, images, floats)

    def to(self, device: torch.device) -> Conversion:
        """This conversion with its constants on ``device`` (moved once, not per batch)."""
        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(self, mean=moved(self.mean), inv_std=moved(self.inv_std),
                       unit_mean=moved(self.unit_mean), unit_inv_std=moved(self.unit_inv_std))

    @property
    def image_only(self) -> bool:
        """Whether a worker can run it: no batch operations, or only the image-only built-ins
        on the one image field named "image" (the others change the labels, or are the user's
        own, which run in the main process)."""
        return self.ops is None or (self.images == ("image",)
                                    and all(isinstance(s, IMAGE_ONLY) for s in self.ops.steps))

    @property
    def changes_images(self) -> bool:
        """Whether the images change at all (uint8 channels-last output without operations is
        the decoded batch itself, seen as N×3×H×W)."""
        return self.ops is not None or self.dtype != torch.uint8 or not self.channels_last

    def output(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], torch.dtype]:
        """The storage an N×H×W×3 uint8 image batch is converted into: N×H×W×3 of the output
        dtype when channels-last (seen as N×3×H×W), else N×3×H×W."""
        n, h, w, c = shape
        return ((n, h, w, c) if self.channels_last else (n, c, h, w)), self.dtype

    def __call__(self, batch: dict[str, Any], epoch: int, rank: int, number: int,
                 into: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Convert ``batch`` (its images N×H×W×3 uint8) in place of its values; an image whose
        name is in ``into`` ends up there (a ring slot of :meth:`output`'s storage)."""
        into = {k: v[: len(batch[k])] for k, v in (into or {}).items()}
        if self.ops is None:
            for k in self.images:
                batch[k] = self._final(batch[k], into.get(k))
        else:
            batch = self._operate(batch, into, torch.Generator().manual_seed(
                batch_seed(self.seed, epoch, rank, number)))
        for k in self.floats:
            if batch[k].dtype != torch.float32:
                batch[k] = batch[k].float()
        for k, dest in into.items():
            batch[k] = _place(batch[k], dest, self.channels_last)
        return batch

    def _operate(self, batch: dict[str, Any], into: dict[str, torch.Tensor],
                 gen: torch.Generator) -> dict[str, Any]:
        """The batch operations on images in [0, 1] (uint8 output: on uint8), then the
        normalization. On the CPU a first ColorJitter reads the uint8 image itself
        (``jitter(unit=True)``: the float image's values without a pass of its own)."""
        ops = self.ops
        assert ops is not None
        for k in self.images:
            u8, fused = batch[k], False
            if k == "image" and isinstance(ops.steps[0], ColorJitter) \
                    and u8.device.type == "cpu" and self.dtype != torch.uint8:
                x = self._unit(u8, into.get(k), fill=False)
                params = ops.steps[0].params({"image": x}, gen)  # its draws first, as BatchOps
                augment.jitter(u8.permute(0, 3, 1, 2), params, out=x, unit=True)
                fused = True
            else:
                x = self._unit(u8, into.get(k))
            batch[k] = x
        rest = BatchOps(ops.steps[1:], owns_input=True) if fused else ops
        if rest.steps:
            batch = rest(batch, gen)  # type: ignore[arg-type]
        for k in self.images:
            batch[k] = self._after_ops(batch[k])
        return batch

    def _final(self, u8: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """uint8 N×H×W×3 to the output: normalized (or scaled to [0, 1]) in float32
        arithmetic, narrowed last; uint8 as it is. N×3×H×W, channels-last unless asked not;
        computed in ``out`` when it is float32 storage."""
        x = u8.permute(0, 3, 1, 2)
        if self.dtype == torch.uint8:
            return x if self.channels_last else x.contiguous()
        y = layout(out, self.channels_last).copy_(x) if out is not None \
            and out.dtype == torch.float32 else x.float()  # (keeps the view's channels-last)
        if self.mean is not None:
            normalize(y, self.mean, self.inv_std)  # type: ignore[arg-type]
        else:
            y.mul_(1 / 255)
        if self.dtype != torch.float32:
            y = y.to(self.dtype)
        return y if self.channels_last else y.contiguous()

    def _unit(self, u8: torch.Tensor, out: torch.Tensor | None, fill: bool = True
              ) -> torch.Tensor:
        """The operations' input: float32 in [0, 1], channels-last (in ``out`` when it is
        float32 channels-last storage), or a uint8 copy for uint8 output; ``fill`` False:
        allocated only."""
        x = u8.permute(0, 3, 1, 2)
        if self.dtype == torch.uint8:
            return x.clone(memory_format=torch.channels_last)
        if out is not None and out.dtype == torch.float32 and self.channels_last:
            dest = layout(out, True)
        else:
            dest = torch.empty_like(x, dtype=torch.float32, memory_format=torch.channels_last)
        if fill:
            dest.copy_(x).mul_(1 / 255)
        return dest

    def _after_ops(self, x: torch.Tensor) -> torch.Tensor:
        """An image in [0, 1] after the operations: normalized, narrowed, laid out."""
        if x.is_floating_point():
            if self.unit_mean is not None:
                normalize(x, self.unit_mean, self.unit_inv_std)  # type: ignore[arg-type]
            if self.dtype != torch.float32:
                x = x.to(self.dtype)
        return x if self.channels_last else x.contiguous()


def layout(storage: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A ring slot's image storage (see :meth:`Conversion.output`) as the N×3×H×W batch."""
    return storage.permute(0, 3, 1, 2) if channels_last else storage


def _place(x: torch.Tensor, dest: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``x`` in the slot ``dest`` (a no-op when it was computed there): what a worker ships."""
    view = layout(dest, channels_last)[: len(x)]
    if view.data_ptr() != x.data_ptr():
        view.copy_(x)
    return view
