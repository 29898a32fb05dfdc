"""The photometric kernels of :mod:`.augment` on N×C×H×W float batches: brightness, contrast,
saturation and hue with torchvision.transforms.v2's formulas, the luma, and the two ways of giving
each sample its own order of them: by groups sharing an order (the CPU: fewest passes over
memory) or by position in the order (a GPU: fewest kernel launches). Their ``params`` are
:meth:`.augment.ColorJitter.params`: a factor per sample for each active name, and ``order``.
"""

from __future__ import annotations

from typing import Callable

import torch

GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma)
CPU_BLOCK = 1 << 20  # bytes of float images adjusted at a time on the CPU: in a core's L2
Params = dict[str, torch.Tensor]  # drawn parameters: CPU tensors, a row per sample


def to_work(x: torch.Tensor, nchw: bool = False) -> torch.Tensor:
    """``x`` in the float dtype to compute in (float32, or x's own float64); ``nchw``: a new
    N×C×H×W-contiguous copy, where the CPU's per-channel and per-sample indexing is fast."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.to(dtype, memory_format=torch.contiguous_format, copy=True) if nchw else x.to(dtype)


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
    """Blend with the mean of the luma (that is, the luma of the channel means): f·x + (1-f)·m
    as a multiply and an add (``lerp_`` towards an N×1×1×1 end takes torch's slow broadcasting
    path, ~4× the time on the CPU)."""
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


def jitter_by_order(x: torch.Tensor, params: Params, out: torch.Tensor | None = None,
                    unit: bool = False) -> torch.Tensor:
    """Samples sharing an order (at most 24 orders), :data:`CPU_BLOCK` bytes of them at a time:
    each block converted, adjusted and written back while it is in the cache, into ``out`` (a
    new tensor by default; ``x`` itself works: each block reads and writes only its rows). One
    work buffer serves every block, and each row is copied in (converted to float N×C×H×W) and
    back out (to the output's dtype and layout) in one pass each: gathering, converting and
    scattering whole blocks took a pass and a fresh allocation each. ``unit``: uint8 ``x`` is
    read as ``x.float() * (1 / 255)`` (the values of the float image made from it), adjusted in
    [0, 1] and written into the float ``out``: the loader's float image without a pass of its
    own, and a quarter of the bytes read."""
    names, order = [k for k in params if k != "order"], params["order"]
    out = torch.empty_like(x) if out is None else out
    scaled = unit and x.dtype == torch.uint8
    bound = 255.0 if x.dtype == torch.uint8 and not scaled else 1.0
    ids = (order * len(names) ** torch.arange(len(names))).sum(1)
    per = max(1, CPU_BLOCK // (4 * x[0:1].numel() + 1))
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    buf = torch.empty((min(per, len(x)), *x.shape[1:]), dtype=dtype, device=x.device)
    for key in ids.unique().tolist():
        rows = (ids == key).nonzero().flatten()
        for block in rows.split(per):
            at = block.tolist()
            work = buf[: len(at)]
            for row, i in zip(work, at):
                row.copy_(x[i])
            if scaled:
                work.mul_(1 / 255)
            for j in order[at[0]].tolist():
                f = params[names[j]][block].to(x.device, work.dtype).view(-1, 1, 1, 1)
                work = ADJUST[names[j]](work, f, bound)
            if x.dtype == torch.uint8 and not scaled:
                work = work.round_().clamp_(0, 255)
            for row, i in zip(work, at):
                out[i].copy_(row)
    return out


def jitter_by_position(x: torch.Tensor, params: Params, out: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """At each position in the order, each factor on the samples that apply it there, gathered
    and written back: m² steps of few kernels each, where the CPU way would launch up to 24·m.
    The result is a new tensor, or written into ``out``."""
    names, order = [k for k in params if k != "order"], params["order"]
    work, bound = to_work(x, nchw=True), 255.0 if x.dtype == torch.uint8 else 1.0
    for pos in range(len(names)):
        for j, name in enumerate(names):
            rows = (order[:, pos] == j).nonzero().flatten()  # on the CPU: no device sync
            f = params[name][rows].to(x.device, work.dtype).view(-1, 1, 1, 1)
            if len(rows) == len(work):
                work = ADJUST[name](work, f, bound)
            elif len(rows):
                idx = rows.to(x.device)
                work.index_copy_(0, idx, ADJUST[name](work.index_select(0, idx), f, bound))
    return from_work(work, x) if out is None else out.copy_(from_work(work, x))
