"""The naive baseline ``feedpipe bench --baseline`` compares against: a default DataLoader.

What most training scripts start from: an ImageFolder-style Dataset that opens and decodes one
image per ``__getitem__`` with PIL, resizes the shorter side, center-crops, converts like
torchvision's ``ToTensor`` (float in [0, 1], C×H×W), default collate, ``num_workers=0``. It reads
the loose image files: the source folder, or for a packed dataset the original files named in its
manifest when they still exist; otherwise it decodes the packed bytes one sample at a time, as a
naive Dataset over the packed file would. The tuned baseline is the same DataLoader with the
settings its docs recommend (workers, persistent, prefetch): what a careful user writes.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from ..dataset.registry import DatasetReader
from ..workers import single_threaded


def to_tensor(img: Image.Image, size: int) -> torch.Tensor:
    """PIL → RGB, shorter side to ``size`` (bilinear), center crop, ToTensor-equivalent."""
    img = img.convert("RGB")
    w, h = img.size
    s = size / min(w, h)
    img = img.resize((max(size, round(w * s)), max(size, round(h * s))), Image.BILINEAR)
    left, top = (img.width - size) // 2, (img.height - size) // 2
    arr = np.array(img.crop((left, top, left + size, top + size)))
    return torch.from_numpy(arr).permute(2, 0, 1).float().div_(255)


class FileImages(Dataset):
    """One loose image file per sample."""

    def __init__(self, items: Sequence[tuple[str, int]], size: int) -> None:
        self.items, self.size = list(items), size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with Image.open(path) as img:
            return to_tensor(img, self.size), label


class PackedImages(Dataset):
    """One packed record per sample, read and decoded alone (no batched reads)."""

    def __init__(self, reader: DatasetReader, indices: Sequence[int], size: int) -> None:
        self.reader, self.indices, self.size = reader, list(indices), size

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rec = self.reader.read_raw(self.indices[i])
        img = rec["image"]
        pil = Image.fromarray(img) if isinstance(img, np.ndarray) else Image.open(io.BytesIO(img))
        return to_tensor(pil, self.size), int(rec.get("label", 0))


def stored_bytes_per_sample(reader: DatasetReader) -> float:
    """Mean stored bytes per sample: the dataset's file sizes (manifest) over its samples."""
    return sum(f.size for f in reader.manifest.files) / max(1, len(reader))


def original_files(reader: DatasetReader, indices: Sequence[int]) -> list[tuple[str, int]] | None:
    """(source file, label) of ``indices`` if the manifest names the files and all still exist."""
    source = reader.manifest.conversion.get("source")
    if not source or "path" not in reader.schema:
        return None
    names = ["path"] + (["label"] if "label" in reader.schema else [])
    out: list[tuple[str, int]] = []

    def keep(_: int, s: dict[str, Any]) -> None:
        rel = reader.schema["path"].to_user(s["path"], "path")
        label = reader.schema["label"].to_user(s["label"], "label") if "label" in s else 0
        out.append((os.path.join(source, rel), int(label)))

    reader.visit(indices, keep, names)
    return out if all(os.path.isfile(p) for p, _ in out) else None


def naive_loader(reader: DatasetReader, source_items: Sequence[Any] | None, *, batch_size: int,
                 size: int, samples: int | None, seed: int,
                 workers: int = 0) -> tuple[DataLoader, str, float]:
    """(DataLoader, what it reads: 'loose files' | 'packed bytes', mean stored bytes/sample).

    ``source_items`` are the converters' SourceItems of a folder; else the samples come from
    ``reader``: a seeded random subset of ``samples`` of them (all when None). ``workers`` > 0:
    the DataLoader as its docs tune it (persistent workers of one thread each, prefetch 4).
    """
    if source_items is not None:
        items: list[tuple[str, int]] | None = [(str(i.path), max(0, i.label))
                                               for i in source_items]
    else:
        order = np.random.default_rng(seed).permutation(len(reader))[:samples].tolist()
        items = original_files(reader, order)
    if items is None:
        ds: Dataset = PackedImages(reader, order, size)
        what, mean = "packed bytes", stored_bytes_per_sample(reader)
    else:
        ds, what = FileImages(items, size), "loose files"
        mean = float(np.mean([Path(p).stat().st_size for p, _ in items])) if items else 0.0
    tuned = {"num_workers": workers, "persistent_workers": True, "prefetch_factor": 4,
             "worker_init_fn": _one_thread} if workers else {}
    return (DataLoader(ds, batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed), **tuned), what, mean)


def _one_thread(_: int) -> None:
    """``worker_init_fn``: one torch thread per worker, as feedpipe's own workers run."""
    single_threaded()
