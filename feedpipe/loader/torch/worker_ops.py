"""Batch operations on the CPU, run by the worker that made the batch (a CPU device with workers).

The main process is a serial stage: with the built-in image operations (ColorJitter,
RandomGrayscale, RandomErasing) and the normalization there, it spent ~0.6 ms of CPU per
224² image while the workers waited on it. :class:`WorkerOps` runs the same steps in the
worker, on its batch, writing the normalized float32 batch into the batch's ring slot (whose
pages are reused, where a new 38 MB batch per batch faulted in fresh ones). The generator is
seeded from (seed, epoch, rank, batch number) as the main process seeds it
(:func:`~feedpipe.loader.order.batch_seed`), and the arithmetic is the same functions on the same
layout and one thread, so the batches are the main process's bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..augment import BatchOps, ColorJitter, RandomErasing, RandomGrayscale
from ..config import LoaderConfig
from ..order import batch_seed
from ..photometric import jitter_by_order
from . import cpu_convert

#: steps that read and change only ``batch["image"]`` and draw only from its shape
IMAGE_ONLY = (ColorJitter, RandomGrayscale, RandomErasing)


def unit_mean_std(cfg: LoaderConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mean, 1/std) as 1×3×1×1 CPU tensors in [0, 1] units, or None: no normalization."""
    if cfg.mean is None or cfg.std is None or cfg.dtype == "uint8":
        return None
    return (torch.tensor(cfg.mean).view(1, 3, 1, 1),
            torch.tensor(cfg.std).reciprocal().view(1, 3, 1, 1))


def normalize(x: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor) -> torch.Tensor:
    """``(x - mean) * inv_std`` in place. On the CPU, over a channels-last batch's rows of
    W×C values (the same values, ~2.5x faster than broadcasting over an inner length of 3)."""
    rows = cpu_convert.rows_of(x) if x.device.type == "cpu" else None
    if rows is None:
        return x.sub_(mean).mul_(inv_std)
    width = rows.shape[1] // x.shape[1]
    rows.sub_(mean.view(-1).repeat(width)).mul_(inv_std.view(-1).repeat(width))
    return x


@dataclass(frozen=True)
class WorkerOps:
    """The loader's batch operations and normalization, run on a batch in its worker."""

    ops: BatchOps
    seed: int
    unit: tuple[torch.Tensor, torch.Tensor] | None

    @classmethod
    def of(cls, cfg: LoaderConfig, ops: BatchOps | None, device: torch.device,
           image_fields: tuple[str, ...]) -> WorkerOps | None:
        """The worker side of ``cfg``'s batch operations where they can run there: a CPU device
        with workers, one image field named "image", float32 channels-last output, and only the
        image-only built-ins (the others change the labels, whose ring column is fixed, or are
        the user's own, which run where the user expects them: the main process)."""
        if (ops is None or device.type != "cpu" or not cfg.num_workers
                or image_fields != ("image",) or cfg.dtype != "float32"
                or not cfg.channels_last
                or not all(isinstance(s, IMAGE_ONLY) for s in ops.steps)):
            return None
        return cls(ops, cfg.seed, unit_mean_std(cfg))

    def __call__(self, image: np.ndarray, out: torch.Tensor, epoch: int, rank: int,
                 number: int) -> None:
        """``image`` (N×H×W×3 uint8) operated on and normalized into ``out`` (N×H×W×3
        float32: the N×3×H×W channels-last batch's storage), with the main process's values.
        A first ColorJitter reads the uint8 image itself (``jitter_by_order(unit=True)``: the
        float image's values without its pass). (An N×C×H×W working copy, where ColorJitter
        needs no transposing copies, cost as much again in the transposes to and from it.)"""
        x = out.permute(0, 3, 1, 2)
        gen = torch.Generator().manual_seed(batch_seed(self.seed, epoch, rank, number))
        steps = self.ops.steps
        if isinstance(steps[0], ColorJitter):  # its draws first, as BatchOps makes them
            params = steps[0].params({"image": x}, gen)
            jitter_by_order(torch.from_numpy(image).permute(0, 3, 1, 2), params, out=x,
                            unit=True)
            steps = steps[1:]
        else:
            cpu_convert.unit_into(image, out.numpy())
        if steps:
            got = BatchOps(steps, owns_input=True)({"image": x}, gen)["image"]
            if got is not x:  # (the built-ins adjust the image they are handed: not reached)
                x.copy_(got)
        if self.unit is not None:
            normalize(x, *self.unit)
