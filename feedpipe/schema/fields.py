"""The field model: frozen field descriptions, each of which encodes and decodes its values. A
field's *stored* value is what a format keeps (encoded image bytes, a raw uint8 array, an int, an
ndarray, bytes, a JSON value); its *user* value is what ``ds[i]`` returns (images decoded to
H×W×3 uint8). Each value has one canonical byte payload, in LMDB records and WebDataset alike."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, ClassVar, Literal, Mapping, cast

import numpy as np

from ..errors import CorruptRecordError
from .codecs import Buffer, check_dtype, npy_decode, npy_encode, npy_header

ImageCodec = Literal["jpeg", "png", "webp", "mixed", "raw"]
IMAGE_CODECS = ("jpeg", "png", "webp", "mixed", "raw")
CODEC_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp", "mixed": "img"}
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
        """The manifest's description: name, kind, then each attribute as JSON (tuples as lists,
        ``params`` as a dict; ``ignore_index`` and ``class_ids`` only when set)."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        for f in fields(self)[1:]:
            v = getattr(self, f.name)
            if v is None and f.name in ("ignore_index", "class_ids"):
                continue
            out[f.name] = dict(v) if f.name == "params" else list(v) if isinstance(v, tuple) else v
        return out

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
    ``codec="mixed"``: records hold different encodings, told apart by their magic bytes
    (:func:`~feedpipe.schema.imaging.sniff_codec`); WebDataset members end in ``.img``."""

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

    def to_user(self, value: Any, what: str, limits: Mapping[str, int] | None = None
                ) -> np.ndarray:
        """Decoded H×W×3 uint8; ``limits``: decode_rgb's bounds (max_pixels, max_scans,
        max_pixels_per_byte), e.g. those the dataset's converter recorded."""
        if self.codec == "raw":
            return np.array(value)
        from .imaging import decode_rgb  # Pillow: loaded by the first decode

        try:
            return decode_rgb(value, self.codec, what, **(limits or {}))
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
                s is not None and s != d for s, d in zip(self.shape, shape, strict=True)):
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
