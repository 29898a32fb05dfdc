"""Conversion sources: an ImageFolder tree, a flat folder, or a CSV/JSONL manifest.

Every source becomes a sorted, deterministic list of :class:`SourceItem` plus the class names.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".jpe", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif",
                        ".ppm", ".pgm", ".pbm"})


@dataclass(frozen=True)
class SourceItem:
    """One input image: where it is, its path relative to the source root, its label, extras,
    and its mask file (segmentation sources)."""

    path: Path
    rel: str
    label: int = -1
    extra: dict[str, Any] | None = None
    mask: Path | None = None


@dataclass(frozen=True)
class Source:
    """A scanned source: items in deterministic order, class names, and ignored non-image files."""

    root: Path
    kind: str
    items: tuple[SourceItem, ...]
    classes: tuple[str, ...] = ()
    ignored: tuple[str, ...] = field(default_factory=tuple)
    masked: bool = False  # a segmentation source: every item should have a mask
    unmatched_masks: tuple[str, ...] = ()  # mask files that no image matched

    @property
    def labeled(self) -> bool:
        return self.kind == "imagefolder" or any(i.label >= 0 for i in self.items)

    @property
    def has_extra(self) -> bool:
        return any(i.extra for i in self.items)


def _files(root: Path) -> list[Path]:
    return sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.as_posix())


def scan(src: str | Path) -> Source:
    """Detect the source kind and list its images.

    A directory whose top level holds only sub-directories is an ImageFolder tree (sorted class
    folder names → labels 0..K-1); any other directory is a flat folder (no labels, searched
    recursively); a ``.csv``/``.jsonl`` file is a manifest.
    """
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"{src}: source does not exist")
    if src.is_file():
        if src.suffix.lower() in (".csv", ".jsonl"):
            return _scan_manifest(src)
        raise ValueError(f"{src}: a source file must be a .csv or .jsonl manifest")
    top = sorted(src.iterdir(), key=lambda p: p.name)
    dirs = [p for p in top if p.is_dir() and not p.name.startswith(".")]
    top_images = [p for p in top if p.is_file() and p.suffix.lower() in IMAGE_EXTS]
    if dirs and not top_images:
        classes = tuple(d.name for d in dirs)
        items, ignored = [], []
        for label, d in enumerate(dirs):
            for p in _files(d):
                rel = p.relative_to(src).as_posix()
                if p.suffix.lower() in IMAGE_EXTS:
                    items.append(SourceItem(p, rel, label))
                else:
                    ignored.append(rel)
        return Source(src, "imagefolder", tuple(items), classes, tuple(ignored))
    items, ignored = [], []
    for p in _files(src):
        rel = p.relative_to(src).as_posix()
        if any(part.startswith(".") for part in Path(rel).parts):
            continue
        if p.suffix.lower() in IMAGE_EXTS:
            items.append(SourceItem(p, rel))
        else:
            ignored.append(rel)
    return Source(src, "folder", tuple(items), (), tuple(ignored))


def _scan_manifest(path: Path) -> Source:
    """CSV (header row) or JSONL rows with ``path`` (relative to the manifest), optional ``label``
    (int or class name) and any extra columns (kept as the ``meta`` JSON field)."""
    rows: list[dict[str, Any]] = []
    with open(path, newline="", encoding="utf-8") as fh:
        if path.suffix.lower() == ".csv":
            rows = [dict(r) for r in csv.DictReader(fh)]
        else:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as exc:
                        raise ValueError(f"{path}:{n}: invalid JSON line: {exc}") from exc
    for n, r in enumerate(rows, 1):
        if not isinstance(r, dict) or not r.get("path"):
            raise ValueError(f"{path}: row {n} has no 'path' column")
    labels = [r.get("label") for r in rows]
    classes: tuple[str, ...] = ()
    to_int: dict[Any, int] = {}
    present = [lab for lab in labels if lab not in (None, "")]
    if present:
        if all(isinstance(lab, int) or str(lab).lstrip("-").isdigit() for lab in present):
            to_int = {lab: int(lab) for lab in present}
        else:
            classes = tuple(sorted({str(lab) for lab in present}))
            to_int = {lab: classes.index(str(lab)) for lab in present}
    masked = any(r.get("mask") not in (None, "") for r in rows)
    items = []
    for r in rows:
        rel = str(r["path"])
        extra = {k: v for k, v in r.items() if k not in ("path", "label", "mask")}
        lab = r.get("label")
        mask = path.parent / str(r["mask"]) if r.get("mask") not in (None, "") else None
        items.append(SourceItem((path.parent / rel), rel,
                                to_int[lab] if lab not in (None, "") else -1, extra or None, mask))
    return Source(path.parent, "manifest", tuple(items), classes, (), masked)


def attach_masks(source: Source, masks: str | Path) -> Source:
    """Pair each image with the mask file of the same name in ``masks`` (any image extension).

    A mask matches by its path relative to ``masks`` without extension (``cls/a.jpg`` ↔
    ``cls/a.png``), else by file stem when exactly one mask and one image have that stem (a flat
    mask folder for an ImageFolder tree). Images without a mask are kept and later skipped with that reason;
    masks without an image are listed in ``unmatched_masks``.
    """
    root = Path(masks)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: mask folder does not exist")
    files = [p for p in _files(root) if p.suffix.lower() in IMAGE_EXTS
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    by_rel: dict[str, Path] = {}
    by_stem: dict[str, list[Path]] = {}
    for p in files:
        by_rel[p.relative_to(root).with_suffix("").as_posix()] = p
        by_stem.setdefault(p.stem, []).append(p)
    image_stems: dict[str, int] = {}
    for it in source.items:
        image_stems[Path(it.rel).stem] = image_stems.get(Path(it.rel).stem, 0) + 1
    used: set[Path] = set()
    items = []
    for it in source.items:
        rel = Path(it.rel).with_suffix("").as_posix()
        name = Path(it.rel).stem
        stem = by_stem.get(name, [])
        # by stem only when it is unique on both sides: one mask must never serve two images
        m = by_rel.get(rel) or (stem[0] if len(stem) == 1 and image_stems[name] == 1 else None)
        if m is not None:
            used.add(m)
        items.append(SourceItem(it.path, it.rel, it.label, it.extra, m))
    unmatched = tuple(p.relative_to(root).as_posix() for p in files if p not in used)
    return Source(source.root, source.kind, tuple(items), source.classes, source.ignored, True,
                  unmatched)
