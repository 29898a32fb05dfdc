"""A sample's geometry, decided once (:meth:`Framing.plan`, from the header's size and the batch's
seeded generator: box, then flip) and executed by every decoder (``transforms.ImageOp``, nvJPEG,
DALI's ``PlanSource``), so the same (seed, epoch, rank, batch) gives the same crops on each."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, TypeVar

import numpy as np

from .affine_params import Matrix
from .config import Crop, LoaderConfig

Box = tuple[int, int, int, int]  # top, left, height, width
CROP_ATTEMPTS = 10  # random-resized-crop draws before a centre crop (torchvision's, DALI's)
DCT_MARGIN = 1.5  # the DCT-downscaled crop stays this many times the output (see _dct_factor)


class Geometry(NamedTuple):
    """Where a sample's output comes from: a source box, a flip, the DCT downscale a decoder may
    use, the affine after the flip; ``ImageOp.apply`` returns it snapped to the scale decoded."""

    top: int
    left: int
    height: int
    width: int
    flip: bool
    dct: int = 1
    fallback: bool = False  # decoded by Pillow because simplejpeg refused the JPEG
    affine: Matrix | None = None

    def scaled(self, f: int) -> Box:
        """The box on the pixel grid of a decode at 1/``f`` scale."""
        return self.top // f, self.left // f, self.height // f, self.width // f

    def snapped(self, f: int) -> Geometry:
        """This geometry as a decode at 1/``f`` scale executes it, in source pixels."""
        if f == 1 and self.dct == 1:  # the common full-size decode: already on the grid
            return self
        top, left, h, w = self.scaled(f)
        return self._replace(top=top * f, left=left * f, height=h * f, width=w * f, dct=f)


_F = TypeVar("_F", bound="Framing")


@dataclass(frozen=True)
class Framing:
    """Output size and crop / flip policy: the one place a sample's geometry is decided."""

    size: tuple[int, int] | None
    crop: Crop = "center_crop"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    dct_margin: float = DCT_MARGIN  # see _dct_factor

    @classmethod
    def of(cls: type[_F], cfg: LoaderConfig) -> _F:
        """The loader configuration's framing."""
        crop = cfg.random_resized_crop
        return cls(cfg.size, cfg.crop, crop.scale, crop.ratio, cfg.flip)

    @property
    def random(self) -> bool:
        """Whether plans draw from the generator (else they take none: pass ``rng=None``)."""
        return self.flip or self.crop == "random_resized_crop"

    def plan(self, h: int, w: int, rng: np.random.Generator | None) -> Geometry:
        """The geometry of an ``h``×``w`` source: box (seeded draws), then flip (one draw)."""
        top, left, ch, cw = self.box(h, w, rng)
        flip = self.flip and rng is not None and rng.random() < 0.5
        f = self._dct_factor(ch, cw, self.size, self.dct_margin) if self.size else 1
        return Geometry(top, left, ch, cw, flip, f)

    def check_fits(self, h: int, w: int, what: str, kind: str = "image",
                   out: tuple[int, ...] | None = None) -> None:
        """crop="none" resizes nothing: refuse a source of another size than the batch's
        (``out``, default ``size``)."""
        out = out or self.size
        if self.crop == "none" and out is not None and (h, w) != tuple(out[:2]):
            raise ValueError(f"{what}: {kind} is {w}x{h}, batch is {out[1]}x{out[0]}; pass "
                             "size=... to resize")

    def box(self, h: int, w: int, rng: np.random.Generator | None) -> Box:
        """The source region to resize to the output, in source pixels."""
        if self.crop in ("resize", "none") or self.size is None:
            return 0, 0, h, w
        oh, ow = self.size
        if self.crop == "random_resized_crop" and rng is not None:
            area = h * w
            (s_lo, s_span), (r_lo, r_span) = self._draw_ranges
            for _ in range(CROP_ATTEMPTS):  # torchvision's RandomResizedCrop.get_params
                # lo + span * random() is numpy's uniform(lo, hi) bit for bit, without its parsing
                target = area * (s_lo + s_span * rng.random())
                aspect = math.exp(r_lo + r_span * rng.random())
                cw = int(round(math.sqrt(target * aspect)))
                ch = int(round(math.sqrt(target / aspect)))
                if 0 < cw <= w and 0 < ch <= h:
                    return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
            in_ratio = w / h
            if in_ratio < self.ratio[0]:
                cw, ch = w, int(round(w / self.ratio[0]))
            elif in_ratio > self.ratio[1]:
                ch, cw = h, int(round(h * self.ratio[1]))
            else:
                ch, cw = h, w
            return (h - ch) // 2, (w - cw) // 2, ch, cw
        # center crop of the output's aspect ratio (= resize shorter side, then crop)
        if w * oh > h * ow:
            ch, cw = h, max(1, round(h * ow / oh))
        else:
            ch, cw = max(1, round(w * oh / ow)), w
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    @cached_property
    def _draw_ranges(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """(low, high - low) of the area fraction and of the log aspect ratio drawn uniformly."""
        log_r = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        return (self.scale[0], self.scale[1] - self.scale[0]), (log_r[0], log_r[1] - log_r[0])

    @staticmethod
    def _dct_factor(ch: int, cw: int, out_hw: tuple[int, ...], margin: float = DCT_MARGIN) -> int:
        """Largest power-of-two DCT downscale (≤ 8) keeping the scaled crop ``margin`` times the
        output on both sides, so the antialiased resize still does part of the reduction (the
        margin by measured error: benchmarks/dct_fidelity.py, RESULTS.md section 14)."""
        f = 1
        while f < 8 and ch // (2 * f) >= margin * out_hw[0] and cw // (2 * f) >= margin * out_hw[1]:
            f *= 2
        return f
