"""Label fields beyond class labels: keypoints and boxes (which follow the image's crop, resize and
flip in the loader, ``feedpipe.loader.labels``) and text sequences (CTC targets). Keypoints are a
fixed-shape float32 array; boxes and text vary in length, so each is one opaque payload per sample
(the same bytes in every format), which :meth:`BoxesField.parse` reads back as array views."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import CorruptRecordError
from .codecs import Buffer
from .fields import ArrayField, BytesField

_F32, _I64 = np.dtype("<f4"), np.dtype("<i8")


@dataclass(frozen=True)
class KeypointsField(ArrayField):
    """K landmarks per sample, K×2 (x, y) or K×3 (x, y, visibility) float32, in pixel coordinates
    of the stored image (pixel ``i`` covers ``[i, i+1)``). ``flip_indices[i]`` names the landmark
    that point ``i`` becomes under a horizontal flip (the left eye becomes the right eye): a
    permutation that is its own inverse. Without it a flip moves the points but keeps their order.
    """

    flip_indices: tuple[int, ...] | None = None
    kind: ClassVar[str] = "keypoints"

    def __post_init__(self) -> None:
        super().__post_init__()
        if np.dtype(self.dtype) != np.float32:
            raise ValueError(f"field {self.name!r}: keypoints are float32, not {self.dtype}")
        if self.shape is None or len(self.shape) != 2 or self.shape[1] not in (2, 3) \
                or self.shape[0] is None or self.shape[0] < 1:
            raise ValueError(f"field {self.name!r}: keypoints shape must be (K, 2) or (K, 3), "
                             f"got {self.shape}")
        if self.flip_indices is not None:
            perm = tuple(int(i) for i in self.flip_indices)
            object.__setattr__(self, "flip_indices", perm)
            k = int(self.shape[0])
            if sorted(perm) != list(range(k)) or any(perm[perm[i]] != i for i in range(k)):
                raise ValueError(f"field {self.name!r}: flip_indices must be a self-inverse "
                                 f"permutation of 0..{k - 1} (left <-> right pairs), got {perm}")

    @property
    def has_visibility(self) -> bool:
        return self.shape[1] == 3  # type: ignore[index]


@dataclass(frozen=True)
class BoxesField(BytesField):
    """A variable number M of boxes per sample: M×4 float32 ``xyxy`` pixels of the stored image,
    M int64 category indices (into ``classes`` when given) and one int64 per box for each name in
    ``attrs`` (COCO's ``iscrowd``, say). ``class_ids`` keeps the source's id of each class (COCO
    category ids: ``class_ids[label]``), so results map back for the source's evaluation.
    The user value is a dict ``{"boxes": M×4, "labels": M, **{attr: M}}``; the payload is the
    little-endian float32 boxes, then the int64 rows ``[label, *attrs]`` (its length gives M).
    """

    classes: tuple[str, ...] | None = None
    attrs: tuple[str, ...] = ()
    class_ids: tuple[int, ...] | None = None  # the source's id of each class (COCO category ids)
    kind: ClassVar[str] = "boxes"
    ext: ClassVar[str] = "boxes"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        if self.class_ids is not None:
            ids = tuple(int(i) for i in self.class_ids)
            object.__setattr__(self, "class_ids", ids)
            if self.classes is None or len(ids) != len(self.classes) or len(set(ids)) != len(ids):
                raise ValueError(f"field {self.name!r}: class_ids must be one distinct id per "
                                 f"class ({len(self.classes or ())}), got {len(ids)}")
        object.__setattr__(self, "attrs", tuple(str(a) for a in self.attrs))
        bad = [a for a in self.attrs if a in ("boxes", "labels", "count") or not a.isidentifier()]
        if bad or len(set(self.attrs)) != len(self.attrs):
            raise ValueError(f"field {self.name!r}: box attributes {list(self.attrs)} must be "
                             "distinct identifiers other than boxes/labels/count")

    @property
    def row_bytes(self) -> int:
        return 4 * _F32.itemsize + (1 + len(self.attrs)) * _I64.itemsize

    def validate(self, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):  # a payload (re-packing a dataset)
            self.parse(value, f"field {self.name!r}")
            return bytes(value)
        if not isinstance(value, dict) or "boxes" not in value or "labels" not in value:
            raise TypeError(f"field {self.name!r}: boxes are a dict with 'boxes' (M×4 xyxy) and "
                            "'labels' (M)" + "".join(f", {a!r} (M)" for a in self.attrs))
        boxes = np.asarray(value["boxes"], dtype=np.float64)
        if boxes.size == 0:
            boxes = boxes.reshape(0, 4)
        m = boxes.shape[0]
        if boxes.shape != (m, 4) or not np.isfinite(boxes).all():
            raise ValueError(f"field {self.name!r}: boxes must be finite M×4, got {boxes.shape}")
        if (boxes[:, 2] < boxes[:, 0]).any() or (boxes[:, 3] < boxes[:, 1]).any():
            raise ValueError(f"field {self.name!r}: boxes are xyxy with x2 >= x1 and y2 >= y1")
        ints = np.empty((m, 1 + len(self.attrs)), _I64)
        for j, key in enumerate(("labels", *self.attrs)):
            col = np.asarray(value.get(key, ()))
            if col.shape != (m,) or (m and col.dtype.kind not in "iub"):
                raise ValueError(f"field {self.name!r}: {key!r} must be {m} integers, got "
                                 f"{col.dtype} {col.shape}")
            ints[:, j] = col
        labels = ints[:, 0]
        if m and (labels.min() < 0 or (self.classes is not None
                                       and labels.max() >= len(self.classes))):
            raise ValueError(f"field {self.name!r}: labels must be in 0..{len(self.classes or ())}"
                             f" - 1, got {labels.min()}..{labels.max()}")
        return boxes.astype(_F32).tobytes() + ints.tobytes()

    def parse(self, payload: Buffer, what: str) -> tuple[np.ndarray, np.ndarray]:
        """Payload → (M×4 float32 boxes, M×(1+len(attrs)) int64 ``[label, *attrs]``) views."""
        n = len(memoryview(payload))
        m, rest = divmod(n, self.row_bytes)
        if rest:
            raise CorruptRecordError(f"{what}: boxes payload of {n} bytes is not whole rows of "
                                     f"{self.row_bytes}")
        boxes = np.frombuffer(payload, _F32, 4 * m).reshape(m, 4)
        ints = np.frombuffer(payload, _I64, m * (1 + len(self.attrs)), 16 * m)
        return boxes, ints.reshape(m, 1 + len(self.attrs))

    def to_user(self, value: Any, what: str) -> dict[str, np.ndarray]:
        boxes, ints = self.parse(value, what)
        return {"boxes": boxes.copy(), "labels": ints[:, 0].copy(),
                **{a: ints[:, j + 1].copy() for j, a in enumerate(self.attrs)}}


@dataclass(frozen=True)
class TextField(BytesField):
    """A text label (a captcha's characters, an OCR line), stored as UTF-8. ``vocab`` (distinct
    characters) is checked at conversion; the loader then gives index ``vocab.index(c) + 1`` per
    character, 0 being the CTC blank and the padding. Without it the loader gives Unicode code
    points (NUL is refused, so 0 still pads)."""

    vocab: str | None = None
    kind: ClassVar[str] = "text"
    ext: ClassVar[str] = "txt"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab is not None and (len(set(self.vocab)) != len(self.vocab) or not self.vocab
                                       or "\0" in self.vocab):
            raise ValueError(f"field {self.name!r}: vocab must be distinct, non-NUL characters")

    def validate(self, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = self.text(value, f"field {self.name!r}")
        if not isinstance(value, str):
            raise TypeError(f"field {self.name!r}: text must be a str, got {type(value).__name__}")
        if "\0" in value:
            raise ValueError(f"field {self.name!r}: text holds a NUL character")
        if self.vocab is not None:
            unknown = sorted(set(value) - set(self.vocab))
            if unknown:
                raise ValueError(f"field {self.name!r}: {value!r} has characters outside the "
                                 f"vocabulary: {''.join(unknown)!r}")
        return value.encode("utf-8")

    @staticmethod
    def text(payload: Buffer, what: str) -> str:
        try:
            return bytes(payload).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"{what}: text is not UTF-8: {exc}") from exc

    def to_user(self, value: Any, what: str) -> str:
        return self.text(value, what)
