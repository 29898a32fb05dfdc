"""JPEG decode on the training device (nvJPEG through CUDA torchvision), inside the torch backend.

With ``decode_on="device"`` the workers ship each image's encoded bytes (~5× smaller than its
pixels) plus its crop box and flip: the sample's ``Framing.plan`` made from the JPEG header
(:func:`plan_encoded`), the same plan the CPU path executes. The feed engine's thread (never the
training thread) decodes the batch with one batched
``torchvision.io.decode_jpeg(..., device="cuda")`` call, then crops, resizes (bilinear,
antialiased, as ``F.interpolate(antialias=True)``) and flips the whole batch at once: the crop,
the resize and the flip are two weight matrices per image, built for all images together from
the crop boxes as a tensor, applied as two batched matrix products (:func:`resize_boxes`). No
Python loop runs per image. Progressive JPEGs (rare after conversion, which stores them as
baseline) are decoded in the CPU workers and travel as pixels. Masks and targets still follow
the same geometry on the CPU. The output is the N×H×W×3 uint8 batch the CPU path produces, so
normalization and layout are shared. torchvision is optional and detected at run time, never a
dependency.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from itertools import pairwise
from typing import Callable, Sequence

import numpy as np
import torch

from ...errors import ConfigError, CorruptRecordError
from ...schema.codecs import JPEG_PROGRESSIVE, jpeg_complete, jpeg_frame
from ...schema.imaging import check_pixels
from ..geometry import Framing, Geometry

log = logging.getLogger("feedpipe.loader")

#: decodes a list of 1-D uint8 CPU tensors (JPEG files) into 3×H×W uint8 tensors on the device
DecodeFn = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]

#: float bytes of padded images one batched resize holds at a time (larger batches go in parts)
RESIZE_BUDGET = 1 << 30


@dataclass
class EncodedBatch:
    """A batch of encoded images as it leaves a worker: few tensors, no per-sample objects."""

    data: torch.Tensor      # all JPEG files back to back, uint8
    offsets: torch.Tensor   # N+1 int64 byte offsets into ``data`` (an empty file: decoded)
    boxes: torch.Tensor     # N×4 int64: top, left, height, width of the crop in source pixels
    flips: torch.Tensor     # N bool: mirror horizontally after the resize
    indices: torch.Tensor   # N int64 dataset indices, to name a record nvJPEG cannot decode
    decoded: torch.Tensor | None = None  # K×H×W×3 uint8: rows the worker decoded (progressive)
    rows: torch.Tensor | None = None     # K int64: their positions in the batch

    @classmethod
    def pack(cls, files: Sequence[np.ndarray], boxes: Sequence[tuple[int, int, int, int]],
             flips: Sequence[bool], indices: Sequence[int],
             decoded: dict[int, np.ndarray] | None = None) -> "EncodedBatch":
        """Concatenate per-sample byte arrays (one copy) and their geometry; ``decoded``: the
        rows already decoded (batch position -> H×W×3 uint8), whose files are left out."""
        sizes = np.fromiter((len(f) for f in files), np.int64, len(files))
        offsets = np.zeros(len(files) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        done = rows = None
        if decoded:
            rows = torch.tensor(sorted(decoded), dtype=torch.int64)
            done = torch.from_numpy(np.stack([decoded[int(r)] for r in rows]))
        return cls(torch.from_numpy(np.concatenate(files) if files else np.empty(0, np.uint8)),
                   torch.from_numpy(offsets), torch.tensor(boxes, dtype=torch.int64).view(-1, 4),
                   torch.tensor(flips, dtype=torch.bool), torch.tensor(indices, dtype=torch.int64),
                   done, rows)

    def files(self) -> tuple[list[torch.Tensor], list[int]]:
        """The files still to decode, as zero-copy 1-D views, and their batch positions."""
        off = self.offsets.tolist()
        pos = [i for i, (a, b) in enumerate(pairwise(off)) if b > a]
        return [self.data[off[i]: off[i + 1]] for i in pos], pos


def plan_encoded(framing: Framing, data: bytes, rng: np.random.Generator | None,
                 what: str, max_pixels: int) -> tuple[Geometry, bool]:
    """The plan of a still-encoded JPEG, from its header (in the worker), and whether it is
    progressive (then the worker decodes it: progressive JPEGs decode slowly on the device).
    The device decodes at full size, so the box is cut as planned, without the CPU path's
    DCT-grid snap."""
    frame = jpeg_frame(data)
    if frame is None:
        raise ValueError(f"{what}: damaged JPEG header")
    if not jpeg_complete(data):
        raise ValueError(f"{what}: truncated JPEG (no end-of-image marker)")
    w, h = frame[:2]
    check_pixels(w, h, max_pixels, what)
    framing.check_fits(h, w, what)
    return framing.plan(h, w, rng), frame[4] in JPEG_PROGRESSIVE


def resize_weights(boxes: torch.Tensor, axis: int, size: int, extent: int) -> torch.Tensor:
    """N×size×extent weights that crop each image's rows (``axis`` 0) or columns (1) to its box
    and resize them to ``size``, bilinear with antialiasing: ``F.interpolate(antialias=True,
    align_corners=False)``'s taps and weights (Pillow's triangle filter), zero outside the box."""
    start = boxes[:, axis].to(torch.float32)[:, None, None]
    length = boxes[:, 2 + axis].to(torch.float32)[:, None, None]
    scale = length / size
    down = scale >= 1
    support = torch.where(down, scale, torch.ones_like(scale))
    inv = torch.where(down, 1 / scale, torch.ones_like(scale))
    center = scale * (torch.arange(size, device=boxes.device, dtype=torch.float32)[None, :, None]
                      + 0.5)
    lo = torch.clamp((center - support + 0.5).floor(), min=0)
    hi = torch.minimum((center + support + 0.5).floor(), length)
    j = torch.arange(extent, device=boxes.device, dtype=torch.float32)[None, None, :] - start
    w = torch.clamp(1 - ((j - center + 0.5) * inv).abs(), min=0) * ((j >= lo) & (j < hi))
    return w / w.sum(-1, keepdim=True).clamp(min=1e-12)


def resize_boxes(images: Sequence[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor,
                 size: tuple[int, int], out: torch.Tensor, rows: torch.Tensor) -> None:
    """Crop ``boxes`` (N×4: top, left, height, width) out of ``images`` (3×H×W uint8 each),
    resize each to ``size``, mirror where ``flips``, and write them into rows ``rows`` of ``out``
    (B×H×W×3 uint8), in batched operations: the images padded into one batch, two matrix
    products with per-image weights (the crop, the resize and the flip folded into them),
    rounding. Images are taken in parts of similar size whose padded floats stay under
    :data:`RESIZE_BUDGET` (with their gather's indices), so one large photo does not pad the
    whole batch."""
    oh, ow = size
    areas = [int(x.shape[1]) * int(x.shape[2]) for x in images]
    order = sorted(range(len(images)), key=areas.__getitem__)
    part: list[int] = []
    for i in order + [-1]:
        if part and (i < 0 or 20 * (len(part) + 1) * max(images[j].shape[1] for j in part + [i])
                     * max(images[j].shape[2] for j in part + [i]) > RESIZE_BUDGET):
            _resize_part([images[j] for j in part], boxes[part], flips[part], oh, ow, out,
                         rows[part])
            part = []
        if i >= 0:
            part.append(i)


def padded(images: list[torch.Tensor]) -> torch.Tensor:
    """3×H×W images of different sizes as one n×3×Hmax×Wmax float batch, zero-padded: one
    concatenation and one gather (torch's nested tensors would do it, as a prototype API)."""
    dev = images[0].device
    hw = torch.tensor([x.shape[1:] for x in images], dtype=torch.int64, device=dev)
    h, w = (hw[:, 0].view(-1, 1, 1, 1), hw[:, 1].view(-1, 1, 1, 1))
    flat = torch.cat([x.reshape(-1) for x in images])
    start = torch.cumsum(3 * h * w, 0) - 3 * h * w
    y = torch.arange(int(hw[:, 0].max()), device=dev).view(1, 1, -1, 1)
    x = torch.arange(int(hw[:, 1].max()), device=dev).view(1, 1, 1, -1)
    c = torch.arange(3, device=dev).view(1, 3, 1, 1)
    inside = (y < h) & (x < w)
    at = torch.where(inside, start + c * h * w + y * w + x, 0)
    return flat[at].float().mul_(inside)


def _resize_part(images: list[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, oh: int,
                 ow: int, out: torch.Tensor, rows: torch.Tensor) -> None:
    x = padded(images)  # n×3×Hmax×Wmax
    boxes = boxes.to(x.device)
    wy = resize_weights(boxes, 0, oh, x.shape[2])                # n×oh×Hmax
    wx = resize_weights(boxes, 1, ow, x.shape[3])                # n×ow×Wmax
    wx = torch.where(flips.to(x.device)[:, None, None], wx.flip(1), wx)
    y = torch.matmul(torch.matmul(wy[:, None], x), wx.transpose(1, 2)[:, None])  # n×3×oh×ow
    out.index_copy_(0, rows.to(out.device),
                    y.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1))


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
        except Exception:  # find the culprit: one file at a time (a failing batch only)
            for f, i in zip(files, indices, strict=True):
                try:
                    self.decode([f])
                except Exception as one:
                    raise CorruptRecordError(f"{self.describe(i)}: cannot decode image on "
                                             f"{self.device}: {one}") from one
            raise

    def __call__(self, batch: EncodedBatch, size: tuple[int, int]) -> torch.Tensor:
        n = len(batch.flips)
        out = torch.empty((n, *size, 3), dtype=torch.uint8, device=self.device)
        files, pos = batch.files()
        if files:
            where = torch.tensor(pos, dtype=torch.int64)
            images = self._decode(files, batch.indices[where].tolist())
            resize_boxes(images, batch.boxes[where], batch.flips[where], size, out, where)
        if batch.rows is not None and batch.decoded is not None:
            out.index_copy_(0, batch.rows.to(self.device),
                            batch.decoded.to(self.device, non_blocking=True))
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
    """Resolve ``decode_on``: "device" insists (a clear error where it cannot); "auto" decodes in
    the CPU workers, since no GPU run yet shows nvJPEG feeding the training step more than they
    do (benchmarks/RESULTS.md: ask for it, and measure)."""
    if decode_on != "device":
        return None
    if not jpeg:
        raise ConfigError("decode_on='device' decodes JPEG only, and this dataset's images are "
                          "not stored as JPEG; use decode_on='cpu' (or 'auto')", option="decode_on")
    found = nvjpeg(device)
    if isinstance(found, str):
        raise ConfigError(f"decode_on='device' needs CUDA torchvision: {found}. Install the "
                          "torchvision build matching your torch, or use decode_on='cpu'",
                          option="decode_on")
    log.info("feedpipe loader: decoding JPEG on %s with nvJPEG (torchvision)", device)
    return found
