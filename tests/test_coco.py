"""COCO ``instances.json`` → feedpipe: every box, category and iscrowd flag, checked against
pycocotools' own reading of the file, in every format and through the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI

import feedpipe
from converters import convert
from converters.synth import make_photos

pycocotools_coco = pytest.importorskip("pycocotools.coco")

CATEGORIES = [  # ids neither contiguous nor sorted, as in real COCO files
    {"id": 18, "name": "dog", "supercategory": "animal"},
    {"id": 1, "name": "person", "supercategory": "person"},
    {"id": 3, "name": "car", "supercategory": "vehicle"},
]


def make_instances(src: Path, path: Path, seed: int = 0) -> dict:
    """A small instances.json in COCO's layout over the photos under ``src``; the last image
    has no annotation, one annotation is a crowd with an RLE segmentation."""
    rng = np.random.default_rng(seed)
    files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
    images, anns = [], []
    for k, name in enumerate(files):
        from PIL import Image
        with Image.open(src / name) as im:
            w, h = im.size
        images.append({"id": 1000 + 7 * k, "file_name": name, "width": w, "height": h,
                       "license": 1, "coco_url": "", "date_captured": "2013-11-14 17:02:52"})
        if k == len(files) - 1:
            continue  # an image without annotations
        for _ in range(int(rng.integers(1, 6))):
            x, y = rng.uniform(0, w - 2), rng.uniform(0, h - 2)
            bw, bh = rng.uniform(0.5, w - x), rng.uniform(0.5, h - y)
            crowd = int(len(anns) % 5 == 3)
            seg = ({"counts": [0, 5, 10], "size": [h, w]} if crowd
                   else [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]])
            anns.append({"id": 1 + len(anns), "image_id": images[-1]["id"],
                         "category_id": CATEGORIES[int(rng.integers(0, 3))]["id"],
                         "bbox": [round(x, 2), round(y, 2), round(bw, 2), round(bh, 2)],
                         "area": round(bw * bh, 2), "iscrowd": crowd, "segmentation": seg})
    doc = {"info": {"description": "test", "version": "1.0", "year": 2026},
           "licenses": [{"id": 1, "name": "CC", "url": ""}],
           "images": images, "annotations": anns, "categories": CATEGORIES}
    path.write_text(json.dumps(doc))
    return doc


@pytest.fixture(scope="module")
def coco_src(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("coco")
    src = make_photos(root / "images", 9, size=(96, 72), classes=2, seed=3)
    make_instances(src, root / "instances.json")
    return src, root / "instances.json"


def check_against_pycocotools(out: Path, instances: Path) -> None:
    coco = pycocotools_coco.COCO(str(instances))
    ds = feedpipe.open_dataset(out)
    cat_ids = sorted(coco.getCatIds())
    names = [coco.loadCats(c)[0]["name"] for c in cat_ids]
    assert ds.schema["boxes"].classes == tuple(names) == ds.classes
    class_ids = ds.schema["boxes"].class_ids  # each label's COCO category_id
    assert class_ids == tuple(cat_ids)
    by_name = {ds[i]["path"]: ds[i] for i in range(len(ds))}
    assert len(by_name) == len(coco.getImgIds())  # images without annotations are kept
    total = 0
    for img in coco.loadImgs(coco.getImgIds()):
        s = by_name[img["file_name"]]
        anns = sorted(coco.loadAnns(coco.getAnnIds(imgIds=img["id"], iscrowd=None)),
                      key=lambda a: a["id"])
        xywh = np.array([a["bbox"] for a in anns], np.float64).reshape(-1, 4)
        want = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1).astype(np.float32)
        np.testing.assert_array_equal(s["boxes"]["boxes"], want)
        assert [names[k] for k in s["boxes"]["labels"]] == \
            [coco.loadCats(a["category_id"])[0]["name"] for a in anns]
        assert [class_ids[k] for k in s["boxes"]["labels"]] == [a["category_id"] for a in anns]
        assert s["boxes"]["iscrowd"].tolist() == [a["iscrowd"] for a in anns]
        assert s["meta"] == {"coco_id": img["id"]}
        total += len(anns)
    assert total == len(coco.getAnnIds()) and total > 0
    assert any(len(by_name[n]["boxes"]["boxes"]) == 0 for n in by_name)


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_coco_round_trip(coco_src: tuple[Path, Path], tmp_path: Path, fmt: str) -> None:
    src, instances = coco_src
    convert(src, tmp_path / "out", to=fmt, coco=instances, workers=0)
    check_against_pycocotools(tmp_path / "out", instances)


def test_coco_cli_and_loader(coco_src: tuple[Path, Path], tmp_path: Path) -> None:
    src, instances = coco_src
    out = tmp_path / "out"
    subprocess.run([*CLI, "convert", str(src), "--coco", str(instances), "--to", "lmdb", "-o",
                    str(out), "-q", "--workers", "0"], check=True)
    check_against_pycocotools(out, instances)
    loader = feedpipe.make_loader(out, 4, fields=["image", "boxes"], size=64, crop="resize",
                                  shuffle=False, num_workers=0, device="cpu")
    batch = next(iter(loader))
    assert batch["boxes"].shape[:2] == batch["boxes_labels"].shape
    assert batch["boxes_iscrowd"].shape == batch["boxes_labels"].shape
    assert (batch["boxes"] >= 0).all() and (batch["boxes"] <= 64).all()


def test_coco_unknown_category_is_refused(coco_src: tuple[Path, Path], tmp_path: Path) -> None:
    src, instances = coco_src
    doc = json.loads(instances.read_text())
    doc["annotations"][0]["category_id"] = 99
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(feedpipe.errors.BadInputError, match="category 99"):
        convert(src, tmp_path / "out", to="lmdb", coco=bad, workers=0)


def test_coco_results_map_back_for_cocoeval(coco_src: tuple[Path, Path], tmp_path: Path) -> None:
    """Detections made from the packed dataset (its boxes as perfect predictions)
    go back to COCO's own ids through ``meta['coco_id']`` and the boxes field's ``class_ids``,
    and pycocotools' COCOeval scores them AP 1.0."""
    from pycocotools.cocoeval import COCOeval

    src, instances = coco_src
    convert(src, tmp_path / "out", to="lmdb", coco=instances, workers=0)
    ds = feedpipe.open_dataset(tmp_path / "out")
    class_ids = ds.schema["boxes"].class_ids
    results = []
    for i in range(len(ds)):
        s = ds[i]
        for box, label, crowd in zip(s["boxes"]["boxes"], s["boxes"]["labels"],
                                     s["boxes"]["iscrowd"], strict=True):
            if not crowd:
                x1, y1, x2, y2 = map(float, box)
                results.append({"image_id": s["meta"]["coco_id"], "score": 1.0,
                                "category_id": class_ids[label], "bbox": [x1, y1, x2 - x1, y2 - y1]})
    gt = pycocotools_coco.COCO(str(instances))
    ev = COCOeval(gt, gt.loadRes(results), "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert ev.stats[0] > 0.99  # AP@[.5:.95]: every box found with its own category id


def test_coco_category_ids_must_be_integers(coco_src: tuple[Path, Path], tmp_path: Path) -> None:
    src, instances = coco_src
    doc = json.loads(instances.read_text())
    doc["categories"][0]["id"] = "dog"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(feedpipe.errors.BadInputError, match="category ids must be integers"):
        convert(src, tmp_path / "out", to="lmdb", coco=bad, workers=0)
