"""The sample schema: frozen field descriptions, each of which knows how to encode and decode itself.

A sample is a dict of named fields. A field's *stored* value is what a format keeps on disk
(encoded image bytes, a raw uint8 array, an int, an ndarray, bytes, or a JSON value); its *user*
value is what ``ds[i]`` returns (images decoded to H×W×3 uint8, everything else unchanged).
Every field has one canonical byte payload, used by LMDB records and WebDataset members alike.
"""

from __future__ import annotations

import io
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Iterator, Literal, cast

import numpy as np
from PIL import Image

from ..errors import CorruptRecordError, ManifestError
from .codecs import Buffer, check_dtype, npy_decode, npy_encode, npy_header
from .imaging import CODEC_EXT, decode_rgb

ImageCodec = Literal["jpeg", "png", "webp", "mixed", "raw"]
IMAGE_CODECS = ("jpeg", "png", "webp", "mixed", "raw")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Field(ABC):
    """One named field of a sample."""

    name: str
    kind: ClassVar[str]
    ext: ClassVar[str]

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"field name {self.name!r} must be an identifier (letters, digits, _)")

    @property
    def wds_suffix(self) -> str:
        """WebDataset member suffix: the bare extension for the conventional names, else name.ext."""
        return self.ext if self.name in ("image", "label") else f"{self.name}.{self.ext}"

    def to_json(self) -> dict[str, Any]:
        """JSON description stored in the manifest."""
        return {"name": self.name, "kind": self.kind}

    @abstractmethod
    def encode(self, value: Any) -> bytes:
        """Stored value → canonical payload bytes."""

    @abstractmethod
    def decode(self, payload: Buffer, what: str) -> Any:
        """Canonical payload → stored value (may view ``payload``: zero-copy)."""

    def validate(self, value: Any) -> Any:
        """Check a stored value before writing; returns it in canonical Python/numpy form."""
        return value

    def materialize(self, value: Any) -> Any:
        """Copy a stored value so it outlives the buffer it may view."""
        return value

    def to_user(self, value: Any, what: str) -> Any:
        """Stored value → the value ``ds[i]`` returns (a copy that outlives read buffers)."""
        return self.materialize(value)


@dataclass(frozen=True)
class ImageField(Field):
    """An image: encoded bytes (jpeg/png/webp) or raw H×W×3 uint8 (``shape`` fixed, or None).

    ``codec="mixed"``: records hold different encodings (JPEG and PNG, say), told apart by their
    magic bytes (:func:`~feedpipe.schema.imaging.sniff_codec`); WebDataset members end in ``.img``.
    """

    codec: ImageCodec = "jpeg"
    shape: tuple[int, int, int] | None = None
    kind: ClassVar[str] = "image"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.codec not in IMAGE_CODECS:
            raise ValueError(f"image codec {self.codec!r} is not one of {', '.join(IMAGE_CODECS)}")
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
            if len(self.shape) != 3 or self.shape[2] != 3:
                raise ValueError(f"raw image shape must be (H, W, 3), got {self.shape}")

    @property
    def ext(self) -> str:  # type: ignore[override]
        return "npy" if self.codec == "raw" else CODEC_EXT[self.codec]

    @cached_property
    def _header(self) -> tuple[bytes, np.dtype, tuple[int, ...]] | None:
        return npy_header(np.dtype(np.uint8), self.shape) if self.shape else None

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "codec": self.codec,
                "shape": list(self.shape) if self.shape else None}

    def validate(self, value: Any) -> Any:
        if self.codec != "raw":
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f"field {self.name!r}: encoded image must be bytes")
            return bytes(value)
        arr = np.asarray(value)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
            raise ValueError(f"field {self.name!r}: raw image must be H×W×3 uint8, got "
                             f"{arr.dtype} {arr.shape}")
        if self.shape and arr.shape != self.shape:
            raise ValueError(f"field {self.name!r}: raw image shape {arr.shape} != {self.shape}")
        return np.ascontiguousarray(arr)

    def encode(self, value: Any) -> bytes:
        return npy_encode(value) if self.codec == "raw" else bytes(value)

    def decode(self, payload: Buffer, what: str) -> Any:
        if self.codec == "raw":
            arr = npy_decode(payload, what, self._header)
            if arr.dtype != np.uint8 or arr.ndim != 3:
                raise CorruptRecordError(f"{what}: raw image is {arr.dtype} {arr.shape}")
            return arr
        return payload

    def materialize(self, value: Any) -> Any:
        return np.array(value) if self.codec == "raw" else bytes(value)

    def to_user(self, value: Any, what: str) -> np.ndarray:
        if self.codec == "raw":
            return np.array(value)
        try:
            return decode_rgb(value, self.codec, what)
        except Exception as exc:
            raise CorruptRecordError(str(exc)) from exc


@dataclass(frozen=True)
class LabelField(Field):
    """An integer class label; stored as ASCII decimal (the WebDataset ``.cls`` convention)."""

    kind: ClassVar[str] = "label"
    ext: ClassVar[str] = "cls"

    def validate(self, value: Any) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"field {self.name!r}: label must be an int, got {type(value).__name__}")
        return int(value)

    def encode(self, value: Any) -> bytes:
        return str(int(value)).encode()

    def decode(self, payload: Buffer, what: str) -> int:
        try:
            return int(bytes(payload))
        except ValueError as exc:
            raise CorruptRecordError(f"{what}: label is not an integer") from exc


@dataclass(frozen=True)
class ArrayField(Field):
    """An ndarray of a fixed dtype; ``shape`` entries are ints or None (variable); None = any."""

    dtype: str = "float32"
    shape: tuple[int | None, ...] | None = None
    kind: ClassVar[str] = "ndarray"
    ext: ClassVar[str] = "npy"

    def __post_init__(self) -> None:
        super().__post_init__()
        dt = np.dtype(self.dtype)
        check_dtype(dt, f"field {self.name!r}")
        object.__setattr__(self, "dtype", dt.str)
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(None if s is None else int(s)
                                                    for s in self.shape))

    @property
    def fixed(self) -> bool:
        """True when every dimension is known, so all samples share one shape."""
        return self.shape is not None and all(s is not None for s in self.shape)

    @cached_property
    def _header(self) -> tuple[bytes, np.dtype, tuple[int, ...]] | None:
        if self.shape is None or not self.fixed:
            return None
        return npy_header(np.dtype(self.dtype), cast("tuple[int, ...]", self.shape))

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape)}

    def validate(self, value: Any) -> np.ndarray:
        arr = np.asarray(value)
        check_dtype(arr.dtype, f"field {self.name!r}")
        if arr.dtype != np.dtype(self.dtype):
            if not np.can_cast(arr.dtype, self.dtype, "same_kind"):
                raise TypeError(f"field {self.name!r}: dtype {arr.dtype} does not fit {self.dtype}")
            arr = arr.astype(self.dtype)
        self._check_shape(arr.shape, f"field {self.name!r}", ValueError)
        return np.asarray(arr, order="C")  # not ascontiguousarray: that turns 0-d into 1-d

    def _check_shape(self, shape: tuple[int, ...], what: str, exc: type[Exception]) -> None:
        if self.shape is None:
            return
        if len(shape) != len(self.shape) or any(
                s is not None and s != d for s, d in zip(self.shape, shape)):
            raise exc(f"{what}: shape {shape} does not match schema {self.shape}")

    def encode(self, value: Any) -> bytes:
        return npy_encode(value)

    def decode(self, payload: Buffer, what: str) -> np.ndarray:
        arr = npy_decode(payload, what, self._header)
        if arr.dtype != np.dtype(self.dtype):
            raise CorruptRecordError(f"{what}: dtype {arr.dtype} != schema {self.dtype}")
        self._check_shape(arr.shape, what, CorruptRecordError)
        return arr

    def materialize(self, value: Any) -> np.ndarray:
        return np.array(value)


MaskCodec = Literal["png", "raw"]


@dataclass(frozen=True)
class MaskField(Field):
    """A segmentation mask: H×W class indices (uint8 or uint16), stored lossless as PNG or raw npy.

    ``num_classes`` is recorded at conversion (the largest index seen + 1 unless given); loaders
    resize masks with nearest-neighbour sampling so indices are never blended.
    """

    codec: MaskCodec = "png"
    dtype: str = "|u1"
    num_classes: int | None = None
    shape: tuple[int, int] | None = None
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

    @property
    def ext(self) -> str:  # type: ignore[override]
        return self.codec if self.codec == "png" else "npy"

    @cached_property
    def _header(self) -> tuple[bytes, np.dtype, tuple[int, ...]] | None:
        return npy_header(np.dtype(self.dtype), self.shape) if self.shape else None

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "codec": self.codec, "dtype": self.dtype,
                "num_classes": self.num_classes,
                "shape": list(self.shape) if self.shape else None}

    def validate(self, value: Any) -> Any:
        if self.codec == "png" and isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        arr = np.asarray(value)
        if arr.ndim != 2 or arr.dtype != np.dtype(self.dtype):
            raise ValueError(f"field {self.name!r}: mask must be H×W {np.dtype(self.dtype)}, got "
                             f"{arr.dtype} {arr.shape}")
        if self.shape and arr.shape != self.shape:
            raise ValueError(f"field {self.name!r}: mask shape {arr.shape} != {self.shape}")
        if self.num_classes is not None and arr.size and int(arr.max()) >= self.num_classes:
            raise ValueError(f"field {self.name!r}: mask index {int(arr.max())} >= num_classes "
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
        arr = decode_mask_png(value, what)
        if arr.dtype != np.dtype(self.dtype):
            raise CorruptRecordError(f"{what}: mask PNG holds {arr.dtype}, schema says "
                                     f"{np.dtype(self.dtype)}")
        return arr


def encode_mask_png(arr: np.ndarray) -> bytes:
    """Lossless PNG of an H×W uint8 (mode L) or uint16 (mode I;16) index array."""
    out = io.BytesIO()  # Pillow picks mode L for uint8 and I;16 for uint16
    Image.fromarray(np.ascontiguousarray(arr)).save(out, "PNG", compress_level=1)
    return out.getvalue()


def decode_mask_png(data: Buffer, what: str) -> np.ndarray:
    """PNG → H×W index array: L/P/1 → uint8 (palette indices, not colours), I;16 → uint16."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "PNG":
                raise ValueError(f"not a PNG ({im.format})")
            if im.mode in ("L", "P"):
                indices: np.ndarray = np.asarray(im, dtype=np.uint8).copy()
                return indices
            if im.mode == "1":
                return np.asarray(im, dtype=np.uint8)
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                arr = np.asarray(im)
                if arr.size and (arr.min() < 0 or arr.max() > 0xFFFF):
                    raise ValueError("mask index out of uint16 range")
                return arr.astype(np.uint16)
            raise ValueError(f"PNG mode {im.mode} is not an index mask (use L, P, 1 or I;16)")
    except (OSError, ValueError, SyntaxError) as exc:
        raise CorruptRecordError(f"{what}: cannot decode mask: {exc}") from exc


@dataclass(frozen=True)
class TargetField(ArrayField):
    """A per-pixel target computed from the mask at conversion (H×W or H×W×C), e.g. a distance map.

    Stored as ``dtype`` (float16, or uint8/uint16 quantized: value = stored × ``scale`` +
    ``offset``); ``to_user`` returns float32. ``interp`` says how loaders resample it under
    geometric augmentation ("linear" or "nearest"); ``rescale="distance"`` marks values measured in
    pixels, which loaders multiply by the geometric scale. ``clip`` bounds (truncation) are
    re-applied after that. ``target`` and ``params`` record how it was computed.
    """

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

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "target": self.target, "params": dict(self.params),
                "interp": self.interp, "rescale": self.rescale, "scale": self.scale,
                "offset": self.offset, "clip": list(self.clip) if self.clip else None}

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


@dataclass(frozen=True)
class BytesField(Field):
    """Opaque bytes, returned as ``bytes`` and never interpreted."""

    kind: ClassVar[str] = "bytes"
    ext: ClassVar[str] = "bin"

    def validate(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"field {self.name!r}: expected bytes, got {type(value).__name__}")
        return bytes(value)

    def encode(self, value: Any) -> bytes:
        return bytes(value)

    def decode(self, payload: Buffer, what: str) -> Buffer:
        return payload

    def materialize(self, value: Any) -> bytes:
        return bytes(value)


@dataclass(frozen=True)
class JsonField(Field):
    """Small JSON-able metadata (the source path, a caption, ...), stored as UTF-8 JSON."""

    kind: ClassVar[str] = "json"
    ext: ClassVar[str] = "json"

    def validate(self, value: Any) -> Any:
        self.encode(value)
        return value

    def encode(self, value: Any) -> bytes:
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(f"field {self.name!r}: value is not JSON-serializable: {exc}") from exc

    def decode(self, payload: Buffer, what: str) -> Any:
        try:
            return json.loads(bytes(payload))
        except ValueError as exc:
            raise CorruptRecordError(f"{what}: invalid JSON in field {self.name!r}") from exc


FIELD_KINDS: dict[str, type[Field]] = {
    cls.kind: cls for cls in (ImageField, LabelField, ArrayField, BytesField, JsonField, MaskField,
                              TargetField)}


def field_from_json(d: dict[str, Any]) -> Field:
    """Rebuild a field from its manifest description; unknown kinds are a ManifestError."""
    try:
        cls = FIELD_KINDS[d["kind"]]
        kwargs = {k: v for k, v in d.items() if k != "kind"}
        for key in ("shape", "clip"):
            if kwargs.get(key) is not None:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"bad field description {d!r}: {exc}") from exc


@dataclass(frozen=True)
class Schema:
    """An ordered, immutable set of fields with unique names."""

    fields: tuple[Field, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate field names in schema: {names}")
        suffixes = [f.wds_suffix for f in self.fields]
        if len(set(suffixes)) != len(suffixes):
            raise ValueError(f"fields map to the same WebDataset member suffix: {suffixes}")

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no field {name!r}; the schema has {self.names}")

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, items: list[dict[str, Any]]) -> "Schema":
        if not isinstance(items, list):
            raise ManifestError("schema must be a list of field descriptions")
        return cls(tuple(field_from_json(d) for d in items))
