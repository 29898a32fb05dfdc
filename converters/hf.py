"""Hugging Face ``datasets`` as a conversion source: ``hf://org/name`` or a ``save_to_disk`` folder.
The first ``Image`` column is stored from its original encoded bytes, the first ``ClassLabel`` is
the label; numeric sequences become array fields, other columns JSON (docs/sources.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from feedpipe.errors import BadInputError, ConfigError, MissingDependencyError
from feedpipe.schema.fields import ArrayField, BytesField, Field, JsonField

from .records import Record, RecordSource, field_name


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError("Hugging Face sources need the datasets library: "
                                     "pip install 'feedpipe[hf]'") from exc
    return datasets


def is_saved_dataset(path: Path) -> bool:
    """A ``save_to_disk`` folder: a Dataset or a DatasetDict."""
    return path.is_dir() and ((path / "state.json").is_file()
                              or (path / "dataset_dict.json").is_file())


def _load(src: str, split: str) -> Any:
    datasets = _datasets()
    if src.startswith("hf://"):
        try:
            return datasets.load_dataset(src[len("hf://"):].strip("/"), split=split)
        except (FileNotFoundError, ValueError) as exc:
            raise BadInputError(f"{src}: cannot load split {split!r}: {exc}") from exc
    ds = datasets.load_from_disk(src)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ConfigError(f"split={split!r}: {src} holds the splits {sorted(ds)}",
                              option="split")
        ds = ds[split]
    return ds


def _array_dtype(feature: Any) -> str | None:
    """The numeric dtype of a (nested) Sequence/List of Value, else None."""
    datasets = _datasets()
    inner = getattr(feature, "feature", None)
    while inner is not None and not isinstance(inner, datasets.Value):
        inner = getattr(inner, "feature", None)
    try:
        dt = np.dtype(inner.dtype)  # type: ignore[union-attr]
    except (TypeError, AttributeError):  # no Value inside, or not a numpy dtype
        return None
    return dt.str if dt.kind in "biuf" else None


def source(src: str, split: str = "train") -> RecordSource:
    """A Hugging Face dataset as a :class:`RecordSource`."""
    datasets = _datasets()
    ds = _load(src, split)
    feats = ds.features
    image_cols = [c for c, f in feats.items() if isinstance(f, datasets.Image)]
    if not image_cols:
        raise BadInputError(f"{src}: no Image column (features: {dict(feats)}); feedpipe packs "
                            "images: cast the image column with datasets.Image()")
    image = image_cols[0]
    label = next((c for c, f in feats.items() if isinstance(f, datasets.ClassLabel)), None)
    classes = tuple(feats[label].names) if label else ()
    for c in image_cols:
        ds = ds.cast_column(c, datasets.Image(decode=False))  # the original encoded bytes
    taken = ["image", "label", "path"]
    fields: dict[str, Field] = {}
    for c, f in feats.items():
        if c in (image, label):
            continue
        name = field_name(c, taken)
        taken.append(name)
        dtype = _array_dtype(f)
        fields[c] = (BytesField(name) if c in image_cols else
                     ArrayField(name, dtype=dtype, shape=None) if dtype else JsonField(name))
    where = src if src.startswith("hf://") else str(Path(src))

    def records() -> Iterator[Record]:
        for k, row in enumerate(ds):
            values: dict[str, Any] = {}
            why = None
            try:
                data = _image_bytes(row[image], src)
                for c, f in fields.items():
                    v = row[c]
                    values[f.name] = (_image_bytes(v, src) if isinstance(f, BytesField) else
                                      np.asarray(v, dtype=f.dtype) if isinstance(f, ArrayField)
                                      else v)
            except (OSError, ValueError) as exc:
                data, why = None, str(exc)
            lab = row[label] if label else -1
            yield Record(f"{split}[{k}]", data, -1 if lab is None else int(lab), values, why)

    root = Path(src) if not src.startswith("hf://") else Path(datasets.config.HF_DATASETS_CACHE)
    return RecordSource((root,), "huggingface", tuple(fields.values()), classes, label is not None,
                        len(ds), records, (),
                        {"huggingface": where, "hf_split": split, "hf_image_column": image,
                         "hf_label_column": label,
                         "hf_columns": {c: f.name for c, f in fields.items()}})


def _image_bytes(value: Any, src: str) -> bytes:
    """An undecoded Image value ({"bytes", "path"}) → its encoded bytes, as stored."""
    if value is None:
        raise ValueError("no image (None)")
    if value.get("bytes"):
        return bytes(value["bytes"])
    if value.get("path"):
        return Path(value["path"]).read_bytes()
    raise ValueError(f"{src}: image has neither bytes nor a path")
