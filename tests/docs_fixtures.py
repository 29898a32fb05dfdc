"""What the examples of README.md and docs/ assume exists, made small: hidden ``<!-- docs-test``
blocks call these (tests/docs_blocks.py). Everything is written into the current folder."""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import Any

from servers import (
    GCSFS_EXTENDED,
    S3_ENV,
    GcsServer,
    MotoServer,
    gcs_options,
    s3_options,
    upload_tree,
)

from converters import convert
from converters.synth import make_photos


def photos(path: str = "photos", n: int = 24, classes: int = 2, size: tuple[int, int] = (160, 120),
           seed: int = 0) -> Path:
    """An ImageFolder tree of ``n`` generated JPEG photos (``classes`` class folders)."""
    return make_photos(Path(path), n, size=size, classes=classes, seed=seed)


def packed(path: str = "packed", to: str = "lmdb", n: int = 24, **options: object) -> Path:
    """A dataset of ``n`` generated photos at ``path``, converted quietly."""
    src = photos(f".src-{Path(path).name}", n)
    convert(src, path, to=to, workers=0, **options)
    return Path(path)


def s3(*buckets: str, port: int | None = None) -> str:
    """An S3 API server (moto) on 127.0.0.1 (on ``port``, else a free one) with ``buckets``
    made, as this process's and its children's default endpoint (AWS_ENDPOINT_URL), so
    ``s3://bucket/...`` examples run as written. Stopped at exit."""
    import boto3

    server = MotoServer(port)
    atexit.register(server.stop)
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=server.url)
    client = boto3.client("s3")
    for bucket in buckets:
        client.create_bucket(Bucket=bucket)
    return server.url


def gcs(*buckets: str, port: int | None = None) -> str:
    """A GCS emulator on 127.0.0.1 (on ``port``, else a free one) with ``buckets`` made;
    gcsfs's gRPC layout lookups off for it (docs/remote.md) in this process and its children.
    Stopped at exit."""
    os.environ[GCSFS_EXTENDED] = "false"
    import fsspec

    server = GcsServer(port)
    atexit.register(server.stop)
    fs = fsspec.filesystem("gs", **gcs_options(server.url))
    for bucket in buckets:
        fs.mkdir(bucket)
    return server.url


def upload(local: Path, url: str) -> str:
    """The folder ``local`` copied to ``url`` on the S3 server of :func:`s3`."""
    upload_tree(local, url, s3_options(os.environ["AWS_ENDPOINT_URL"]))
    return url


def remove(url: str) -> None:
    """Every object under ``url`` on the S3 server of :func:`s3` removed (an example that writes
    where the one before it wrote, as its alternative)."""
    import fsspec

    fsspec.filesystem("s3", **s3_options(os.environ["AWS_ENDPOINT_URL"])).rm(url, recursive=True)


def wds_shards(path: str = "shards", n: int = 100, nested: bool = True) -> Path:
    """WebDataset shards as another tool writes them (``webdataset.TarWriter``): ``n`` shards
    ``train-000.tar ...`` of one sample each (jpg/png, cls, txt, json, npy); ``nested`` adds
    ``laion/`` and ``cc3m/`` folders of one shard each and a gzipped ``part-000.tgz``."""
    import webdataset as wds
    from test_foreign_wds import _samples

    root = Path(path)
    root.mkdir()
    for i, sample in enumerate(_samples(n)):
        with wds.TarWriter(str(root / f"train-{i:03d}.tar")) as w:
            w.write(sample)
    if nested:
        for k, name in enumerate(("laion", "cc3m")):
            (root / name).mkdir()
            with wds.TarWriter(str(root / name / "shard-000.tar")) as w:
                for sample in _samples(2, start=n + 2 * k):
                    w.write(sample)
        with wds.TarWriter(str(root / "part-000.tgz"), compress=True) as w:
            for sample in _samples(2, start=n + 4):
                w.write(sample)
    return root


def captcha(path: str = "captcha") -> Path:
    """A captcha shard (``key.png`` + ``key.txt``, ragged non-ASCII codes), indexed in place."""
    from test_foreign_wds import _captcha_shard

    from converters.wds_index import index_shards

    _captcha_shard(Path(path))
    index_shards(Path(path))
    return Path(path)


def hf_saved(path: str = "saved", splits: tuple[str, ...] = ("train", "validation")) -> Path:
    """A Hugging Face ``DatasetDict`` made locally (no network) and written with
    ``save_to_disk``: an Image, a ClassLabel, a string, a float and a float sequence column."""
    import datasets
    from test_hf_source import _encoded

    datasets.disable_progress_bars()
    n = 6
    features = datasets.Features({
        "image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog", "owl"]),
        "caption": datasets.Value("string"), "embedding": datasets.Sequence(datasets.Value(
            "float32"))})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": _encoded(i, "PNG" if i % 2 else "JPEG"), "path": None}
                   for i in range(n)],
         "label": [i % 3 for i in range(n)], "caption": [f"photo {i}" for i in range(n)],
         "embedding": [[float(i), -float(i)] for i in range(n)]}, features=features)
    datasets.DatasetDict({s: ds for s in splits}).save_to_disk(path)
    return Path(path)


def colour_masks(images: str = "images", masks: str = "masks",
                 palette: str = "palette.json") -> Path:
    """Photos with RGB colour masks (four colours, black is class 0) and the palette file."""
    import numpy as np
    from PIL import Image
    from test_colour_masks import COLOURS

    Path(images).mkdir()
    Path(masks).mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(
            f"{images}/im{i}.png")
        Image.fromarray(COLOURS[rng.integers(0, 4, (12, 16))]).save(f"{masks}/im{i}.png")
    Path(palette).write_text(json.dumps({"#%02x%02x%02x" % tuple(c): k
                                         for k, c in enumerate(COLOURS.tolist())}))
    return Path(images)


def split_root(path: str = "data", n: int = 8) -> Path:
    """``data/train/{cat,dog}/*.jpg`` and ``data/val/{cat,dog}/*.jpg``."""
    for seed, split in enumerate(("train", "val")):
        tree = make_photos(Path(path, split), n, size=(48, 36), classes=2, seed=seed)
        for folder, name in zip(sorted(p for p in tree.iterdir()), ("cat", "dog"), strict=True):
            folder.rename(tree / name)
    return Path(path)


def coco(path: str = "coco", n: int = 6) -> Path:
    """COCO's layout: ``val2017/`` photos and ``annotations/instances_val2017.json``."""
    from test_coco import make_instances

    images = make_photos(Path(path, "val2017"), n, size=(64, 48), classes=1)
    flat = Path(path, "val2017")
    for photo in list(images.rglob("*.jpg")):
        photo.rename(flat / photo.name)
    for folder in [p for p in flat.iterdir() if p.is_dir()]:
        folder.rmdir()
    Path(path, "annotations").mkdir()
    make_instances(flat, Path(path, "annotations", "instances_val2017.json"))
    return Path(path)


def label_manifest(path: str = "data.csv", n: int = 8, text: str = "code") -> Path:
    """A CSV manifest of photos with typed label columns: keypoints (``landmarks``, K=3), boxes
    (``boxes``), text (``text``, from ``0-9a-k``) and arrays (``window``, a ``.npy`` per row)."""
    import csv

    import numpy as np

    folder = Path(path).parent
    photos_ = sorted(photos(str(folder / "photos"), n, size=(64, 48)).rglob("*.jpg"))
    rng = np.random.default_rng(0)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["path", "landmarks", "boxes", text, "window"])
        for i, photo in enumerate(photos_):
            np.save(folder / f"w{i}.npy", rng.random((int(rng.integers(2, 6)), 3),
                                                     dtype=np.float32))
            points = [[10 + i, 12], [40, 12 + i], [25, 30]]
            boxes = [[1, 2, 30, 40, i % 2]] * (1 + i % 3)
            code = "".join(rng.choice(list("0123456789abcdefghijk"), int(rng.integers(2, 6))))
            out.writerow([photo.relative_to(folder).as_posix(), json.dumps(points),
                          json.dumps(boxes), code, f"w{i}.npy"])
    return Path(path)


def lightning_model() -> tuple[Any, Any]:
    """A tiny LightningModule over feedpipe batches and a one-epoch CPU Trainer: (model, trainer)."""
    import lightning
    import torch

    class Model(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x.float().mean((2, 3)))

        def training_step(self, batch: dict, _: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self(batch["image"]), batch["label"])

        def validation_step(self, batch: dict, _: int) -> None:
            self.log("val_loss", torch.nn.functional.cross_entropy(
                self(batch["image"]), batch["label"]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)
    return Model(), trainer


def faces(path: str = "faces", n: int = 24) -> Path:
    """Raw 64×80 photos with a segmentation ``mask``, three ``landmarks`` and ``boxes``."""
    import numpy as np
    from seg_helpers import PALETTE
    from test_writers import write_dataset

    from feedpipe.schema import BoxesField, ImageField, KeypointsField, Schema
    from feedpipe.schema.masks import MaskField

    rng = np.random.default_rng(3)
    schema = Schema((ImageField("image", "raw", (64, 80, 3)),
                     MaskField("mask", codec="raw", shape=(64, 80), num_classes=5),
                     KeypointsField("landmarks", shape=(3, 2)), BoxesField("boxes")))
    samples = []
    for _ in range(n):
        mask = np.kron(rng.integers(1, 5, (8, 10)), np.ones((8, 8), np.int64)).astype(np.uint8)
        xy = rng.uniform(0, 60, (4, 2))
        samples.append({"image": PALETTE[mask], "mask": mask,
                        "landmarks": rng.uniform(0, 64, (3, 2)).astype(np.float32),
                        "boxes": {"boxes": np.concatenate([xy, xy + 12], 1), "labels": [1] * 4}})
    return Path(write_dataset("lmdb", Path(path), samples, schema))
