"""``torchvision.io.decode_jpeg`` / ``decode_image`` for RGB JPEG input, as LitData's JPEG
serializer calls them. Backed by simplejpeg, a thin libjpeg-turbo binding, as torchvision's own
decoder is; like torchvision it returns a C×H×W uint8 view of an H×W×C buffer (a permute)."""

from __future__ import annotations

import enum

import simplejpeg
import torch


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def decode_jpeg(data: torch.Tensor, mode: ImageReadMode = ImageReadMode.UNCHANGED) -> torch.Tensor:
    if mode not in (ImageReadMode.RGB, ImageReadMode.UNCHANGED):
        raise NotImplementedError(f"torchvision shim: decode_jpeg mode {mode} is not provided")
    hwc = simplejpeg.decode_jpeg(data.numpy(), colorspace="RGB")
    return torch.from_numpy(hwc).permute(2, 0, 1)


def decode_image(data: torch.Tensor, mode: ImageReadMode = ImageReadMode.UNCHANGED) -> torch.Tensor:
    if not simplejpeg.is_jpeg(data.numpy()):
        raise NotImplementedError("torchvision shim: decode_image handles JPEG only")
    return decode_jpeg(data, mode)
