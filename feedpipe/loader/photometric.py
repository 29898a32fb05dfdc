"""The photometric kernels of :mod:`.augment` on N×C×H×W float batches (torchvision's formulas),
and :func:`jitter`, which gives each sample its own order of them."""

from __future__ import annotations

from typing import Callable

import torch

GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma)
CPU_BLOCK = 1 << 20  # bytes of float images adjusted at a time on the CPU: in a core's L2
Params = dict[str, torch.Tensor]  # drawn parameters: CPU tensors, a row per sample
BY_ORDER = {"cpu"}  # device types where :func:`jitter` takes samples sharing an order together


def to_work(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the float dtype to compute in (float32, or x's own float64)."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def from_work(work: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``work`` (the caller's own) in ``like``'s dtype, uint8 rounded once here, and layout."""
    cl = like.is_contiguous(memory_format=torch.channels_last) and not like.is_contiguous()
    if like.dtype == torch.uint8:
        work = work.round_().clamp_(0, 255)
    return work.to(like.dtype, memory_format=torch.channels_last if cl else torch.contiguous_format)


def gray(x: torch.Tensor) -> torch.Tensor:
    """N×1×H×W luma of N×3×H×W ``x``."""
    return (GRAY[0] * x[:, 0:1]).add_(x[:, 1:2], alpha=GRAY[1]).add_(x[:, 2:3], alpha=GRAY[2])


def contrast(x: torch.Tensor, f: torch.Tensor, bound: float) -> torch.Tensor:
    """Blend with the mean of the luma: f·x + (1-f)·m as a multiply and an add (``lerp_`` towards
    an N×1×1×1 end takes torch's slow broadcasting path, ~4× the time on the CPU)."""
    m = gray(x.mean(dim=(2, 3), keepdim=True))
    return x.mul_(f).add_((1 - f) * m).clamp_(0, bound)


def hue(x: torch.Tensor, f: torch.Tensor, _: float) -> torch.Tensor:
    """Rotate the hue by ``f`` turns in HSV; scale-free (v and min scale with x, h does not)."""
    v, lo = x.amax(1, keepdim=True), x.amin(1, keepdim=True)
    d = v - lo
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    num = torch.where(v == r, g - b, torch.where(v == g, (b - r).add_(d, alpha=2),
                                                 (r - g).add_(d, alpha=4)))
    h = num.div_(d.clamp_min(torch.finfo(d.dtype).tiny)).add_(6 * f)  # in sixths of a turn
    # HSV → RGB: channel c is lo + d·clip(|k - 2| - 1, 0, 1), k = (n_c + h) mod 6, n = 5, 3, 1
    k = torch.tensor([5.0, 3.0, 1.0], dtype=x.dtype, device=x.device).view(1, 3, 1, 1) + h
    return torch.addcmul(lo, d, k.remainder_(6).sub_(2).abs_().sub_(1).clamp_(0, 1))


# Each adjusts ``x`` (the operation's own float copy) in place where it can.
ADJUST: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "brightness": lambda x, f, bound: x.mul_(f).clamp_(0, bound),
    "contrast": contrast,
    "saturation": lambda x, f, bound: x.lerp_(gray(x), 1 - f).clamp_(0, bound),
    "hue": hue,
}


def jitter(x: torch.Tensor, params: Params, out: torch.Tensor | None = None,
           unit: bool = False) -> torch.Tensor:
    """Each sample's factors (``ColorJitter.params``) in its own order, into ``out`` (default new;
    ``x`` works). On the CPU (:data:`BY_ORDER`) a block is :data:`CPU_BLOCK` bytes of samples
    sharing an order, adjusted while in cache; on a GPU, the whole batch (fewest launches).
    ``unit``: uint8 ``x`` is read as ``x.float() / 255`` into the float ``out`` (no extra pass)."""
    names, order = [k for k in params if k != "order"], params["order"]
    out = torch.empty_like(x) if out is None else out
    scaled = unit and x.dtype == torch.uint8
    bound = 255.0 if x.dtype == torch.uint8 and not scaled else 1.0
    if x.device.type in BY_ORDER:
        ids = (order * len(names) ** torch.arange(len(names))).sum(1)
        per = max(1, CPU_BLOCK // (4 * x[0:1].numel() + 1))
        blocks = [b for key in ids.unique() for b in (ids == key).nonzero().flatten().split(per)]
    else:
        blocks = [torch.arange(len(x))] if len(x) else []
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    buf = torch.empty((max(map(len, blocks), default=0), *x.shape[1:]), dtype=dtype,
                      device=x.device)
    for block in blocks:
        # rows copied in (to float) and back out (to the output's dtype) in one pass each
        at = block.tolist()
        run = slice(at[0], at[0] + len(at)) if at[-1] - at[0] == len(at) - 1 else None
        work = buf[: len(at)]
        for row, i in [(work, run)] if run else zip(work, at, strict=True):
            row.copy_(x[i])
        if scaled:
            work.mul_(1 / 255)
        orders = order[block].tolist()
        for pos in range(len(names)):
            for j, name in enumerate(names):
                rows = [r for r, o in enumerate(orders) if o[pos] == j]
                if not rows:
                    continue
                f = params[name][block].to(x.device, work.dtype).view(-1, 1, 1, 1)
                if len(rows) == len(work):
                    work = ADJUST[name](work, f, bound)
                else:
                    idx = torch.tensor(rows, device=x.device)
                    work.index_copy_(0, idx, ADJUST[name](work.index_select(0, idx), f[idx],
                                                          bound))
        if x.dtype == torch.uint8 and not scaled:
            work = work.round_().clamp_(0, 255)
        for row, i in [(work, run)] if run else zip(work, at, strict=True):
            out[i].copy_(row)
    return out
