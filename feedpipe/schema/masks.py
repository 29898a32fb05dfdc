"""Segmentation fields: the mask (class indices, stored lossless as PNG or raw npy) and the
per-pixel targets computed from it at conversion (distance maps, boundaries)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Iterable, Literal

import numpy as np

from ..errors import CorruptRecordError
from .codecs import Buffer, npy_decode, npy_encode, npy_header
from .fields import ArrayField, Field

MaskCodec = Literal["png", "raw"]


@dataclass(frozen=True)
class MaskField(Field):
    """A segmentation mask: H×W class indices (uint8 or uint16), stored lossless as PNG or raw
    npy; loaders resize it nearest-neighbour, so indices are never blended. ``num_classes`` is
    recorded at conversion (the largest index seen + 1 unless given); ``ignore_index`` marks
    pixels of no class (VOC's 255 "void" band), left out of ``num_classes`` and of the targets
    (``loader.ignore_index``, e.g. for ``cross_entropy``)."""

    codec: MaskCodec = "png"
    dtype: str = "|u1"
    num_classes: int | None = None
    shape: tuple[int, int] | None = None
    ignore_index: int | None = None
    kind: ClassVar[str] = "mask"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.codec not in ("png", "raw"):
            raise ValueError(f"mask codec {self.codec!r}: masks are stored lossless, 'png' or 'raw'")
        dt = np.dtype(self.dtype)
        if dt not in (np.dtype(np.uint8), np.dtype(np.uint16)):
            raise ValueError(f"mask dtype {dt}: use uint8 or uint16")
        object.__setattr__(self, "dtype", dt.str)
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
            if len(self.shape) != 2:
                raise ValueError(f"mask shape must be (H, W), got {self.shape}")
        top = np.iinfo(dt).max
        if self.ignore_index is not None and not 0 <= self.ignore_index <= top:
            raise ValueError(f"mask ignore_index {self.ignore_index}: a {dt} value (0..{top})")

    @property
    def ext(self) -> str:  # type: ignore[override]
        return self.codec if self.codec == "png" else "npy"

    @cached_property
    def _header(self) -> tuple[bytes, np.dtype, tuple[int, ...]] | None:
        return npy_header(np.dtype(self.dtype), self.shape) if self.shape else None

    def validate(self, value: Any) -> Any:
        if self.codec == "png" and isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        from .imaging import encode_mask_png  # Pillow: loaded by the first mask encoded
        arr = np.asarray(value)
        if arr.ndim != 2 or arr.dtype != np.dtype(self.dtype):
            raise ValueError(f"field {self.name!r}: mask must be H×W {np.dtype(self.dtype)}, got "
                             f"{arr.dtype} {arr.shape}")
        if self.shape and arr.shape != self.shape:
            raise ValueError(f"field {self.name!r}: mask shape {arr.shape} != {self.shape}")
        if self.num_classes is not None and \
                (top := largest_class(arr, self.ignore_index)) >= self.num_classes:
            raise ValueError(f"field {self.name!r}: mask index {top} >= num_classes "
                             f"{self.num_classes}")
        return encode_mask_png(arr) if self.codec == "png" else np.ascontiguousarray(arr)

    def encode(self, value: Any) -> bytes:
        return bytes(value) if self.codec == "png" else npy_encode(value)

    def decode(self, payload: Buffer, what: str) -> Any:
        if self.codec == "png":
            return payload
        arr = npy_decode(payload, what, self._header)
        if arr.dtype != np.dtype(self.dtype) or arr.ndim != 2:
            raise CorruptRecordError(f"{what}: mask is {arr.dtype} {arr.shape}, schema says "
                                     f"{np.dtype(self.dtype)} H×W")
        return arr

    def materialize(self, value: Any) -> Any:
        return bytes(value) if self.codec == "png" else np.array(value)

    def to_user(self, value: Any, what: str) -> np.ndarray:
        """The H×W index array (PNG decoded without any colour conversion)."""
        if self.codec == "raw":
            return np.array(value)
        from .imaging import decode_mask_png  # Pillow: loaded by the first mask decoded

        arr = decode_mask_png(value, what)
        if arr.dtype != np.dtype(self.dtype):
            raise CorruptRecordError(f"{what}: mask PNG holds {arr.dtype}, schema says "
                                     f"{np.dtype(self.dtype)}")
        return arr


def ignore_index_of(fields: Iterable[Field]) -> int | None:
    """The mask field's ``ignore_index`` (what ``loader.ignore_index`` reads); None without one."""
    return next((f.ignore_index for f in fields if isinstance(f, MaskField)), None)


def largest_class(mask: np.ndarray, ignore_index: int | None = None) -> int:
    """The largest class index in ``mask``, pixels at ``ignore_index`` left out; -1 if none."""
    if ignore_index is not None:
        mask = mask[mask != ignore_index]
    return int(mask.max()) if mask.size else -1


@dataclass(frozen=True)
class TargetField(ArrayField):
    """A per-pixel target computed from the mask at conversion (H×W or H×W×C), e.g. a distance
    map, stored as ``dtype`` (float16, or uint8/uint16 quantized: stored × ``scale`` + ``offset``;
    ``to_user`` gives float32). ``interp``: how loaders resample it ("linear" or "nearest");
    ``rescale="distance"``: values in pixels, multiplied by the geometric scale, then ``clip``ped
    again. ``target`` and ``params`` record how it was computed."""

    target: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    interp: Literal["linear", "nearest"] = "linear"
    rescale: Literal["distance", "none"] = "none"
    scale: float = 1.0
    offset: float = 0.0
    clip: tuple[float, float] | None = None
    kind: ClassVar[str] = "target"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.params, dict):
            object.__setattr__(self, "params", tuple(sorted(self.params.items())))
        else:
            object.__setattr__(self, "params", tuple((str(k), v) for k, v in self.params))
        if self.interp not in ("linear", "nearest"):
            raise ValueError(f"target interp {self.interp!r}: use 'linear' or 'nearest'")
        if self.rescale not in ("distance", "none"):
            raise ValueError(f"target rescale {self.rescale!r}: use 'distance' or 'none'")
        if self.clip is not None:
            object.__setattr__(self, "clip", (float(self.clip[0]), float(self.clip[1])))
        if self.shape is None or len(self.shape) not in (2, 3):
            raise ValueError(f"target {self.name!r}: shape must be (H, W) or (H, W, C) with None "
                             f"for sizes that vary, got {self.shape}")

    @property
    def channels(self) -> int | None:
        """C for an H×W×C target, None for H×W."""
        shape = self.shape or ()
        return shape[2] if len(shape) == 3 else None

    @property
    def quantized(self) -> bool:
        return np.dtype(self.dtype).kind in "ui" and (self.scale != 1.0 or self.offset != 0.0)

    def to_user(self, value: Any, what: str) -> np.ndarray:
        """The target as float32 (dequantized); integer-valued targets keep their dtype."""
        if np.dtype(self.dtype).kind in "ui" and not self.quantized:
            return np.array(value)
        return dequantize(np.asarray(value), self.scale, self.offset)


def dequantize(stored: np.ndarray, scale: float, offset: float) -> np.ndarray:
    """Stored target values → float32 (``stored × scale + offset``)."""
    out = stored.astype(np.float32)
    if scale != 1.0:
        out *= np.float32(scale)
    if offset != 0.0:
        out += np.float32(offset)
    return out
