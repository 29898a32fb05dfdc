"""Foreign WebDataset shards (written by the webdataset library's own TarWriter/ShardWriter, and
a .tgz): every sample round-trips through `feedpipe convert` and through `feedpipe index` +
make_loader, bytes and labels; odd, missing and unpickle-requiring members are named."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from fp_helpers import CLI
from PIL import Image

import feedpipe
from converters import convert
from converters.foreign_wds import find_shards
from converters.foreign_wds import source as shard_source
from converters.wds_index import index_shards
from feedpipe.errors import BadInputError, UnsafeDataError
from feedpipe.schema.geometric import TextField

wds = pytest.importorskip("webdataset")


def _image(i: int, fmt: str) -> bytes:
    rng = np.random.default_rng(i)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(out, fmt)
    return out.getvalue()


def _samples(n: int, start: int = 0) -> list[dict]:
    return [{"__key__": f"sample{i:04d}", "jpg" if i % 3 else "png": _image(i, "JPEG" if i % 3
             else "PNG"), "cls": i % 4, "txt": f"caption {i} é", "json": {"i": i},
             "npy": np.arange(3, dtype=np.float32) + i} for i in range(start, start + n)]


@pytest.fixture
def shards(tmp_path: Path) -> tuple[Path, list[dict]]:
    root = tmp_path / "shards"
    root.mkdir()
    samples = _samples(7)
    with wds.TarWriter(str(root / "train-000.tar")) as w:
        for s in samples[:4]:
            w.write(s)
    with wds.ShardWriter(str(root / "train-%03d.tar"), maxcount=2, start_shard=1) as w:
        for s in samples[4:]:
            w.write(s)
    return root, samples


def _check(ds: feedpipe.DatasetReader, samples: list[dict], keyed: bool = True) -> None:
    assert len(ds) == len(samples)
    for i, want in enumerate(samples):
        raw = ds.read_raw(i)
        img = want.get("jpg", want.get("png"))
        assert bytes(raw["image"]) == img  # lossless: the original bytes
        assert raw["label"] == want["cls"]
        assert raw["json"] == want["json"]
        np.testing.assert_array_equal(raw["npy"], want["npy"])
        assert bytes(raw["txt"]) == want["txt"].encode()


@pytest.mark.parametrize("to", ["lmdb", "hdf5", "wds"])
def test_convert_foreign_shards_every_sample(shards, tmp_path: Path, to: str) -> None:
    root, samples = shards
    out = tmp_path / f"out-{to}"
    r = subprocess.run([*CLI, "convert", str(root), "--to", to, "-o", str(out), "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ds = feedpipe.open_dataset(out)
    _check(ds, samples)
    assert ds[6]["path"] == "train-002.tar/sample0006"


def test_brace_pattern_and_tgz(shards, tmp_path: Path) -> None:
    root, samples = shards
    found, _ = find_shards([str(root / "train-{000..001}.tar")])  # zero padding kept
    assert [p.name for p in found] == ["train-000.tar", "train-001.tar"]
    tgz = tmp_path / "gz" / "part-000.tgz"
    tgz.parent.mkdir()
    with tarfile.open(root / "train-000.tar") as src, tarfile.open(tgz, "w:gz") as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m))
    res = convert(shard_source([str(root / "train-{000..001}.tar")]), tmp_path / "b",
                       to="lmdb")
    assert res.written == 6 and not res.skipped
    res = convert(shard_source([tgz]), tmp_path / "c", to="hdf5")
    _check(feedpipe.open_dataset(tmp_path / "c"), samples[:4])
    with pytest.raises(BadInputError, match="no such shard"):
        shard_source([str(root / "train-{000..009}.tar")])
    # a .tgz cannot be read in place: refused with the command that packs it
    with pytest.raises(BadInputError, match="feedpipe convert"):
        index_shards(tgz.parent)
    with pytest.raises(BadInputError, match="gzip.*feedpipe convert"):
        feedpipe.make_loader(tgz, batch_size=2)
    with pytest.raises(BadInputError, match="tar file.*feedpipe index"):
        feedpipe.open_dataset(root / "train-000.tar")


def test_index_in_place_and_make_loader(shards, tmp_path: Path) -> None:
    root, samples = shards
    before = {p.name: p.read_bytes() for p in root.glob("*.tar")}
    r = subprocess.run([*CLI, "index", str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {p.name: p.read_bytes() for p in root.glob("*.tar")} == before  # never rewritten
    ds = feedpipe.open_dataset(root)
    _check(ds, samples)
    assert ds.key_of(6) == "sample0006"
    v = subprocess.run([*CLI, "verify", str(root)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    loader = feedpipe.make_loader(root, batch_size=7, size=16, shuffle=False, num_workers=0)
    batch = next(iter(loader))
    assert batch["label"].tolist() == [s["cls"] for s in samples]
    # --overwrite of a convert never deletes shards feedpipe did not write
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.tar").write_bytes(before["train-000.tar"])
    with pytest.raises(BadInputError, match="did not make"):
        convert(shard_source([other]), root, to="lmdb", overwrite=True)


def test_odd_missing_and_unsafe_members_named(tmp_path: Path) -> None:
    root = tmp_path / "odd"
    root.mkdir()
    samples = _samples(4)
    del samples[2]["cls"]
    samples[1]["extra.bin"] = b"x"
    with wds.TarWriter(str(root / "s-000.tar")) as w:
        for s in samples:
            w.write(s)
    res = index_shards(root)
    assert res.indexed == 3
    assert res.skipped == [{"path": "s-000.tar/sample0002", "reason": "no .cls member"}]
    assert any(t["path"] == "*.extra.bin" for t in res.not_taken)
    assert subprocess.run([*CLI, "verify", str(root)]).returncode == 0
    res = convert(shard_source([root]), tmp_path / "o", to="lmdb")
    assert res.written == 3 and res.skipped[0]["path"] == "s-000.tar/sample0002"
    with wds.TarWriter(str(root / "s-001.tar")) as w:
        w.write({"__key__": "bad", "jpg": _image(9, "JPEG"), "cls": 1, "pyd": b"not opened"})
    with pytest.raises(UnsafeDataError, match="bad.pyd"):
        index_shards(root, overwrite=True)
    src = shard_source([root])
    assert any(t["path"].endswith("bad.pyd") and "unpickling" in t["reason"]
               for t in src.not_taken)


CAPTCHAS = ["7kq2", "Ab9", "xYz12", "ñ4é"]  # ragged lengths, non-ASCII code points


def _captcha_shard(root: Path, bad: bool = False) -> None:
    root.mkdir()
    with wds.TarWriter(str(root / "captcha-000.tar")) as w:
        for i, code in enumerate(CAPTCHAS):
            w.write({"__key__": f"c{i}", "png": _image(i, "PNG"), "txt": code})
        if bad:  # Latin-1, not UTF-8: named by shard and key, never decoded as something else
            w.write({"__key__": "latin1", "png": _image(9, "PNG"), "txt": "é".encode("latin-1")})


def _check_ctc(root: Path) -> None:
    assert isinstance(feedpipe.open_dataset(root).schema["txt"], TextField)
    loader = feedpipe.make_loader(root, batch_size=4, size=16, shuffle=False, num_workers=0,
                                  fields=["image", "txt"])
    batch = next(iter(loader))
    assert batch["txt"].dtype == torch.int64
    assert batch["txt_lengths"].tolist() == [len(c) for c in CAPTCHAS]
    want = torch.zeros(4, max(map(len, CAPTCHAS)), dtype=torch.int64)  # 0 pads (the CTC blank)
    for i, code in enumerate(CAPTCHAS):
        want[i, :len(code)] = torch.tensor([ord(c) for c in code])
    assert torch.equal(batch["txt"].cpu(), want)


@pytest.mark.parametrize("how", ["index", "lmdb", "hdf5", "wds"])
def test_captcha_txt_is_text_for_ctc(tmp_path: Path, how: str) -> None:
    root = tmp_path / "captcha"
    _captcha_shard(root)
    if how == "index":
        before = (root / "captcha-000.tar").read_bytes()
        assert index_shards(root).indexed == 4
        assert (root / "captcha-000.tar").read_bytes() == before
        _check_ctc(root)
    else:
        convert(shard_source([root]), tmp_path / "out", to=how)
        _check_ctc(tmp_path / "out")


def test_txt_not_utf8_is_named(tmp_path: Path) -> None:
    root = tmp_path / "captcha"
    _captcha_shard(root, bad=True)
    res = index_shards(root)
    assert res.indexed == 4
    assert [s["path"] for s in res.skipped] == ["captcha-000.tar/latin1"]
    assert ".txt: text is not UTF-8" in res.skipped[0]["reason"]
    out = convert(shard_source([root]), tmp_path / "out", to="lmdb")
    assert out.written == 4
    assert [s["path"] for s in out.skipped] == ["captcha-000.tar/latin1"]
    assert "not UTF-8" in out.skipped[0]["reason"]
