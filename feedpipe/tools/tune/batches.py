"""Batches for the batch-size trials: the default loss step, tiling to a size, moving, sizing."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from ...errors import ConfigError

Batch = Any


def default_step(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Forward the batch's input (``image`` of a dict, first of a tuple, or the tensor); the loss is
    cross-entropy against ``label`` for N×C logits, else the output's mean."""
    label = None
    if isinstance(batch, dict):
        if "image" not in batch:
            raise ConfigError(f"find_batch_size: the batch has {sorted(batch)}, no 'image'; pass "
                              "step=lambda model, batch: loss")
        x, label = batch["image"], batch.get("label")
    elif isinstance(batch, (tuple, list)):
        x, label = batch[0], batch[1] if len(batch) > 1 else None
    else:
        x = batch
    out = model(x)
    if isinstance(label, torch.Tensor) and out.ndim == 2 and not label.is_floating_point():
        return torch.nn.functional.cross_entropy(out.float(), label)
    return out.float().mean()


def tile(batch: Batch, size: int) -> Batch:
    """``batch`` repeated along its first dimension to ``size`` rows (tensors, per-sample lists)."""
    if isinstance(batch, torch.Tensor):
        return batch[torch.arange(size, device=batch.device) % batch.shape[0]]
    if isinstance(batch, dict):
        return {k: tile(v, size) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)) and batch and all(isinstance(v, torch.Tensor)
                                                          for v in batch):
        return type(batch)(tile(v, size) for v in batch)
    if isinstance(batch, list):
        return [batch[i % len(batch)] for i in range(size)]
    return batch


def to_device(batch: Batch, device: torch.device) -> Batch:
    return tree_map_only(torch.Tensor, lambda t: t.to(device), batch)


def nbytes(batch: Batch) -> int:
    return sum(t.nbytes for t in tree_leaves(batch) if isinstance(t, torch.Tensor))


def cpu_copy(obj: Any) -> Any:
    return tree_map_only(torch.Tensor, lambda t: t.detach().to("cpu", copy=True), obj)
