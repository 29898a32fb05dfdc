"""Shared fixtures: small real-looking photo sets and their conversions to every format.

Everything is session-scoped and generated once into pytest's temporary directory: a photo tree of
~72 JPEGs of about 160×120 (random crops of scikit-image's sample photographs, see
``converters.synth``), and that tree packed as LMDB, HDF5 and WebDataset (several shards, so random
access crosses shard boundaries). Tests must treat these as read-only; tests that damage or modify a
dataset copy it first (``copy_dataset``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from converters import convert
from converters.synth import make_photos

FORMATS = ("lmdb", "hdf5", "wds")
N_PHOTOS = 72            # >= 64 so that converter process pools are really used
PHOTO_SIZE = (160, 120)  # W×H (each photo varies by ±8%)
N_CLASSES = 4
WDS_SHARD_COUNT = 20     # the test run's wds dataset has 4 shards
N_ODD = 103              # a prime: no world or batch size divides it (the ``odd`` datasets)


@dataclass(frozen=True)
class Photo:
    """One source photo as the converter should see it (independently derived, not via scan())."""

    path: Path
    rel: str
    label: int


def list_photos(root: Path) -> list[Photo]:
    """ImageFolder order: sorted class folders → labels, files sorted by relative path."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    out = []
    for label, cls in enumerate(classes):
        for p in sorted((root / cls).rglob("*"), key=lambda q: q.as_posix()):
            if p.is_file():
                out.append(Photo(p, p.relative_to(root).as_posix(), label))
    return out


@pytest.fixture(scope="session")
def photo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder tree ``<class>/<nnnnnn>.jpg`` of N_PHOTOS real-looking JPEG photos."""
    return make_photos(tmp_path_factory.mktemp("photos") / "src", N_PHOTOS, size=PHOTO_SIZE,
                       classes=N_CLASSES, seed=0)


@pytest.fixture(scope="session")
def photos(photo_dir: Path) -> list[Photo]:
    """The photos of ``photo_dir`` in the order the converter must write them."""
    items = list_photos(photo_dir)
    assert len(items) == N_PHOTOS
    return items


@pytest.fixture(scope="session")
def photo_classes(photo_dir: Path) -> tuple[str, ...]:
    return tuple(sorted(d.name for d in photo_dir.iterdir() if d.is_dir()))


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory, photo_dir: Path) -> dict[str, Path]:
    """``photo_dir`` converted (passthrough, in-process) to each format: {format: path}."""
    root = tmp_path_factory.mktemp("packed")
    out = {}
    for fmt in FORMATS:
        opts = {"shard_count": WDS_SHARD_COUNT} if fmt == "wds" else None
        res = convert(photo_dir, root / fmt, to=fmt, workers=0, writer_options=opts)
        assert res.written == N_PHOTOS and not res.skipped
        out[fmt] = root / fmt
    return out


@pytest.fixture(params=FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    """Each storage format in turn."""
    return request.param


@pytest.fixture
def dataset_path(packed: dict[str, Path], fmt: str) -> Path:
    """The test run's packed photo dataset in the current format (read-only)."""
    return packed[fmt]


@pytest.fixture
def copy_dataset(tmp_path: Path):
    """Copy a dataset directory into this test's tmp_path (for tests that damage it)."""

    def copy(src: Path, name: str | None = None) -> Path:
        dst = tmp_path / (name or src.name)
        shutil.copytree(src, dst)
        return dst

    return copy


# real S3 (moto) and HTTP servers on 127.0.0.1 for the remote-storage tests (tests/servers.py)
from servers import (  # noqa: E402,F401
    gcs,
    gcs_packed,
    gs,
    hf_hub,
    http_packed,
    moto,
    moto_s3,
    s3,
    s3_packed,
)


@pytest.fixture(scope="session")
def odd(tmp_path_factory) -> dict[str, object]:
    """103 tiny photos packed as LMDB and as WebDataset (6 shards): {format: path}."""
    root = tmp_path_factory.mktemp("odd")
    src = make_photos(root / "src", N_ODD, size=(40, 30), classes=3, seed=4)
    out = {}
    for fmt in ("lmdb", "wds"):
        opts = {"shard_count": 18} if fmt == "wds" else None
        assert convert(src, root / fmt, to=fmt, workers=0, writer_options=opts).written == N_ODD
        out[fmt] = root / fmt
    out["src"] = src
    return out
