"""The schema of a dataset: an ordered set of fields with unique names, and its manifest JSON
(each field kind rebuilt by :func:`field_from_json`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import DamagedDataError
from .fields import ArrayField, BytesField, Field, ImageField, JsonField, LabelField
from .geometric import BoxesField, KeypointsField, TextField
from .masks import MaskField, TargetField

FIELD_KINDS: dict[str, type[Field]] = {
    cls.kind: cls for cls in (ImageField, LabelField, ArrayField, BytesField, JsonField, MaskField,
                              TargetField, KeypointsField, BoxesField, TextField)}


def field_from_json(d: dict[str, Any]) -> Field:
    """Rebuild a field from its manifest description; unknown kinds are a DamagedDataError."""
    try:
        return FIELD_KINDS[d["kind"]](**{k: v for k, v in d.items() if k != "kind"})
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedDataError(f"bad field description {d!r}: {exc}") from exc


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
            raise DamagedDataError("schema must be a list of field descriptions")
        return cls(tuple(field_from_json(d) for d in items))
