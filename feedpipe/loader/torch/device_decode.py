"""JPEG decode on the training device (nvJPEG through CUDA torchvision), inside the torch backend.

With ``decode_on="device"`` the workers ship each image's encoded bytes (~5× smaller than its
pixels) plus its crop box and flip: the sample's ``Framing.plan`` made from the JPEG header
(:func:`plan_encoded`), the same plan the CPU path executes; the main process decodes the
whole batch with one batched
``torchvision.io.decode_jpeg(..., device="cuda")`` call and crops / resizes (bilinear,
antialiased) / flips on the GPU. Masks and targets still follow the same geometry on the CPU.
The output is the N×H×W×3 uint8 batch the CPU path produces, so normalization and layout are
shared. torchvision is optional and detected at run time, never a dependency.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import ConfigError, CorruptRecordError
from ...schema.codecs import jpeg_complete, jpeg_info
from ...schema.imaging import check_pixels
from ..geometry import Framing, Geometry

log = logging.getLogger("feedpipe.loader")

#: decodes a list of 1-D uint8 CPU tensors (JPEG files) into 3×H×W uint8 tensors on the device
DecodeFn = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]


@dataclass
class EncodedBatch:
    """A batch of encoded images as it leaves a worker: few tensors, no per-sample objects."""

    data: torch.Tensor      # all JPEG files back to back, uint8
    offsets: torch.Tensor   # N+1 int64 byte offsets into ``data``
    boxes: torch.Tensor     # N×4 int64: top, left, height, width of the crop in source pixels
    flips: torch.Tensor     # N bool: mirror horizontally after the resize
    indices: torch.Tensor   # N int64 dataset indices, to name a record nvJPEG cannot decode

    @classmethod
    def pack(cls, files: Sequence[np.ndarray], boxes: Sequence[tuple[int, int, int, int]],
             flips: Sequence[bool], indices: Sequence[int]) -> "EncodedBatch":
        """Concatenate per-sample byte arrays (one copy) and their geometry."""
        sizes = np.fromiter((len(f) for f in files), np.int64, len(files))
        offsets = np.zeros(len(files) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(torch.from_numpy(np.concatenate(files) if files else np.empty(0, np.uint8)),
                   torch.from_numpy(offsets), torch.tensor(boxes, dtype=torch.int64).view(-1, 4),
                   torch.tensor(flips, dtype=torch.bool), torch.tensor(indices, dtype=torch.int64))

    def pin_memory(self) -> "EncodedBatch":
        """Called by the DataLoader's pin thread: page-locked bytes copy to the GPU faster."""
        return EncodedBatch(self.data.pin_memory(), self.offsets, self.boxes, self.flips,
                            self.indices)

    def files(self) -> list[torch.Tensor]:
        """One zero-copy 1-D view per JPEG file."""
        off = self.offsets.tolist()
        return [self.data[a:b] for a, b in zip(off, off[1:])]


def plan_encoded(framing: Framing, data: bytes, rng: np.random.Generator | None,
                 what: str, max_pixels: int) -> Geometry:
    """The plan of a still-encoded JPEG, from its header (in the worker). The device decodes at
    full size, so the box is cut as planned, without the CPU path's DCT-grid snap."""
    info = jpeg_info(data)
    if info is None:
        raise ValueError(f"{what}: damaged JPEG header")
    if not jpeg_complete(data):
        raise ValueError(f"{what}: truncated JPEG (no end-of-image marker)")
    w, h = info[:2]
    check_pixels(w, h, max_pixels, what)
    framing.check_fits(h, w, what)
    return framing.plan(h, w, rng)


class DeviceDecoder:
    """Decodes an :class:`EncodedBatch` on ``device`` into the N×H×W×3 uint8 batch of ``size``.

    Workers already reject truncated files (no end-of-image marker) under the loader's
    ``on_error`` policy; a file that still fails here raises :class:`CorruptRecordError` naming
    its record (``describe``, e.g. ``reader.describe``)."""

    def __init__(self, device: torch.device, decode: DecodeFn,
                 describe: Callable[[int], str] = lambda i: f"sample {i}") -> None:
        self.device, self.decode, self.describe = device, decode, describe

    def _decode(self, files: list[torch.Tensor], indices: list[int]) -> Sequence[torch.Tensor]:
        try:
            return self.decode(files)
        except Exception:  # find the culprit: one file at a time
            for f, i in zip(files, indices):
                try:
                    self.decode([f])
                except Exception as one:
                    raise CorruptRecordError(f"{self.describe(i)}: cannot decode image on "
                                             f"{self.device}: {one}") from one
            raise

    def __call__(self, batch: EncodedBatch, size: tuple[int, int]) -> torch.Tensor:
        images = self._decode(batch.files(), batch.indices.tolist())
        out = torch.empty((len(images), *size, 3), dtype=torch.uint8, device=self.device)
        for i, (img, box, flip) in enumerate(zip(images, batch.boxes.tolist(),
                                                 batch.flips.tolist())):
            top, left, h, w = box
            x = img[:, top: top + h, left: left + w]
            if (h, w) != tuple(size):
                x = F.interpolate(x[None].float(), size=size, mode="bilinear", antialias=True,
                                  align_corners=False)[0].round_().clamp_(0, 255)
            out[i] = (x.flip(-1) if flip else x).permute(1, 2, 0)
        return out


def nvjpeg(device: torch.device) -> DeviceDecoder | str:
    """The nvJPEG decoder for ``device``, or the reason it cannot be used here."""
    if device.type != "cuda":
        return f"device is {device.type}, not cuda"
    try:
        io = importlib.import_module("torchvision.io")
    except Exception as exc:  # ImportError, or a torchvision built against another torch
        return f"torchvision is not importable ({exc.__class__.__name__}: {exc})"
    mode = io.ImageReadMode.RGB

    def decode(files: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        return io.decode_jpeg(files, mode=mode, device=device)

    try:  # a CPU-only torchvision build fails here, not in the middle of an epoch
        probe = io.encode_jpeg(torch.zeros((3, 16, 16), dtype=torch.uint8))
        decode([probe])
    except Exception as exc:
        return f"torchvision cannot decode JPEG on {device} ({exc.__class__.__name__}: {exc})"
    return DeviceDecoder(device, decode)


def choose(decode_on: str, device: torch.device, jpeg: bool) -> DeviceDecoder | None:
    """Resolve ``decode_on``: "device" insists (clear error), "auto" uses nvJPEG when it can."""
    if decode_on == "cpu" or (decode_on == "auto" and (device.type != "cuda" or not jpeg)):
        return None
    if not jpeg:
        raise ConfigError("decode_on='device' decodes JPEG only, and this dataset's images are "
                          "not stored as JPEG; use decode_on='cpu' (or 'auto')", option="decode_on")
    found = nvjpeg(device)
    if isinstance(found, DeviceDecoder):
        log.info("feedpipe loader: decoding JPEG on %s with nvJPEG (torchvision)", device)
        return found
    if decode_on == "device":
        raise ConfigError(f"decode_on='device' needs CUDA torchvision: {found}. Install the "
                          "torchvision build matching your torch, or use decode_on='cpu'",
                          option="decode_on")
    log.info("feedpipe loader: decoding on the CPU (%s)", found)
    return None
