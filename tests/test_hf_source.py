"""Hugging Face `datasets` as a conversion source: a small dataset built locally (never the
network), saved with save_to_disk, round-trips every sample: the original image bytes, the
ClassLabel (with its names) and the other columns."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI
from PIL import Image

import feedpipe

datasets = pytest.importorskip("datasets")


def _encoded(i: int, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(i).integers(0, 255, (20, 28, 3), dtype=np.uint8)
                    ).save(out, fmt)
    return out.getvalue()


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict]:
    n = 9
    data = {"image": [{"bytes": _encoded(i, "PNG" if i % 2 else "JPEG"), "path": None}
                      for i in range(n)],
            "label": [i % 3 for i in range(n)],
            "caption": [f"photo {i}" for i in range(n)],
            "score": [i / 4 for i in range(n)],
            "embedding": [[float(i), -float(i)] for i in range(n)]}
    features = datasets.Features({
        "image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog", "owl"]),
        "caption": datasets.Value("string"), "score": datasets.Value("float64"),
        "embedding": datasets.Sequence(datasets.Value("float32"))})
    ds = datasets.Dataset.from_dict(data, features=features)
    path = tmp_path / "hf"
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(path))
    return path, data


@pytest.mark.parametrize("to", ["lmdb", "wds"])
def test_hf_round_trip(saved, tmp_path: Path, to: str) -> None:
    path, data = saved
    out = tmp_path / "out"
    r = subprocess.run([*CLI, "convert", str(path), "--split", "train", "--to", to, "-o",
                        str(out), "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ds = feedpipe.open_dataset(out)
    assert len(ds) == 9 and ds.classes == ("cat", "dog", "owl")
    for i in range(9):
        raw = ds.read_raw(i)
        assert bytes(raw["image"]) == data["image"][i]["bytes"]  # lossless: original bytes
        assert raw["label"] == data["label"][i]
        assert raw["caption"] == data["caption"][i]
        assert raw["score"] == data["score"][i]
        np.testing.assert_array_equal(raw["embedding"], np.float32(data["embedding"][i]))
        assert raw["path"] == f"train[{i}]"
    assert ds.manifest.conversion["hf_split"] == "train"


def test_hf_split_and_images_from_paths(saved, tmp_path: Path) -> None:
    from converters import convert
    from converters.hf import source
    from feedpipe.errors import ConfigError

    path, data = saved
    assert convert(source(str(path), "test"), tmp_path / "t", to="hdf5").written == 3
    with pytest.raises(ConfigError, match="splits"):
        source(str(path), "validation")
    files = []
    for i in range(3):
        f = tmp_path / f"img{i}.png"
        f.write_bytes(_encoded(i, "PNG"))
        files.append(str(f))
    ds = datasets.Dataset.from_dict({"img": files}).cast_column("img", datasets.Image())
    ds.save_to_disk(str(tmp_path / "flat"))
    res = convert(source(str(tmp_path / "flat")), tmp_path / "o", to="lmdb")
    got = feedpipe.open_dataset(tmp_path / "o")
    assert res.written == 3 and bytes(got.read_raw(2)["image"]) == Path(files[2]).read_bytes()
    assert "label" not in got.schema
