"""Targets computed once from each mask at conversion time and stored beside the image: a function
``mask -> ndarray`` plus how to store and resample it (the built-ins: docs/convert.md)."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Literal

import numpy as np

from feedpipe.errors import ConfigError
from feedpipe.schema.masks import TargetField

TargetFn = Callable[[np.ndarray], np.ndarray]
StoreDtype = Literal["float16", "float32", "uint8", "uint16"]


@dataclass(frozen=True)
class Target:
    """A target computation and its storage; ``fn`` is module level, for the worker processes."""

    name: str
    fn: TargetFn
    dtype: StoreDtype = "float16"
    channels: int | None = None
    interp: Literal["linear", "nearest"] = "linear"
    rescale: Literal["distance", "none"] = "none"
    bound: tuple[float, float] | None = None  # value range: clip after rescale, quantization range
    params: dict[str, Any] = field(default_factory=dict)
    spec: str = ""  # "distance_map" or "module:function": how it was chosen, for the manifest

    def __post_init__(self) -> None:
        if self.dtype not in ("float16", "float32", "uint8", "uint16"):
            raise ConfigError(f"target {self.name!r}: dtype {self.dtype!r}: use float16, float32, "
                              "uint8 or uint16")
        quantized = self.dtype in ("uint8", "uint16") and self.interp == "linear"
        if quantized and self.bound is None:
            raise ConfigError(f"target {self.name!r}: {self.dtype} storage quantizes a bounded "
                              "range; set truncate=... or normalize=True (or store float16)")

    @property
    def scale_offset(self) -> tuple[float, float]:
        """Dequantization: value = stored × scale + offset (identity for floats and labels)."""
        if self.dtype in ("float16", "float32") or self.interp == "nearest" or self.bound is None:
            return 1.0, 0.0
        lo, hi = self.bound
        return (hi - lo) / np.iinfo(self.dtype).max, lo

    def field(self) -> TargetField:
        """The schema field this target is stored as."""
        scale, offset = self.scale_offset
        shape = (None, None) if self.channels is None else (None, None, self.channels)
        return TargetField(self.name, np.dtype(self.dtype).str, shape,
                           target=self.spec or self.name, params=self.params, interp=self.interp,
                           rescale=self.rescale, scale=scale, offset=offset,
                           clip=self.bound if self.rescale == "distance" else None)

    def compute(self, mask: np.ndarray, what: str) -> np.ndarray:
        """Run the function on one mask and convert the result to the stored dtype."""
        out = np.asarray(self.fn(mask))
        want = mask.shape if self.channels is None else (*mask.shape, self.channels)
        if out.shape != want:
            raise ConfigError(f"{what}: target {self.name!r} returned shape {out.shape}, expected "
                              f"{want}")
        if out.dtype.kind not in "biuf":
            raise ConfigError(f"{what}: target {self.name!r} returned dtype {out.dtype}")
        return self.quantize(out)

    def quantize(self, values: np.ndarray) -> np.ndarray:
        dt = np.dtype(self.dtype)
        if dt.kind == "f":
            out = values.astype(dt)
            if not np.isfinite(out).all():
                raise ConfigError(f"target {self.name!r}: values overflow {dt} (or are NaN/inf)")
            return out
        scale, offset = self.scale_offset
        if scale == 1.0 and offset == 0.0:  # integer-valued target (labels, boundaries)
            info = np.iinfo(dt)
            if values.size and (values.min() < info.min or values.max() > info.max):
                raise ConfigError(f"target {self.name!r}: values outside {dt} range")
            return values.astype(dt)
        q = np.rint((values.astype(np.float64) - offset) / scale)
        return np.clip(q, 0, np.iinfo(dt).max).astype(dt)


def _signed_distance(obj: np.ndarray, cap: float) -> np.ndarray:
    """±(EDT to the other side − 0.5): negative inside ``obj``; ``cap`` where there is no edge."""
    if obj.all():
        return np.full(obj.shape, -cap, np.float32)
    if not obj.any():
        return np.full(obj.shape, cap, np.float32)
    from scipy import ndimage  # here, not at the top: it costs every conversion ~0.25 s to import

    outside = ndimage.distance_transform_edt(~obj)
    inside = ndimage.distance_transform_edt(obj)
    return np.where(obj, 0.5 - inside, outside - 0.5).astype(np.float32)


def distance_map(mask: np.ndarray, *, signed: bool = False, per_class: bool = False,
                 num_classes: int | None = None, truncate: float | None = None,
                 normalize: bool = False) -> np.ndarray:
    """Distance to the nearest object boundary (defined in docs/convert.md)."""
    mask = np.asarray(mask)
    cap = float(truncate) if truncate is not None else math.hypot(*mask.shape)
    if per_class:
        if num_classes is None or num_classes < 2:
            raise ConfigError("distance_map per_class needs num_classes >= 2 (class 0 is the "
                              "background, one channel per class 1..K-1)")
        d = np.stack([_signed_distance(mask == k, cap) for k in range(1, num_classes)], axis=-1)
    else:
        d = _signed_distance(mask > 0, cap)
    if not signed:
        d = np.abs(d)
    if truncate is not None:
        d = np.clip(d, -cap, cap)
    if normalize:
        d = d / np.float32(cap)
    return d.astype(np.float32)


def boundary(mask: np.ndarray, *, width: float = 1) -> np.ndarray:
    """1 where a labelled pixel lies within ``width`` px of a pixel with another label."""
    mask = np.asarray(mask)
    r = int(math.floor(width))
    yy, xx = np.mgrid[-r: r + 1, -r: r + 1]
    disk = (yy * yy + xx * xx) <= width * width
    from scipy import ndimage

    hi = ndimage.grey_dilation(mask, footprint=disk, mode="nearest")
    lo = ndimage.grey_erosion(mask, footprint=disk, mode="nearest")
    return ((hi != lo) & (mask != 0)).astype(np.uint8)


def make_distance_map(*, signed: bool = False, per_class: bool = False,
                      num_classes: int | None = None, truncate: float | None = None,
                      normalize: bool = False, dtype: StoreDtype = "float16",
                      name: str = "distance_map") -> Target:
    """The ``distance_map`` target with its parameters, storage and resampling rules."""
    if truncate is not None and truncate <= 0:
        raise ConfigError(f"distance_map truncate={truncate}: use a positive distance in pixels")
    params = {"signed": signed, "per_class": per_class, "num_classes": num_classes,
              "truncate": truncate, "normalize": normalize}
    fn = partial(distance_map, **params)
    if per_class:
        fn(np.zeros((1, 1), np.uint8))  # validates num_classes up front
    bound: tuple[float, float] | None = None
    if truncate is not None or normalize:
        hi = 1.0 if normalize else float(truncate)  # type: ignore[arg-type]
        bound = (-hi if signed else 0.0, hi)
    return Target(name, fn, dtype, num_classes - 1 if per_class else None,  # type: ignore[operator]
                  "linear", "distance", bound, {**params, "dtype": dtype}, "distance_map")


def make_boundary(*, width: float = 1, name: str = "boundary") -> Target:
    """The ``boundary`` target (uint8 0/1, nearest-neighbour resampling)."""
    if width <= 0:
        raise ConfigError(f"boundary width={width}: use a positive width in pixels")
    return Target(name, partial(boundary, width=width), "uint8", None, "nearest", "none", None,
                  {"width": width}, "boundary")


BUILTINS: dict[str, Callable[..., Target]] = {"distance_map": make_distance_map,
                                               "boundary": make_boundary}


def user_target(name: str, obj: TargetFn | Target | str) -> Target:
    """A user target from a function (stored float16, resampled linearly), a :class:`Target`, or
    a ``"package.module:function"`` spec."""
    spec = ""
    if isinstance(obj, str):
        spec = obj
        mod, _, attr = obj.partition(":")
        if not mod or not attr:
            raise ConfigError(f"--target {name}={obj}: use name=package.module:function")
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--target {name}={spec}: cannot import: {exc}") from exc
    if isinstance(obj, Target):
        return obj if obj.name == name else Target(**{**obj.__dict__, "name": name})
    if not callable(obj):
        raise ConfigError(f"target {name!r}: {obj!r} is not a function or a Target")
    spec = spec or f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', '?')}"
    return Target(name, obj, spec=spec)
