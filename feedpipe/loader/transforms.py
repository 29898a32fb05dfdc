"""Decode and crop/resize/flip one image straight into its slot of the batch, and its geometry
applied to the sample's mask and targets. JPEGs take the fastest path installed: pillow-simd's
``draft``, else simplejpeg with a power-of-two DCT downscale and torch's uint8 antialiased resize.
"""

from __future__ import annotations

import io
import math
import threading
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..errors import BadInputError
from ..schema.imaging import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_PIXELS_PER_BYTE,
    DEFAULT_MAX_SCANS,
    check_jpeg,
    decode_jpeg_fallback,
    decode_rgb,
    jpeg_path,
    simplejpeg,
    sniff_codec,
    strict_decode,
)
from ..schema.masks import TargetField
from .affine import footprint, nearest_points, sampling_grid, warp_image
from .affine_params import RandomAffine
from .config import LoaderConfig
from .geometry import DCT_MARGIN, Framing, Geometry

__all__ = ["DCT_MARGIN", "JPEG_PATH", "Geometry", "ImageOp", "RandomAffine"]

JPEG_PATH = jpeg_path()


@dataclass(frozen=True)
class ImageOp(Framing):
    """Executes a :class:`Framing`'s plans on the CPU: an image, then its mask and targets."""

    max_pixels: int = DEFAULT_MAX_PIXELS  # encoded images declaring more are refused undecoded
    affine: RandomAffine | None = None  # rotation/scale/translate/shear, in the crop's resampling
    # JPEG bounds checked from the header; None: the dataset's recorded limit, else the default
    max_scans: int | None = None
    max_pixels_per_byte: int | None = None

    @classmethod
    def of(cls, cfg: LoaderConfig) -> ImageOp:
        """The configuration's framing plus its ``affine`` option and JPEG bounds."""
        return replace(super().of(cfg), affine=cfg.affine, max_scans=cfg.workers.max_scans,
                       max_pixels_per_byte=cfg.workers.max_pixels_per_byte)

    @property
    def random(self) -> bool:
        return super().random or self.affine is not None

    def plan(self, h: int, w: int, rng: np.random.Generator | None) -> Geometry:
        """:meth:`Framing.plan`, then the affine's draws, with the DCT downscale it allows."""
        geo = super().plan(h, w, rng)
        if self.affine is None or rng is None:
            return geo
        oh, ow = self.size or (geo.height, geo.width)
        m = self.affine.draw(rng, oh, ow)
        if m is None:
            return geo
        fx, fy = footprint(m)
        f = self._dct_factor(geo.height, geo.width, (oh / fy, ow / fx),  # type: ignore[arg-type]
                             self.dct_margin) if self.size else 1
        return geo._replace(affine=m, dct=f)

    def apply(self, stored: object, codec: str, out: np.ndarray,
              rng: np.random.Generator | None, what: str) -> Geometry:
        """Decode ``stored`` (encoded, or a raw H×W×3 array) into ``out`` by its :meth:`plan`, as
        executed; damaged data is a BadInputError, never decoded to grey."""
        if codec == "mixed":
            codec = sniff_codec(stored)  # type: ignore[arg-type]
        if codec == "raw":
            src = stored
            if src.shape == out.shape and not self.random:  # decode-free: one copy
                np.copyto(out, src)
                return Geometry(0, 0, src.shape[0], src.shape[1], False)
            return self._cut(src, out, self.plan(src.shape[0], src.shape[1], rng), 1, what)
        if codec == "jpeg":
            self.check_jpeg(stored, what)
        if codec == "jpeg" and JPEG_PATH == "pillow-simd":
            return self._apply_pil(stored, out, rng, what)
        if codec == "jpeg" and simplejpeg is not None:
            try:
                h, w = simplejpeg.decode_jpeg_header(stored)[:2]
            except ValueError:  # simplejpeg cannot read this kind of JPEG: the fallback may
                return self._fallback(stored, out, rng, what)
            geo = self.plan(h, w, rng)
            src = strict_decode(lambda strict: _decode_jpeg(stored, h, w, geo.dct, strict), what)
            if src is None:
                return self._fallback(stored, out, rng, what, ((h, w), geo))
            return self._cut(src, out, geo, geo.dct, what)
        src = decode_rgb(stored, codec, what, self.max_pixels)  # type: ignore[arg-type]
        return self._cut(src, out, self.plan(src.shape[0], src.shape[1], rng), 1, what)

    def decode_planned(self, stored: bytes, geo: Geometry, out: np.ndarray, what: str) -> None:
        """Decode a JPEG at full size, as strictly as :meth:`apply`, and execute ``geo``: the
        device path's cut of a progressive JPEG (slow on the device), made in a worker."""
        src = None
        if simplejpeg is not None:
            try:
                h, w = simplejpeg.decode_jpeg_header(stored)[:2]
            except ValueError:  # a kind simplejpeg cannot read: the fallback may
                pass
            else:
                src = strict_decode(lambda strict: _decode_jpeg(stored, h, w, 1, strict), what)
        if src is None:
            src = decode_jpeg_fallback(stored, what, self.max_pixels)
        self._cut(src, out, geo._replace(dct=1), 1, what)

    def _fallback(self, stored: object, out: np.ndarray, rng: np.random.Generator | None,
                  what: str, planned: tuple[tuple[int, int], Geometry] | None = None) -> Geometry:
        """A JPEG simplejpeg cannot read, decoded by the fallback, cut, marked as a fallback."""
        src = decode_jpeg_fallback(stored, what, self.max_pixels)  # type: ignore[arg-type]
        if planned is not None and planned[0] == src.shape[:2]:
            geo = planned[1]
        else:
            geo = self.plan(src.shape[0], src.shape[1], rng)
        return self._cut(src, out, geo, 1, what)._replace(fallback=True)

    def check_jpeg(self, stored: object, what: str) -> None:
        """``imaging.check_jpeg`` with this op's bounds."""
        check_jpeg(stored, what, max_pixels=self.max_pixels,  # type: ignore[arg-type]
                   max_scans=self.max_scans or DEFAULT_MAX_SCANS,
                   max_pixels_per_byte=self.max_pixels_per_byte or DEFAULT_MAX_PIXELS_PER_BYTE)

    def _cut(self, src: np.ndarray, out: np.ndarray, geo: Geometry, f: int,
             what: str) -> Geometry:
        """Execute ``geo`` on ``src`` decoded at 1/``f`` scale into ``out``; returns it snapped."""
        top, left, ch, cw = geo.scaled(f)
        region = src[top: top + ch, left: left + cw]
        if geo.affine is not None:
            warp_image(region, out, geo.affine, geo.flip, self._fill)
        elif region.shape[:2] != out.shape[:2]:
            self.check_fits(*src.shape[:2], what, "image", out.shape)
            _resize_rgb_into(region, out, geo.flip)
        elif geo.flip:
            _mirror_into(out, region)
        else:
            np.copyto(out, region)
        return geo.snapped(f)

    def apply_mask(self, mask: np.ndarray, geo: Geometry, out: np.ndarray, what: str) -> None:
        """Cut ``geo`` from an H×W mask and resize nearest-neighbour (pixel centres) into ``out``."""
        region = mask[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
        if geo.affine is not None:
            rows, cols, inside = nearest_points(geo.affine, geo.flip, *out.shape, *region.shape)
            np.copyto(out, region[rows, cols])
            out[~inside] = self._mask_fill
            return
        if region.shape != out.shape:
            self.check_fits(*mask.shape[:2], what, "mask", out.shape)
            region = _nearest(region, out.shape)
        np.copyto(out, region[:, ::-1] if geo.flip else region)

    def apply_target(self, arr: np.ndarray, field: TargetField, geo: Geometry, out: np.ndarray,
                     what: str) -> None:
        """Cut ``geo`` from an H×W(×C) target, resample it as ``field.interp`` says (linear: no
        antialiasing, as distance maps are smooth), dequantize, rescale distances into ``out``."""
        region = arr[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
        hw, m = out.shape[:2], geo.affine
        if m is None and region.shape[:2] != hw:
            self.check_fits(*arr.shape[:2], what, "target", hw)
        if field.interp == "nearest":
            if m is not None:  # through the sample's composed matrix (see affine.py)
                rows, cols, inside = nearest_points(m, geo.flip, *hw, *region.shape[:2])
                _picked_into(out, region[rows, cols], field)
                out[~inside] = self._mask_fill if out.dtype.kind in "iu" else 0
                return
            if region.shape[:2] != hw:
                region = _nearest(region, hw)
            _picked_into(out, region[:, ::-1] if geo.flip else region, field)
            return
        vals = _as_float(region)  # torch from here on: its vectorized kernels beat numpy's here
        y = (vals.unsqueeze(-1) if vals.ndim == 2 else vals).permute(2, 0, 1)[None]
        scale = math.sqrt(hw[0] / geo.height * hw[1] / geo.width)  # distances' geometric scale
        if m is not None:  # bilinear through the composed matrix, also scaling by its √|det|
            grid = sampling_grid(m, geo.flip, *hw)
            y = F.grid_sample(y, grid, mode="bilinear", padding_mode="border", align_corners=False)
            scale *= math.sqrt(abs(m[0] * m[4] - m[1] * m[3]))
        elif region.shape[:2] != hw:  # bilinear at pixel centres, no antialiasing
            y = F.interpolate(y, size=tuple(hw), mode="bilinear", align_corners=False)
        y = y[0].permute(1, 2, 0)
        vals = _dequantized(y[..., 0] if vals.ndim == 2 else y, field,
                            scale if m is not None or region.shape[:2] != hw else None)
        if m is not None:
            vals[(grid[0].abs() > 1).any(-1)] = 0  # outside the region
        torch.from_numpy(out).copy_(vals.flip(1) if geo.flip and m is None else vals)

    @property
    def _fill(self) -> tuple[int, ...]:
        return self.affine.fill if self.affine is not None else (0, 0, 0)  # type: ignore[return-value]

    @property
    def _mask_fill(self) -> int:
        return self.affine.mask_fill if self.affine is not None else 0

    def _apply_pil(self, stored: object, out: np.ndarray,
                   rng: np.random.Generator | None, what: str = "image") -> Geometry:
        """Pillow(-SIMD): ``draft`` at the plan's DCT scale, then one resize of the crop box."""
        try:
            im = Image.open(io.BytesIO(stored))  # type: ignore[arg-type]
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise BadInputError(f"{what}: cannot decode JPEG: {exc}") from exc
        with im:
            w, h = im.size
            geo, f = self.plan(h, w, rng), 1
            if geo.dct > 1:
                im.draft("RGB", (w // geo.dct, h // geo.dct))
                f = round(w / im.size[0])  # the scale Pillow chose; snap the box to it
            if geo.affine is not None:  # sampled through the composed matrix instead
                return self._cut(np.asarray(im.convert("RGB")), out, geo, f, what)
            top, left, ch, cw = geo.scaled(f)
            img = im.convert("RGB").resize((out.shape[1], out.shape[0]), Image.BILINEAR,
                                           box=(left, top, left + cw, top + ch))
        if geo.flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        np.copyto(out, np.asarray(img))
        return geo.snapped(f)


_BUFFERS = threading.local()  # reusable decode / region / flip buffers per thread: no fresh pages


def _decode_jpeg(data: object, h: int, w: int, f: int, strict: bool = True) -> np.ndarray:
    """simplejpeg RGB decode at 1/``f`` scale into this thread's buffer (strict: damage raises)."""
    sh, sw = -(-h // f), -(-w // f)
    buf = getattr(_BUFFERS, "buf", None)
    if buf is None or buf.size < sh * sw * 3:
        buf = _BUFFERS.buf = np.empty(max(sh * sw * 3, 1 << 20), np.uint8)
    if f > 1:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", min_factor=f, min_height=sh,
                                      min_width=sw, buffer=buf, strict=strict)
    return simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=buf, strict=strict)


_UPSAMPLE_AA: Any = None  # F.interpolate(antialias=True)'s op in its out= form: a private name
try:  # (a torch release may drop it)
    _UPSAMPLE_AA = torch.ops.aten._upsample_bilinear2d_aa.out
except (AttributeError, RuntimeError):
    pass


def _resize_rgb_into(region: np.ndarray, out: np.ndarray, flip: bool) -> None:
    """Antialiased bilinear resize of an H×W×3 uint8 region into ``out`` (flipped if asked):
    dense channels-last input (torch's fast kernel), written in place by its ``out=`` form."""
    if not (region.flags.c_contiguous and region.flags.writeable):  # torch wants writable
        dense = _scratch("region", region.shape)
        np.copyto(dense, region)
        region = dense
    x = torch.from_numpy(region).permute(2, 0, 1).unsqueeze(0)
    # (a contiguous HWC array seen as NCHW passes is_contiguous(channels_last), yet only an
    # explicit .contiguous(memory_format=...) makes torch return channels-last)
    x = x.contiguous(memory_format=torch.channels_last)
    dst = _scratch("flip", out.shape) if flip else out
    into = torch.from_numpy(dst).permute(2, 0, 1).unsqueeze(0)
    if _UPSAMPLE_AA is not None:
        _UPSAMPLE_AA(x, dst.shape[:2], False, None, None, out=into)
    else:
        into.copy_(F.interpolate(x, size=dst.shape[:2], mode="bilinear", antialias=True,
                                 align_corners=False))
    if flip:
        _mirror_into(out, dst)


def _mirror_into(out: np.ndarray, src: np.ndarray) -> None:
    """``out[:, j] = src[:, W-1-j]`` by torch's flip (~10× numpy's negative-stride copy)."""
    if not src.flags.writeable:  # a zero-copy view of a read buffer: torch wants writable
        src = np.array(src)
    torch.from_numpy(out).copy_(torch.from_numpy(src).flip(1))


def _scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array of ``shape`` in this thread's reused buffer ``name``."""
    n = math.prod(shape)
    buf = getattr(_BUFFERS, name, None)
    if buf is None or buf.size < n:
        buf = np.empty(n, np.uint8)
        setattr(_BUFFERS, name, buf)
    return buf[:n].reshape(shape)


@lru_cache(maxsize=1024)
def _nearest_index(n_out: int, n_in: int) -> np.ndarray:
    """Source index of each output pixel, nearest at pixel centres (cached: costly to build)."""
    centres = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    idx = np.clip(np.floor(centres + 0.5), 0, n_in - 1).astype(np.intp)
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


def _picked_into(out: np.ndarray, picked: np.ndarray, field: TargetField) -> None:
    """A target's nearest-sampled values into ``out``: as stored, or dequantized to float."""
    if out.dtype == picked.dtype:
        np.copyto(out, picked)
    else:
        np.copyto(out, picked.astype(np.float32) * np.float32(field.scale)
                  + np.float32(field.offset))


def _dequantized(vals: torch.Tensor, field: TargetField, scale: float | None) -> torch.Tensor:
    """A target's values dequantized; distances times ``scale`` (None: 1) and re-clipped."""
    if field.scale != 1.0 or field.offset != 0.0:
        vals.mul_(field.scale).add_(field.offset)
    if scale is not None and field.rescale == "distance":
        vals.mul_(scale)
        if field.clip is not None:
            vals.clamp_(field.clip[0], field.clip[1])
    return vals
