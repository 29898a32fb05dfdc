"""Batch conversions on the CPU in the calling thread only, for a CPU loader with workers.

The workers own the cores, so the main process converts its batches (uint8 to normalized float,
NHWC to NCHW, float targets) on one thread. torch would spread these kernels over its intra-op
threads, and its only control of them, ``torch.set_num_threads``, is process-wide: the user's
own step uses it. numpy's elementwise loops run in the calling thread, so they are used here,
with the same float32 arithmetic as the torch path (``x.float().sub_(mean).mul_(1 / std)``, or
``.mul_(1 / 255)``) and round-to-nearest-even narrowing: the same values, bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

_UNIT = np.float32(1 / 255)


def image(x: torch.Tensor, dtype: torch.dtype, mean: np.ndarray | None,
          inv_std: np.ndarray | None, channels_last: bool) -> torch.Tensor:
    """An N×H×W×3 uint8 batch as N×3×H×W ``dtype``: scaled to [0, 1], or ``(x - mean) *
    inv_std`` (per channel, float32, in 0..255 units), channels-last unless asked otherwise."""
    if dtype == torch.uint8 and channels_last:
        return x.permute(0, 3, 1, 2)  # NHWC storage seen as NCHW: nothing to compute
    value = src = x.numpy()
    if dtype != torch.uint8:
        value = np.empty(src.shape, np.float32)
        if mean is not None and inv_std is not None:
            # per channel, as rows of W×3: numpy's inner loop then runs W×3 long, not 3 (~9x)
            rows, out_rows = _rows(src), _rows(value)
            width = rows.shape[1] // mean.size
            np.subtract(rows, np.tile(mean, width), out=out_rows)
            np.multiply(out_rows, np.tile(inv_std, width), out=out_rows)
        else:
            unit_into(src, value)
        if dtype == torch.float16:
            value = value.astype(np.float16)
        elif dtype == torch.bfloat16:
            value = _bfloat16_bits(value)
    if not channels_last:
        value = np.ascontiguousarray(value.transpose(0, 3, 1, 2))
    out = torch.from_numpy(value)
    if dtype == torch.bfloat16:
        out = out.view(torch.bfloat16)
    return out if not channels_last else out.permute(0, 3, 1, 2)


def unit_into(src: np.ndarray, out: np.ndarray) -> None:
    """uint8 ``src`` scaled to [0, 1] into float32 ``out``: ``x.float().mul_(1 / 255)``'s values."""
    np.multiply(src, _UNIT, out=out)


def _rows(a: np.ndarray) -> np.ndarray:
    """An N×H×W×C array as (N·H)×(W·C) rows, a view when it is contiguous."""
    return a.reshape(a.shape[0] * a.shape[1], -1)


def rows_of(x: torch.Tensor) -> torch.Tensor | None:
    """A channels-last N×C×H×W tensor's storage as (N·H)×(W·C) rows (a view), or None when it is
    not stored that way."""
    nhwc = x.permute(0, 2, 3, 1)
    return nhwc.view(x.shape[0] * x.shape[2], -1) if nhwc.is_contiguous() else None


def to_float32(v: torch.Tensor) -> torch.Tensor:
    """``v.float()``: a new float32 tensor, or ``v`` itself when it is one."""
    return torch.from_numpy(v.numpy().astype(np.float32, copy=False))


def _bfloat16_bits(value: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even, as torch rounds), as their
    uint16 bit patterns; ``value`` is used as scratch."""
    bits = value.view(np.uint32)
    bias = np.right_shift(bits, 16)
    np.bitwise_and(bias, 1, out=bias)
    bias += 0x7FFF
    bits += bias
    return np.right_shift(bits, 16).astype(np.uint16)
