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
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..errors import BadInputError
from ..imaging import (DEFAULT_MAX_PIXELS, check_pixels, decode_rgb, decode_with_pillow,
                       jpeg_path, simplejpeg, sniff_codec)
from ..schema import TargetField
from .config import Crop

JPEG_PATH = jpeg_path()
# DCT-domain downscale margin: the scaled crop stays at least this many times the output (see
# ImageOp._dct_factor for the measured error of each choice)
DCT_MARGIN = 1.5

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
    fallback: bool = False  # decoded by Pillow because simplejpeg refused the JPEG


@dataclass(frozen=True)
class ImageOp:
    """Output size and crop policy; :meth:`apply` fills one H×W×3 uint8 slot."""

    size: tuple[int, int] | None
    crop: Crop = "center_crop"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS  # encoded images declaring more are refused undecoded
    dct_margin: float = DCT_MARGIN  # see _dct_factor

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
        """Decode ``stored`` (encoded bytes or a raw H×W×3 array) and write it into ``out``.

        JPEG (and the JPEG records of a "mixed" field) take the fast path below; a JPEG that
        simplejpeg refuses (4:1:0 subsampling, a 2×4 image, ...) falls back to Pillow and the
        result says so (``Geometry.fallback``). Encoded images declaring more than
        ``max_pixels`` are refused from their header, before anything is decoded.
        """
        if codec == "mixed":
            codec = sniff_codec(stored)  # type: ignore[arg-type]
        if codec == "raw":
            src = stored
            if src.shape == out.shape and not self.random:  # decode-free: one copy
                np.copyto(out, src)
                return Geometry(0, 0, src.shape[0], src.shape[1], False)
            return self._cut(src, out, rng, 1, *self.box(src.shape[0], src.shape[1], rng), what)
        if codec == "jpeg" and JPEG_PATH == "pillow-simd":
            return self._apply_pil(stored, out, rng, what)
        if codec == "jpeg" and simplejpeg is not None:
            try:
                h, w = simplejpeg.decode_jpeg_header(stored)[:2]
            except ValueError:  # simplejpeg refuses the header: Pillow may still read it
                return self._fallback(stored, out, rng, what)
            self.check_pixels(h, w, what)
            top, left, ch, cw = self.box(h, w, rng)
            f = self._dct_factor(ch, cw, out.shape[:2], self.dct_margin)
            try:
                src = _decode_jpeg(stored, h, w, f)
            except ValueError:
                return self._fallback(stored, out, rng, what)
            # scaled pixel i covers source pixels [i*f, (i+1)*f): the box snaps to that grid
            return self._cut(src, out, rng, f, top // f, left // f, ch // f, cw // f, what)
        return self._decode_other(stored, codec, out, rng, what)

    def _fallback(self, stored: object, out: np.ndarray, rng: np.random.Generator | None,
                  what: str) -> Geometry:
        """A JPEG simplejpeg refuses: Pillow decodes it, and the geometry is marked as a
        fallback (the dataset counts them). Corrupt only when Pillow cannot read it either."""
        src = decode_with_pillow(stored, what, self.max_pixels)  # type: ignore[arg-type]
        geo = self._cut(src, out, rng, 1, *self.box(src.shape[0], src.shape[1], rng), what)
        return geo._replace(fallback=True)

    def _decode_other(self, stored: object, codec: str, out: np.ndarray,
                      rng: np.random.Generator | None, what: str) -> Geometry:
        """PNG, WebP, ...: ``decode_rgb`` checks the header against ``max_pixels`` first."""
        src = decode_rgb(stored, codec, what, self.max_pixels)  # type: ignore[arg-type]
        return self._cut(src, out, rng, 1, *self.box(src.shape[0], src.shape[1], rng), what)

    def check_pixels(self, h: int, w: int, what: str) -> None:
        """Refuse an image whose header declares more than ``max_pixels`` (no decode, no OOM)."""
        check_pixels(w, h, self.max_pixels, what)

    def _cut(self, src: np.ndarray, out: np.ndarray, rng: np.random.Generator | None, f: int,
             top: int, left: int, ch: int, cw: int, what: str) -> Geometry:
        """Crop ``src`` (decoded at 1/``f`` scale), resize it into ``out``, flip; the geometry is
        reported in full-resolution source pixels."""
        flip = self.flip and rng is not None and rng.random() < 0.5
        region = src[top: top + ch, left: left + cw]
        if region.shape[:2] != out.shape[:2]:
            if self.crop == "none":
                raise ValueError(f"{what}: image is {src.shape[1]}x{src.shape[0]}, batch is "
                                 f"{out.shape[1]}x{out.shape[0]}; pass size=... to resize")
            _resize_rgb_into(region, out, flip)
        else:
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
                   rng: np.random.Generator | None, what: str = "image") -> Geometry:
        """Pillow(-SIMD): ``draft`` for the DCT downscale, then one resize of the crop box."""
        try:
            im = Image.open(io.BytesIO(stored))  # type: ignore[arg-type]
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise BadInputError(f"{what}: cannot decode JPEG: {exc}") from exc
        with im:
            w, h = im.size
            self.check_pixels(h, w, what)
            top, left, ch, cw = self.box(h, w, rng)
            f = self._dct_factor(ch, cw, out.shape[:2], self.dct_margin)
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
    def _dct_factor(ch: int, cw: int, out_hw: tuple[int, ...], margin: float = DCT_MARGIN) -> int:
        """Largest power-of-two DCT downscale (≤ 8) that keeps the scaled crop at least
        ``margin`` times the output on both sides, so the final antialiased resize still does
        part of the reduction (DCT scaling alone is a cruder filter).

        The margin is chosen by measured error against a float64 antialiased resize of the
        full-resolution decode (``benchmarks/dct_fidelity.py``, 48 synthetic photos per size,
        224² out; mean / max absolute levels; full decode: 0.25-0.27 / 1):

        ======================  ===========  ===========  ===========
        photos, crop            margin 2×    margin 1.5×  margin 1×
        ======================  ===========  ===========  ===========
        1280×853, centre        0.27 / 10    0.36 / 10    0.44 / 41
        1280×853, random        0.26 / 1     0.30 / 10    0.36 / 14
        2000×1500, centre       0.27 / 5     0.44 / 12    0.44 / 12
        ======================  ===========  ===========  ===========

        1× lets the DCT do nearly all of the reduction (a 912-px crop decoded at 1/4 = 228 px for
        224 out) and strays up to 41 levels on point-like detail; 1.5× keeps the worst pixel near
        the 2× margin's while decoding 1280×853 centre crops at 1/2 (2× never scales them).
        """
        f = 1
        while f < 8 and ch // (2 * f) >= margin * out_hw[0] and cw // (2 * f) >= margin * out_hw[1]:
            f *= 2
        return f


_BUFFERS = threading.local()  # one reusable decode buffer per thread: no fresh pages per image


def _decode_jpeg(data: object, h: int, w: int, f: int) -> np.ndarray:
    """simplejpeg RGB decode at 1/``f`` scale into this thread's reused buffer (the result is a
    view of it, valid until the next decode on this thread)."""
    sh, sw = -(-h // f), -(-w // f)
    buf = getattr(_BUFFERS, "buf", None)
    if buf is None or buf.size < sh * sw * 3:
        buf = _BUFFERS.buf = np.empty(max(sh * sw * 3, 1 << 20), np.uint8)
    if f > 1:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", min_factor=f, min_height=sh,
                                      min_width=sw, buffer=buf)
    return simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=buf)


def _resize_rgb_into(region: np.ndarray, out: np.ndarray, flip: bool) -> None:
    """Antialiased bilinear resize of an H×W×3 uint8 region into ``out`` (flipped if asked).

    The region is given as a channels-last contiguous N×C×H×W tensor, the layout torch's
    vectorized uint8 kernel takes; it then returns channels-last too, so the copy into the HWC
    slot is a memcpy, not a strided transpose (0.66 against 1.01 ms/image, PERF-FACTS.md)."""
    if not region.flags.writeable:  # a zero-copy view of a read buffer: torch wants writable
        region = np.array(region)
    x = torch.from_numpy(region).permute(2, 0, 1).unsqueeze(0)
    # (a contiguous HWC array seen as NCHW passes is_contiguous(channels_last), yet only an
    # explicit .contiguous(memory_format=...) makes torch return channels-last)
    x = x.contiguous(memory_format=torch.channels_last)
    y = F.interpolate(x, size=out.shape[:2], mode="bilinear", antialias=True,
                      align_corners=False)[0].permute(1, 2, 0)
    np.copyto(out, y.numpy()[:, ::-1] if flip else y.numpy())


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
