"""Batch augmentations on the batch's device, with per-sample random parameters, vectorized:
``op(batch, generator) -> batch`` draws ``op.params`` from the CPU generator (so batches
reproduce and resume) and runs ``op.apply`` where the image is (float32, uint8 rounded once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

from ..errors import ConfigError, FeedpipeError, TransformError
from ..schema.fields import Field
from .foreign import batch_step
from .photometric import Params, from_work, gray, jitter, to_work

Batch = dict[str, Any]
Step = Callable[[Batch, torch.Generator], Batch]
_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_JITTER = ("brightness", "contrast", "saturation", "hue")
_JITTER_HOW = ("use b >= 0 (factors in [max(0, 1 - b), 1 + b]) or (min, max), 0 <= min <= max",
               "use h in [0, 0.5] (shifts in [-h, h] turns) or (min, max), -0.5 <= min <= max <= 0.5")


def _require(ok: bool, name: str, value: object, how: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {how}", option=name)


def _real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pair(v: object, lo: float, hi: float) -> bool:
    """Whether ``v`` is a (min, max) pair of numbers with lo <= min <= max <= hi."""
    return (isinstance(v, tuple) and len(v) == 2 and all(_real(a) for a in v)
            and lo <= v[0] <= v[1] <= hi)


def _rand(n: int | tuple[int, ...], generator: torch.Generator, lo: float = 0.0,
          hi: float = 1.0) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=generator, dtype=torch.float64)


def _image(batch: Batch, op: str, rgb: bool = False) -> torch.Tensor:
    """The batch's N×C×H×W uint8 or floating-point image; N×3×H×W where ``rgb``."""
    x = batch.get("image") if isinstance(batch, dict) else None
    if not (isinstance(x, torch.Tensor) and x.ndim == 4
            and (x.dtype == torch.uint8 or x.is_floating_point())):
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ConfigError(f"{op}: batch['image'] must be an N×C×H×W uint8 or floating-point "
                          f"tensor, got {got}")
    if rgb and x.shape[1] != 3:
        raise ConfigError(f"{op} needs RGB images (N×3×H×W), got shape {tuple(x.shape)}")
    return x


class _Drawn:
    """An operation that draws its parameters (``params``), then applies them (``apply``)."""

    params: Callable[[Batch, torch.Generator], Params]
    apply: Callable[..., Batch]

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        return self.apply(batch, self.params(batch, generator))


@dataclass(frozen=True)
class ColorJitter(_Drawn):
    """torchvision.transforms.v2.ColorJitter's factors, drawn (with their order) per sample, not
    per batch. A number b gives factors in [max(0, 1-b), 1+b] (hue h in [0, 0.5]: shifts in
    [-h, h] turns); a (min, max) pair gives the range; 0 skips it."""

    brightness: float | tuple[float, float] = 0.0
    contrast: float | tuple[float, float] = 0.0
    saturation: float | tuple[float, float] = 0.0
    hue: float | tuple[float, float] = 0.0

    def __post_init__(self) -> None:
        self.ranges()

    def ranges(self) -> dict[str, tuple[float, float]]:
        """The active factors' (min, max), in the order brightness, contrast, saturation, hue."""
        out = {}
        for name in _JITTER:
            value = given = getattr(self, name)
            center, lo, hi = (0.0, -0.5, 0.5) if name == "hue" else (1.0, 0.0, math.inf)
            if _real(value) and 0 <= value <= hi:
                value = (max(center - value, lo), center + value)
            _require(_pair(value, lo, hi), name, given, _JITTER_HOW[name == "hue"])
            if value != (center, center):
                out[name] = value
        return out

    def params(self, batch: Batch, generator: torch.Generator) -> Params:
        """Per sample, each active factor and ``order``, a permutation of their positions."""
        n = _image(batch, "ColorJitter", rgb=True).shape[0]
        ranges = self.ranges()
        p = {name: _rand(n, generator, lo, hi) for name, (lo, hi) in ranges.items()}
        p["order"] = torch.rand(n, len(ranges), generator=generator).argsort(dim=1)
        return p

    def apply(self, batch: Batch, params: Params, inplace: bool = False) -> Batch:
        x = _image(batch, "ColorJitter", rgb=True)
        return {**batch, "image": jitter(x, params, out=x if inplace else None)}


@dataclass(frozen=True)
class RandomGrayscale(_Drawn):
    """Each sample turned gray (torchvision's luma, in all three channels) with probability p."""

    p: float = 0.1

    def __post_init__(self) -> None:
        _require(_real(self.p) and 0 <= self.p <= 1, "p", self.p, "use a probability in [0, 1]")

    def params(self, batch: Batch, generator: torch.Generator) -> Params:
        n = _image(batch, "RandomGrayscale", rgb=True).shape[0]
        return {"gray": _rand(n, generator) < self.p}

    def apply(self, batch: Batch, params: Params, inplace: bool = False) -> Batch:
        x = _image(batch, "RandomGrayscale", rgb=True)
        out, rows = x if inplace else x.clone(), params["gray"].nonzero().flatten()
        if len(rows):
            idx = rows.to(x.device)
            luma = from_work(gray(to_work(x.index_select(0, idx))), x)
            out.index_copy_(0, idx, luma.expand(-1, 3, -1, -1))
        return {**batch, "image": out}


@dataclass(frozen=True)
class RandomErasing(_Drawn):
    """torchvision's RandomErasing per sample (its 10 tries drawn at once; no fit, no erasing):
    with probability p a box of area fraction in ``scale`` and aspect (height/width) in ``ratio``
    set to ``value`` (one number, or one per channel, in the image's units)."""

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | tuple[float, ...] = 0.0
    TRIES: ClassVar[int] = 10

    def __post_init__(self) -> None:
        _require(_real(self.p) and 0 <= self.p <= 1, "p", self.p, "use a probability in [0, 1]")
        _require(_pair(self.scale, 0, 1), "scale", self.scale,
                 "use a (min, max) pair of area fractions with 0 <= min <= max <= 1")
        _require(_pair(self.ratio, 1e-9, math.inf), "ratio", self.ratio,
                 "use a (min, max) pair of aspect ratios (height / width) with 0 < min <= max")
        ok = _real(self.value) or (isinstance(self.value, tuple) and len(self.value) > 0
                                   and all(_real(v) for v in self.value))
        _require(ok, "value", self.value, "use a number or a tuple of one number per channel")

    def params(self, batch: Batch, generator: torch.Generator) -> Params:
        """Per sample, ``box``: (top, left, height, width), height and width 0 where not erased."""
        n, _, h, w = _image(batch, "RandomErasing").shape
        shape, lr = (n, self.TRIES), [math.log(r) for r in self.ratio]
        area = h * w * _rand(shape, generator, *self.scale)
        aspect = torch.exp(_rand(shape, generator, *lr))
        bh, bw = (area * aspect).sqrt().round().long(), (area / aspect).sqrt().round().long()
        fits = (bh < h) & (bw < w)
        first = fits.to(torch.uint8).argmax(1, keepdim=True)  # the first try that fits
        keep = fits.any(1) & (_rand(n, generator) < self.p)
        bh, bw = bh.gather(1, first).squeeze(1) * keep, bw.gather(1, first).squeeze(1) * keep
        top = (_rand(n, generator) * (h - bh + 1)).long()
        left = (_rand(n, generator) * (w - bw + 1)).long()
        return {"box": torch.stack([top, left, bh, bw], 1)}

    def apply(self, batch: Batch, params: Params, inplace: bool = False) -> Batch:
        """Each erased box filled as a slice: no pass over the whole batch for a mask."""
        x = _image(batch, "RandomErasing")
        value = torch.as_tensor(self.value, dtype=torch.float64).to(x.dtype).to(x.device)
        if value.numel() not in (1, x.shape[1]):
            raise ConfigError(f"value={self.value!r}: give one number or {x.shape[1]} (one per "
                              f"channel of the batch's images)", option="value")
        out, fill = x if inplace else x.clone(), value.view(-1, 1, 1)
        box = params["box"]
        erased = (box[:, 2] * box[:, 3]).nonzero().flatten()
        for i, (top, left, bh, bw) in zip(erased.tolist(), box[erased].tolist(), strict=True):
            out[i, :, top: top + bh, left: left + bw] = fill
        return {**batch, "image": out}


def _beta(alpha: float, n: int, generator: torch.Generator) -> torch.Tensor:
    """n draws of Beta(alpha, alpha), seeded from ``generator`` (torch's Beta takes none)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.from_numpy(np.random.default_rng(seed).beta(alpha, alpha, n))


def _soft_labels(batch: Batch, num_classes: int, op: str) -> torch.Tensor:
    """N×num_classes float rows: one-hot for int labels, as they are for soft ones (mixed)."""
    y = batch.get("label")
    if isinstance(y, torch.Tensor) and y.is_floating_point() and y.shape[1:] == (num_classes,):
        return y
    if not (isinstance(y, torch.Tensor) and y.ndim == 1 and y.dtype in _INTS):
        got = f"{y.dtype} {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ConfigError(f"{op}: batch['label'] must be N integer labels or N×{num_classes} "
                          f"soft labels, got {got}")
    bad = (y < 0) | (y >= num_classes)
    if bool(bad.any()):  # one sync: a device-side assert in one_hot would kill the CUDA context
        raise ConfigError(f"num_classes={num_classes}: {op} got label {int(y[bad][0])}; use the "
                          f"dataset's number of classes", option="num_classes")
    return torch.nn.functional.one_hot(y.long(), num_classes).float()


@dataclass(frozen=True)
class _Mix(_Drawn):
    alpha: float
    num_classes: int
    per_sample: bool = False  # one lambda per sample instead of torchvision's one per batch

    def __post_init__(self) -> None:
        _require(_real(self.alpha) and self.alpha > 0, "alpha", self.alpha,
                 "use a number > 0 (lambda ~ Beta(alpha, alpha))")
        _require(isinstance(self.num_classes, int) and not isinstance(self.num_classes, bool)
                 and self.num_classes >= 1, "num_classes", self.num_classes,
                 "use the dataset's number of classes, an int >= 1")
        _require(isinstance(self.per_sample, bool), "per_sample", self.per_sample,
                 "use True or False")

    def _mixed(self, batch: Batch, image: torch.Tensor, lam: torch.Tensor) -> Batch:
        """The batch with ``image`` and the labels mixed with the previous sample's by ``lam``."""
        y = _soft_labels(batch, self.num_classes, type(self).__name__)
        lam = lam.to(y.device, y.dtype).view(-1, 1)
        return {**batch, "image": image, "label": y * lam + y.roll(1, 0) * (1 - lam)}


@dataclass(frozen=True)
class MixUp(_Mix):
    """torchvision's MixUp: each image blended with the previous one in the batch as
    lam·x + (1-lam)·x_prev, lam ~ Beta(alpha, alpha) per batch (``per_sample=True``: per sample);
    labels become soft rows mixed alike."""

    def params(self, batch: Batch, generator: torch.Generator) -> Params:
        n = _image(batch, "MixUp").shape[0] if self.per_sample else 1
        return {"lam": _beta(self.alpha, n, generator)}

    def apply(self, batch: Batch, params: Params, inplace: bool = False) -> Batch:
        x = _image(batch, "MixUp")
        work = to_work(x)
        lam = params["lam"].to(x.device, work.dtype).view(-1, 1, 1, 1)
        return self._mixed(batch, from_work(torch.lerp(work.roll(1, 0), work, lam), x),
                           params["lam"])


@dataclass(frozen=True)
class CutMix(_Mix):
    """torchvision's CutMix: a box of the previous image pasted into each (one box per batch, or
    per sample with ``per_sample=True``); labels mixed by the kept area."""

    def params(self, batch: Batch, generator: torch.Generator) -> Params:
        """``box`` (top, left, height, width) and ``lam``, the area fraction kept."""
        n, _, h, w = _image(batch, "CutMix").shape
        n = n if self.per_sample else 1
        r = 0.5 * (1 - _beta(self.alpha, n, generator)).sqrt()
        cy, cx = (_rand(n, generator) * h).floor(), (_rand(n, generator) * w).floor()
        y1, y2 = (cy - (r * h).floor()).clamp(min=0), (cy + (r * h).floor()).clamp(max=h)
        x1, x2 = (cx - (r * w).floor()).clamp(min=0), (cx + (r * w).floor()).clamp(max=w)
        return {"box": torch.stack([y1, x1, y2 - y1, x2 - x1], 1).long(),
                "lam": 1 - (y2 - y1) * (x2 - x1) / (h * w)}

    def apply(self, batch: Batch, params: Params, inplace: bool = False) -> Batch:
        x = _image(batch, "CutMix")
        top, left, bh, bw = params["box"].to(x.device).unbind(1)  # an n×1×H×W mask of the boxes
        rows, cols = (torch.arange(n, device=x.device) for n in x.shape[2:])
        in_rows = (rows >= top[:, None]) & (rows < (top + bh)[:, None])
        in_cols = (cols >= left[:, None]) & (cols < (left + bw)[:, None])
        mask = (in_rows[:, :, None] & in_cols[:, None, :]).unsqueeze(1)
        return self._mixed(batch, torch.where(mask, x.roll(1, 0), x), params["lam"])


@dataclass(frozen=True)
class BatchOps:
    """Steps run in order on each batch: built-in operations, a Kornia or torchvision.v2
    augmentation or the user's own ``fn(batch, generator) -> batch``; a step's error is a
    TransformError naming it. ``owns_input``: the caller hands ``batch["image"]`` over, so a
    first built-in step adjusts it in place too."""

    steps: tuple[Step, ...]
    owns_input: bool = False

    def __post_init__(self) -> None:
        _require(isinstance(self.steps, (list, tuple)) and len(self.steps) > 0, "steps",
                 self.steps, "use a non-empty list of operations")
        for i, step in enumerate(self.steps):
            _require(callable(step), f"steps[{i}]", step,
                     "use a built-in operation or a function fn(batch, generator) -> batch")
        _require(isinstance(self.owns_input, bool), "owns_input", self.owns_input,
                 "use True or False")
        object.__setattr__(self, "steps", tuple(self.steps))

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        # the image an earlier built-in step made (or handed over): the next adjusts it in place
        made = batch.get("image") if self.owns_input and isinstance(batch, dict) else None
        for i, step in enumerate(self.steps):
            name = f"steps[{i}] ({getattr(step, '__qualname__', type(step).__name__)})"
            try:
                if isinstance(step, _INPLACE) and made is not None and batch.get("image") is made:
                    out = step.apply(batch, step.params(batch, generator), inplace=True)
                else:
                    out = step(batch, generator)
            except FeedpipeError:
                raise
            except Exception as exc:
                raise TransformError(f"batch operation {name} raised {type(exc).__name__}: "
                                     f"{exc}") from exc
            if not isinstance(out, dict):
                raise TransformError(f"batch operation {name} returned {type(out).__name__}; "
                                     "return the batch dict")
            batch = out
            made = out.get("image") if isinstance(step, _Drawn) else None
        return batch


_INPLACE = (ColorJitter, RandomGrayscale, RandomErasing)  # apply(inplace=True) adjusts the image


def batch_ops(spec: Any, fields: Sequence[Field] | None = None) -> BatchOps | None:
    """``make_loader(batch_transforms=...)`` (None, a step, a list or a BatchOps) as the loader's
    pipeline, which owns its input; Kornia and torchvision steps adapted to ``fields``."""
    if spec is None:
        return None
    steps = spec.steps if isinstance(spec, BatchOps) else \
        tuple(spec) if isinstance(spec, (list, tuple)) else (spec,)
    return BatchOps(tuple(batch_step(s, fields) for s in steps), owns_input=True)
