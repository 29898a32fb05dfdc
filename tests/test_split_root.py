"""A split root (data/train, data/val: ImageFolder trees) becomes one dataset per split or one
with a `split` field; the class lists must agree unless their union is asked for; plain
`--layout auto` no longer reads train/val as two classes without a word."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI
from PIL import Image

import feedpipe
from converters import convert
from feedpipe.errors import ConfigError


def _tree(root: Path, spec: dict[str, dict[str, int]]) -> None:
    k = 0
    for split, classes in spec.items():
        for cls, n in classes.items():
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                k += 1
                Image.fromarray(np.full((8, 8, 3), k, np.uint8)).save(root / split / cls /
                                                                       f"{i}.png")


def test_separate_and_field(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _tree(data, {"train": {"cat": 3, "dog": 2}, "val": {"cat": 1, "dog": 2}})
    with pytest.raises(ConfigError, match="split_root"):
        convert(data, tmp_path / "x", to="lmdb")
    r = subprocess.run([*CLI, "convert", str(data), "--to", "lmdb", "-o", str(tmp_path / "s"),
                        "--split-root", "separate", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    train, val = (feedpipe.open_dataset(tmp_path / "s" / n) for n in ("train", "val"))
    assert (len(train), len(val)) == (5, 3) and train.classes == val.classes == ("cat", "dog")
    assert [val[i]["label"] for i in range(3)] == [0, 1, 1]
    assert val[0]["path"] == "val/cat/0.png"
    convert(data, tmp_path / "f", to="hdf5", split_root="field")
    one = feedpipe.open_dataset(tmp_path / "f")
    assert [one[i]["split"] for i in range(len(one))].count("val") == 3 and len(one) == 8
    convert(data, tmp_path / "s", to="wds", split_root="separate", overwrite=True)
    assert len(feedpipe.open_dataset(tmp_path / "s" / "val")) == 3


def test_class_lists_must_agree(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _tree(data, {"train": {"cat": 1, "dog": 1, "owl": 1}, "val": {"cat": 1, "emu": 1}})
    with pytest.raises(ConfigError, match="train lacks emu; val lacks dog, owl"):
        convert(data, tmp_path / "o", to="lmdb", split_root="separate")
    convert(data, tmp_path / "o", to="lmdb", split_root="separate", split_classes="union")
    val = feedpipe.open_dataset(tmp_path / "o" / "val")
    assert val.classes == ("cat", "dog", "emu", "owl")
    assert sorted(val[i]["label"] for i in range(2)) == [0, 2]


def test_sources_and_split_root_form_no_import_cycle():
    """split_root builds on sources, and sources finds split folders itself: no import of
    split_root from sources, not even one inside a function (it used to hide the cycle there)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("converters")
    assert graph.find_modules_directly_imported_by("converters.split_root") >= {
        "converters.sources"}
    assert not graph.chain_exists(importer="converters.sources",
                                  imported="converters.split_root")
