"""The parameters of a random affine transform (:class:`RandomAffine`) and its matrix, without
torch (the config checks an ``affine=`` option against it; :mod:`.affine` executes it)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Union

import numpy as np

from ..errors import ConfigError

#: a 2×3 affine matrix (a, b, c, d, e, f): x' = a·x + b·y + c, y' = d·x + e·y + f
Matrix = tuple[float, float, float, float, float, float]

Range = tuple[float, float]
Fill = Union[int, tuple[int, int, int]]


def _pair(name: str, value: object, *, lo: float | None = None, hi: float | None = None,
          symmetric: bool = False) -> Range:
    """A (min, max) range: a number means (-v, v) where ``symmetric``; checked against bounds."""
    if symmetric and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"affine: {name}={value!r}: a single number must be >= 0 (it "
                              f"means the range (-{name}, {name}))", option="affine")
        return (-float(value), float(value))
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)):
        raise ConfigError(f"affine: {name}={value!r}: use a (min, max) pair of numbers"
                          + (" or one number" if symmetric else ""), option="affine")
    a, b = float(value[0]), float(value[1])
    if not (a <= b and (lo is None or a >= lo) and (hi is None or b <= hi)):
        bounds = f" within [{lo}, {hi}]" if lo is not None or hi is not None else ""
        raise ConfigError(f"affine: {name}={value!r}: use min <= max{bounds}", option="affine")
    return a, b


@dataclass(frozen=True)
class RandomAffine:
    """torchvision ``RandomAffine``'s parameters and draws, per sample (after the crop and flip),
    executed bilinearly in the crop's own resampling; keypoints, boxes, masks and targets follow.

    - ``degrees``: rotation range in degrees, clockwise on screen (y down); ``d`` means (-d, d).
    - ``translate``: (a, b): shifts in ±a·width and ±b·height, rounded to whole pixels.
    - ``scale``: (min, max) zoom factor (> 1 zooms in); None: 1.
    - ``shear``: ``s`` or (min, max): x shear in degrees; (xmin, xmax, ymin, ymax): both.
    - ``fill``: image value (one level or RGB) where the transform brings in nothing;
      ``mask_fill``: the mask's (and integer targets') value there; float targets get 0.
    """

    degrees: float | tuple[float, float]
    translate: tuple[float, float] | None = None
    scale: tuple[float, float] | None = None
    shear: float | tuple[float, float] | tuple[float, float, float, float] | None = None
    fill: Fill = 0
    mask_fill: int = 0

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "degrees", _pair("degrees", self.degrees, symmetric=True))
        if self.translate is not None:
            put(self, "translate", _pair("translate", self.translate, lo=0.0, hi=1.0))
        if self.scale is not None:
            put(self, "scale", _pair("scale", self.scale, lo=1e-6))
        if self.shear is not None:
            s = self.shear
            if isinstance(s, (tuple, list)) and len(s) == 4:
                put(self, "shear", (*_pair("shear", s[:2], lo=-89.0, hi=89.0),
                                    *_pair("shear", s[2:], lo=-89.0, hi=89.0)))
            else:
                put(self, "shear", (*_pair("shear", s, lo=-89.0, hi=89.0, symmetric=True),
                                    0.0, 0.0))
        fill = self.fill
        fills = (fill,) * 3 if isinstance(fill, int) and not isinstance(fill, bool) else fill
        if not (isinstance(fills, (tuple, list)) and len(fills) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255
                        for v in fills)):
            raise ConfigError(f"affine: fill={fill!r}: use a level 0..255 or an (R, G, B) "
                              "triple of them", option="affine")
        put(self, "fill", tuple(fills))
        if not isinstance(self.mask_fill, int) or isinstance(self.mask_fill, bool):
            raise ConfigError(f"affine: mask_fill={self.mask_fill!r}: use an int (a class index)",
                              option="affine")

    def draw(self, rng: np.random.Generator, oh: int, ow: int) -> Matrix | None:
        """This sample's forward matrix on an ``oh``×``ow`` canvas, or None for the identity:
        draws in torchvision's order (angle, translation, scale, shear x and y); a fixed value
        draws nothing, so ``RandomAffine(0)`` leaves every crop and flip as it was."""
        lo, hi = self.degrees  # type: ignore[misc]
        angle = _uniform(rng, lo, hi)
        tx = ty = 0
        if self.translate is not None:
            dx, dy = self.translate[0] * ow, self.translate[1] * oh
            tx, ty = int(round(_uniform(rng, -dx, dx))), int(round(_uniform(rng, -dy, dy)))
        s = 1.0 if self.scale is None else _uniform(rng, *self.scale)
        shx = shy = 0.0
        if self.shear is not None:
            x0, x1, y0, y1 = self.shear  # type: ignore[misc]
            shx, shy = _uniform(rng, x0, x1), _uniform(rng, y0, y1)
        if angle == 0 and tx == 0 and ty == 0 and s == 1 and shx == 0 and shy == 0:
            return None
        return affine_matrix(angle, (tx, ty), s, (shx, shy), (ow / 2, oh / 2))


def _uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """numpy's ``uniform(lo, hi)`` without its parsing; a fixed value takes nothing from ``rng``."""
    return lo if lo == hi else lo + (hi - lo) * rng.random()


def affine_matrix(angle: float, translate: tuple[float, float], scale: float,
                  shear: tuple[float, float], center: tuple[float, float]) -> Matrix:
    """Forward matrix T · C · R(angle) · S(scale) · SHy · SHx · C⁻¹ (torchvision's
    ``_get_inverse_affine_matrix(..., inverted=False)``, angles in degrees)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -a * math.tan(sx) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    a, b, c, d = a * scale, b * scale, c * scale, d * scale
    cx, cy = center
    return (a, b, cx + translate[0] - a * cx - b * cy, c, d, cy + translate[1] - c * cx - d * cy)
