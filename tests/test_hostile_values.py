"""Hostile values that used to surface as numpy's or Python's own exceptions:
a foreign ``.npy`` member declaring 10⁷ × 10⁷ elements (``_ArrayMemoryError`` in ``convert``
and ``index``), and manifest fields of the wrong type or range (``num_samples: -5`` or ``2**63``,
``max_pixels: "big"``: ``ValueError``/``OverflowError`` in ``verify`` and ``make_loader``). Each is
now a typed error, or a sample skipped by name, and the CLI prints one line."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import jpeg_bytes, run_cli

import feedpipe
from feedpipe.errors import DamagedDataError

HUGE = (10**7, 10**7)  # 10^14 float32: 400 TB


def _npy(arr: np.ndarray | None = None, shape: tuple[int, ...] | None = None) -> bytes:
    """An .npy file; with ``shape``, a header declaring it over 12 bytes of payload."""
    buf = io.BytesIO()
    if shape is None:
        np.save(buf, arr, allow_pickle=False)
    else:
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                                   "shape": shape})
        buf.write(bytes(12))
    return buf.getvalue()


@pytest.fixture
def npy_shards(tmp_path: Path) -> Path:
    """Three samples (jpg, cls, npy) in one plain tar; s1's .npy declares HUGE."""
    root = tmp_path / "shards"
    root.mkdir()
    with tarfile.open(root / "a.tar", "w") as t:
        for i in range(3):
            vec = np.arange(3, dtype=np.float32) + i
            for name, data in ((f"s{i}.jpg", jpeg_bytes(np.full((8, 8, 3), 30 * i, np.uint8))),
                               (f"s{i}.cls", str(i).encode()),
                               (f"s{i}.npy", _npy(shape=HUGE) if i == 1 else _npy(vec))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return root


def test_npy_member_declaring_a_huge_shape_skips_its_sample_in_convert(npy_shards, tmp_path):
    r = run_cli("convert", npy_shards, "--to", "lmdb", "-o", tmp_path / "out", "-q")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "skipped a.tar/s1" in ln)
    assert "npy payload has 12 bytes, header says 400000000000000" in line, line
    ds = feedpipe.open_dataset(tmp_path / "out")
    assert [s["path"] for s in ds] == ["a.tar/s0", "a.tar/s2"]
    np.testing.assert_array_equal(ds[1]["npy"], np.arange(3, dtype=np.float32) + 2)


def test_npy_member_declaring_a_huge_shape_is_left_out_of_an_index(npy_shards):
    r = run_cli("index", npy_shards)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "left out of the index a.tar/s1: unreadable member" in r.stdout, r.stdout
    ds = feedpipe.open_dataset(npy_shards)
    assert len(ds) == 2 and [int(s["label"]) for s in ds] == [0, 2]
    assert ds.manifest.skipped[0]["path"] == "a.tar/s1"


BAD_FIELDS = [
    ("num_samples", -5, "num_samples is -5"),
    ("num_samples", 2**63, f"num_samples is {2**63}"),
    ("num_samples", "72", "num_samples is '72'"),
    ("num_samples", True, "num_samples is True"),
    ("conversion.max_pixels", "big", "conversion.max_pixels is 'big'"),
    ("conversion.max_pixels", -1, "conversion.max_pixels is -1"),
    ("classes", "abc", "classes is str"),
    ("classes", [1, 2], "classes[0] is int"),
    ("files.0.size", -1, "files[0].size is -1"),
    ("files.0.size", 1.5, "files[0].size is 1.5"),
    ("files.0.sha256", 7, "files[0].sha256 is int 7, not a str"),
    ("files", [3], "files[0] is int"),
    ("skipped", {"a": 1}, "skipped is dict"),
    ("conversion", [], "conversion is list"),
    ("extra", "x", "extra is str"),
]


def _edit(manifest: dict, where: str, value: object) -> None:
    *path, last = where.split(".")
    node = manifest
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value


@pytest.mark.parametrize("where, value, said", BAD_FIELDS)
def test_manifest_field_of_wrong_type_or_range_is_named(packed, tmp_path, where, value, said):
    root = Path(shutil.copytree(packed["lmdb"], tmp_path / "ds"))
    path = root / "feedpipe.json"
    d = json.loads(path.read_text())
    _edit(d, where, value)
    path.write_text(json.dumps(d))
    with pytest.raises(DamagedDataError, match=f"{path}: {said}".replace("[", r"\[")
                       .replace("]", r"\]").replace("(", r"\(")):
        feedpipe.open_dataset(root)
    with pytest.raises(DamagedDataError, match="feedpipe.json"):
        feedpipe.make_loader(root, 4, size=32)
    r = run_cli("verify", root)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and said in r.stderr and str(path) in r.stderr


def test_merged_part_counts_are_checked(packed, tmp_path):
    root = Path(shutil.copytree(packed["lmdb"], tmp_path / "ds"))
    path = root / "feedpipe.json"
    d = json.loads(path.read_text())
    d["extra"]["parts"] = [{"dir": ".", "num_samples": "lots"}]
    path.write_text(json.dumps(d))
    with pytest.raises(DamagedDataError, match=r"extra\.parts\[0\]\.num_samples is 'lots'"):
        feedpipe.open_dataset(root)
