"""A COCO ``instances.json`` as a conversion source: boxes as xyxy pixels, category ids mapped to
contiguous labels (the ids kept as the boxes field's ``class_ids``), ``iscrowd`` per box, the
image's id in ``meta`` as ``coco_id`` (docs/sources.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from feedpipe.errors import BadInputError
from feedpipe.schema.geometric import BoxesField

from .sources import Source, SourceItem, outside, read_regular


def scan_coco(images: str | Path, instances: str | Path, contained: bool = False) -> Source:
    """The images of ``instances`` (relative to ``images``) with a ``boxes`` field each;
    ``contained``: a file name leading outside ``images`` is refused by name."""
    images, instances = Path(images), Path(instances)
    try:
        doc = json.loads(read_regular(instances).decode())  # never a FIFO
        imgs, anns, cats = doc["images"], doc.get("annotations", []), doc["categories"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(f"{instances}: not a COCO instances file: {exc!r}") from exc
    bad = [c.get("id") for c in cats
           if not isinstance(c.get("id"), int) or isinstance(c.get("id"), bool)]
    if bad:
        raise BadInputError(f"{instances}: category ids must be integers (as COCO's); found "
                            f"{bad[:3]!r}", file=instances)
    cats = sorted(cats, key=lambda c: c["id"])
    index = {c["id"]: k for k, c in enumerate(cats)}
    classes = tuple(str(c["name"]) for c in cats)
    per_image: dict[Any, list[dict[str, Any]]] = {im["id"]: [] for im in imgs}
    for a in anns:
        if a.get("image_id") not in per_image or a.get("category_id") not in index:
            raise BadInputError(f"{instances}: annotation {a.get('id')!r} names image "
                                f"{a.get('image_id')!r} / category {a.get('category_id')!r}, "
                                "which the file does not list")
        per_image[a["image_id"]].append(a)
    field = BoxesField("boxes", classes=classes, attrs=("iscrowd",),
                       class_ids=tuple(int(c["id"]) for c in cats))
    items, refused = [], []
    for im in sorted(imgs, key=lambda i: i["file_name"]):
        rows = sorted(per_image[im["id"]], key=lambda a: a["id"])
        xywh = np.array([a["bbox"] for a in rows], np.float64).reshape(-1, 4)
        boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
        value = {"boxes": boxes, "labels": np.array([index[a["category_id"]] for a in rows],
                                                    np.int64),
                 "iscrowd": np.array([int(a.get("iscrowd", 0)) for a in rows], np.int64)}
        rel = str(im["file_name"])
        if contained and (away := outside(images, rel)) is not None:
            refused.append((rel, away))
            continue
        items.append(SourceItem(images / rel, rel, extra={"coco_id": im["id"]},
                                fields={"boxes": value}))
    return Source(images, "coco", tuple(items), classes, typed=(field,), refused=tuple(refused),
                  contained=contained)
