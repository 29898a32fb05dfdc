"""Decode and geometric augmentation of one image straight into its slot of the batch buffer.

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

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..imaging import decode_rgb, jpeg_path, simplejpeg
from .config import Crop

JPEG_PATH = jpeg_path()

Box = tuple[int, int, int, int]  # top, left, height, width


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
              rng: np.random.Generator | None, what: str) -> None:
        """Decode ``stored`` (encoded bytes or a raw H×W×3 array) and write it into ``out``."""
        if codec == "raw":
            src = stored
            if src.shape == out.shape and not self.random:  # decode-free: one copy
                np.copyto(out, src)
                return
            top, left, ch, cw = self.box(src.shape[0], src.shape[1], rng)
        elif codec == "jpeg" and JPEG_PATH == "pillow-simd":
            self._apply_pil(stored, out, rng)
            return
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
            x = torch.from_numpy(np.ascontiguousarray(region)).permute(2, 0, 1).unsqueeze(0)
            y = F.interpolate(x, size=out.shape[:2], mode="bilinear", antialias=True,
                              align_corners=False)
            region = y[0].permute(1, 2, 0).numpy()
        np.copyto(out, region[:, ::-1] if flip else region)

    def _apply_pil(self, stored: object, out: np.ndarray, rng: np.random.Generator | None) -> None:
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
        if self.flip and rng is not None and rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        np.copyto(out, np.asarray(img))

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
