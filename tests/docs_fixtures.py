"""What the examples of README.md and docs/ assume exists, made small: hidden ``<!-- docs-test``
blocks call these (tests/docs_blocks.py). Everything is written into the current folder."""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from converters import convert
from converters.synth import make_photos
from servers import S3_ENV, MotoServer


def photos(path: str = "photos", n: int = 24, classes: int = 2, size: tuple[int, int] = (160, 120),
           seed: int = 0) -> Path:
    """An ImageFolder tree of ``n`` generated JPEG photos (``classes`` class folders)."""
    return make_photos(Path(path), n, size=size, classes=classes, seed=seed)


def packed(path: str = "packed", to: str = "lmdb", n: int = 24, **options: object) -> Path:
    """A dataset of ``n`` generated photos at ``path``, converted quietly."""
    src = photos(f".src-{Path(path).name}", n)
    convert(src, path, to=to, workers=0, **options)
    return Path(path)


def s3(*buckets: str) -> str:
    """An S3 API server (moto) on 127.0.0.1 with ``buckets`` made, as this process's and its
    children's default endpoint (AWS_ENDPOINT_URL), so ``s3://bucket/...`` examples run as
    written. Stopped at exit."""
    import boto3

    server = MotoServer()
    atexit.register(server.stop)
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=server.url)
    client = boto3.client("s3")
    for bucket in buckets:
        client.create_bucket(Bucket=bucket)
    return server.url
