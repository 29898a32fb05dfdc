"""Decode and geometric augmentation of one image straight into its slot of the batch buffer,
and the same geometry applied to the sample's mask (nearest) and per-pixel targets.

The fastest JPEG path installed is used (``imaging.jpeg_path``): with pillow-simd, Pillow's
``draft`` (DCT-domain 1/2-1/4-1/8 downscale) plus its SIMD resize of the crop box; otherwise
simplejpeg (libjpeg-turbo) with the same power-of-two DCT downscale (libjpeg-turbo's other M/8
factors decode slower than full size) followed by torch's uint8 antialiased bilinear resize, which
matches Pillow's BILINEAR and runs several times faster than stock Pillow's resize.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..imaging import decode_rgb, jpeg_path, simplejpeg
from ..schema import TargetField
from .config import Crop

JPEG_PATH = jpeg_path()

Box = tuple[int, int, int, int]  # top, left, height, width


class Geometry(NamedTuple):
    """Where a sample's output came from: a box of the full-resolution source and a flip.

    The image's DCT downscale snaps the box to its scaled pixel grid; the snapped box is what is
    recorded, so the mask and targets are cut from exactly the region the image shows.
    """

    top: int
    left: int
    height: int
    width: int
    flip: bool


@dataclass(frozen=True)
class ImageOp:
    """Output size and crop policy; :meth:`apply` fills one H×W×3 uint8 slot."""

    size: tuple[int, int] | None
    crop: Crop = "center_crop"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False

    @property
    def random(self) -> bool:
        return self.flip or self.crop == "random_resized_crop"

    def box(self, h: int, w: int, rng: np.random.Generator | None) -> Box:
        """The source region to resize to the output, in source pixels."""
        if self.crop in ("resize", "none") or self.size is None:
            return 0, 0, h, w
        oh, ow = self.size
        if self.crop == "random_resized_crop" and rng is not None:
            area = h * w
            log_r = (math.log(self.ratio[0]), math.log(self.ratio[1]))
            for _ in range(10):  # torchvision's RandomResizedCrop.get_params
                target = area * rng.uniform(*self.scale)
                aspect = math.exp(rng.uniform(*log_r))
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

    def apply(self, stored: object, codec: str, out: np.ndarray,
              rng: np.random.Generator | None, what: str) -> Geometry:
        """Decode ``stored`` (encoded bytes or a raw H×W×3 array) and write it into ``out``."""
        f = 1
        if codec == "raw":
            src = stored
            if src.shape == out.shape and not self.random:  # decode-free: one copy
                np.copyto(out, src)
                return Geometry(0, 0, src.shape[0], src.shape[1], False)
            top, left, ch, cw = self.box(src.shape[0], src.shape[1], rng)
        elif codec == "jpeg" and JPEG_PATH == "pillow-simd":
            return self._apply_pil(stored, out, rng)
        elif codec == "jpeg" and simplejpeg is not None:
            h, w = simplejpeg.decode_jpeg_header(stored)[:2]
            top, left, ch, cw = self.box(h, w, rng)
            f = self._dct_factor(ch, cw, out.shape[:2])
            if f > 1:  # scaled pixel i covers source pixels [i*f, (i+1)*f): the box snaps to it
                src = simplejpeg.decode_jpeg(stored, colorspace="RGB", min_factor=f,
                                             min_height=-(-h // f), min_width=-(-w // f))
                top, left, ch, cw = top // f, left // f, ch // f, cw // f
            else:
                src = simplejpeg.decode_jpeg(stored, colorspace="RGB")
        else:
            src = decode_rgb(stored, codec, what)
            top, left, ch, cw = self.box(src.shape[0], src.shape[1], rng)
        flip = self.flip and rng is not None and rng.random() < 0.5
        region = src[top: top + ch, left: left + cw]
        if region.shape[:2] != out.shape[:2]:
            if self.crop == "none":
                raise ValueError(f"{what}: image is {src.shape[1]}x{src.shape[0]}, batch is "
                                 f"{out.shape[1]}x{out.shape[0]}; pass size=... to resize")
            region = _resize(region, out.shape[:2], antialias=True)
        np.copyto(out, region[:, ::-1] if flip else region)
        return Geometry(top * f, left * f, ch * f, cw * f, flip)

    def plan(self, h: int, w: int, rng: np.random.Generator | None) -> Geometry:
        """The geometry for a sample without an image field (masks or targets alone)."""
        top, left, ch, cw = self.box(h, w, rng)
        return Geometry(top, left, ch, cw, self.flip and rng is not None and rng.random() < 0.5)

    def apply_mask(self, mask: np.ndarray, geo: Geometry, out: np.ndarray, what: str) -> None:
        """Cut ``geo`` from an H×W mask and resize nearest-neighbour (pixel centres) into ``out``."""
        region = mask[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
        if region.shape != out.shape:
            if self.crop == "none":
                raise ValueError(f"{what}: mask is {mask.shape[1]}x{mask.shape[0]}, batch is "
                                 f"{out.shape[1]}x{out.shape[0]}; pass size=... to resize")
            region = _nearest(region, out.shape)
        np.copyto(out, region[:, ::-1] if geo.flip else region)

    def apply_target(self, arr: np.ndarray, field: TargetField, geo: Geometry, out: np.ndarray,
                     what: str) -> None:
        """Cut ``geo`` from an H×W(×C) target, resample it as ``field.interp`` says, dequantize,
        rescale distances by the geometric scale (the geometric mean of the two axes' scales,
        exact when they are equal) and re-clip them to the truncation bounds, and write it into
        ``out`` (float, or the stored integer dtype for label-like targets).

        "linear" is bilinear interpolation at pixel centres without antialiasing: distance maps
        are smooth (1-Lipschitz), so point sampling is accurate and ~3× cheaper than an
        antialiased resize."""
        region = arr[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
        hw = out.shape[:2]
        if region.shape[:2] != hw and self.crop == "none":
            raise ValueError(f"{what}: target is {arr.shape[1]}x{arr.shape[0]}, batch is "
                             f"{hw[1]}x{hw[0]}; pass size=... to resize")
        if field.interp == "nearest":
            if region.shape[:2] != hw:
                region = _nearest(region, hw)
            region = region[:, ::-1] if geo.flip else region
            if out.dtype == region.dtype:
                np.copyto(out, region)
            else:
                np.copyto(out, region.astype(np.float32) * np.float32(field.scale)
                          + np.float32(field.offset))
            return
        vals = _as_float(region)  # torch from here on: its vectorized kernels are 2-10× faster
        if region.shape[:2] != hw:
            vals = _resize_t(vals, hw)
        if field.scale != 1.0 or field.offset != 0.0:
            vals.mul_(field.scale).add_(field.offset)
        if region.shape[:2] != hw and field.rescale == "distance":
            vals.mul_(math.sqrt(hw[0] / geo.height * hw[1] / geo.width))
            if field.clip is not None:
                vals.clamp_(field.clip[0], field.clip[1])
        torch.from_numpy(out).copy_(vals.flip(1) if geo.flip else vals)

    def _apply_pil(self, stored: object, out: np.ndarray,
                   rng: np.random.Generator | None) -> Geometry:
        """Pillow(-SIMD): ``draft`` for the DCT downscale, then one resize of the crop box."""
        with Image.open(io.BytesIO(stored)) as im:  # type: ignore[arg-type]
            w, h = im.size
            top, left, ch, cw = self.box(h, w, rng)
            f = self._dct_factor(ch, cw, out.shape[:2])
            if f > 1:
                im.draft("RGB", (w // f, h // f))
                f = round(w / im.size[0])  # the scale Pillow chose; snap the box as above
                top, left, ch, cw = top // f, left // f, ch // f, cw // f
            img = im.convert("RGB").resize((out.shape[1], out.shape[0]), Image.BILINEAR,
                                           box=(left, top, left + cw, top + ch))
        flip = self.flip and rng is not None and rng.random() < 0.5
        if flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        np.copyto(out, np.asarray(img))
        return Geometry(top * f, left * f, ch * f, cw * f, flip)


    @staticmethod
    def _dct_factor(ch: int, cw: int, out_hw: tuple[int, ...]) -> int:
        """Largest power-of-two DCT downscale that keeps the crop at least twice the output.

        The 2× margin is Pillow's ``reducing_gap=2`` (``Image.thumbnail``): DCT scaling alone is
        a cruder filter, so the final antialiased resize still does a real reduction and the
        result stays within ~1 level of a full-resolution resize.
        """
        f = 1
        while f < 8 and ch // (2 * f) >= 2 * out_hw[0] and cw // (2 * f) >= 2 * out_hw[1]:
            f *= 2
        return f


def _resize(region: np.ndarray, hw: tuple[int, ...], antialias: bool) -> np.ndarray:
    """Bilinear resize (pixel centres, optionally antialiased) of an H×W or H×W×C array."""
    region = np.ascontiguousarray(region)
    x = torch.from_numpy(region if region.flags.writeable else np.array(region))
    x = x.unsqueeze(-1) if x.ndim == 2 else x
    y = F.interpolate(x.permute(2, 0, 1).unsqueeze(0), size=tuple(hw[:2]), mode="bilinear",
                      antialias=antialias, align_corners=False)
    y = y[0].permute(1, 2, 0)
    return (y[..., 0] if region.ndim == 2 else y).numpy()


def _axis(n_out: int, n_in: int) -> np.ndarray:
    """Source coordinate of each output pixel centre along one axis."""
    return (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5


@lru_cache(maxsize=1024)
def _nearest_index(n_out: int, n_in: int) -> np.ndarray:
    """Source index of each output pixel for nearest sampling at pixel centres (cached: crops
    repeat their sizes, and building the index costs as much as using it)."""
    idx = np.clip(np.floor(_axis(n_out, n_in) + 0.5), 0, n_in - 1).astype(np.intp)
    idx.flags.writeable = False
    return idx


def _nearest(region: np.ndarray, hw: tuple[int, ...]) -> np.ndarray:
    """Nearest-neighbour resize sampling at pixel centres (the image's geometry, no blending)."""
    h, w = region.shape[:2]
    return region.take(_nearest_index(hw[0], h), axis=0).take(_nearest_index(hw[1], w), axis=1)


def _as_float(region: np.ndarray) -> torch.Tensor:
    """float32 tensor copy of a (possibly strided, read-only) H×W(×C) region."""
    if not region.flags.writeable:  # a zero-copy view of a read buffer: torch wants writable
        region = np.array(region)
    if region.dtype == np.uint16:  # no uint16 tensors in older torch
        region = region.astype(np.int32)
    return torch.from_numpy(region).float()


def _resize_t(x: torch.Tensor, hw: tuple[int, ...]) -> torch.Tensor:
    """Bilinear resize at pixel centres, no antialiasing, of an H×W(×C) float tensor."""
    y = x.unsqueeze(-1) if x.ndim == 2 else x
    y = F.interpolate(y.permute(2, 0, 1).unsqueeze(0), size=tuple(hw[:2]), mode="bilinear",
                      align_corners=False)[0].permute(1, 2, 0)
    return y[..., 0] if x.ndim == 2 else y
