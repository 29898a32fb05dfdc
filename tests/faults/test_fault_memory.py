"""Small hostile inputs that declare huge sizes: a few-MB ``.tgz`` holding a
1 GiB member of zeros, a plain ``.tar`` declaring one (sparse on disk), and a PNG mask of a few
MB declaring 30000×30000 pixels, at conversion and in the loader. Each is refused by name from
its header, and the peak RSS of the process that meets it stays far below what reading it would
take (the .tgz used to peak at 2× the member, the mask at 5.3 GB)."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI, jpeg_bytes

from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.dataset.registry import WRITERS
from feedpipe.schema.fields import ImageField, JsonField
from feedpipe.schema.masks import MaskField
from feedpipe.schema.model import Schema

pytestmark = pytest.mark.heavy

BIG_MEMBER = 1 << 30  # 4x the default --max-member-size
MASK_SIDE = 30_000    # 900 MP: over the default max_pixels (268 MP), 1.7 GB to decode as L twice
PEAK_LIMIT_MB = 500

# Runs ARGV as a child and reports the peak RSS of it and its descendants (RUSAGE_CHILDREN):
# a fresh process, so no earlier test's child counts.
_PEAK = """
import json, resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr, "peak_mb": peak}))
"""


def peak_run(*argv: str | Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PEAK, *map(str, argv)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, read in chunks (tarfile copies a member's data from a file object)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


def _image(i: int) -> bytes:
    return jpeg_bytes(np.full((16, 16, 3), 40 * i, np.uint8))


def _bomb_tgz(path: Path) -> None:
    """Two good samples, then key 'big' whose .bin member is BIG_MEMBER zero bytes, gzipped."""
    with tarfile.open(path, "w:gz", compresslevel=1) as t:
        for i in range(2):
            for name, data in ((f"s{i}.jpg", _image(i)), (f"s{i}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("big.bin")
        info.size = BIG_MEMBER
        t.addfile(info, io.BufferedReader(_Zeros(BIG_MEMBER), 1 << 20))


def test_tgz_with_a_huge_member_is_refused_from_its_header(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    _bomb_tgz(src / "bomb.tgz")
    assert (src / "bomb.tgz").stat().st_size < 8 << 20
    r = peak_run(*CLI, "convert", src, "--to", "lmdb", "-o", tmp_path / "out", "-q")
    assert r["peak_mb"] < PEAK_LIMIT_MB, r["peak_mb"]
    assert r["rc"] == 2, r
    lines = r["err"].strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r["err"], r["err"]
    assert "bomb.tgz" in lines[0] and "member big.bin" in lines[0] and "1,073,741,824" in lines[0]
    assert "--max-member-size" in lines[0]
    assert not (tmp_path / "out").exists()
    # the limit is the user's: under it, nothing but the zeros' own size is refused
    small = tmp_path / "small"
    small.mkdir()
    for i in range(2):
        with tarfile.open(small / f"s{i}.tar", "w") as t:
            info = tarfile.TarInfo(f"s{i}.jpg")
            data = _image(i)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    r = peak_run(*CLI, "convert", small, "--to", "lmdb", "-o", tmp_path / "o2", "-q",
                 "--max-member-size", "100")
    assert r["rc"] == 2 and "over the limit of 100 " in r["err"], r


def test_plain_tar_with_a_huge_member_index_refuses_it(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    shard = src / "bomb.tar"
    with tarfile.open(shard, "w") as t:  # header only; the member's zeros become a sparse hole
        for i in range(2):
            info = tarfile.TarInfo(f"s{i}.jpg")
            data = _image(i)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("big.bin")
        info.size = BIG_MEMBER
        t.addfile(info)
        head = t.offset
    with open(shard, "r+b") as fh:
        fh.truncate(head + BIG_MEMBER + 1024 * 10)  # data, then the end-of-archive zero blocks
    r = peak_run(*CLI, "index", src)
    assert r["peak_mb"] < PEAK_LIMIT_MB, r["peak_mb"]
    assert r["rc"] == 2, r
    assert "bomb.tar" in r["err"] and "member big.bin" in r["err"] and "Traceback" not in r["err"]
    assert not (src / "feedpipe.json").exists()


def bomb_mask_png(side: int = MASK_SIDE, channels: int = 1) -> bytes:
    """A grey (mode L) or RGB PNG of zeros declaring side×side pixels: a few MB."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    c = zlib.compressobj(1)
    row = bytes(1 + channels * side)
    idat = b"".join(c.compress(row) for _ in range(side)) + c.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0 if channels == 1 else 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def bomb_mask() -> bytes:
    return bomb_mask_png()


def test_masks_declaring_400_to_900_megapixels_are_refused_at_conversion(tmp_path, bomb_mask):
    images = tmp_path / "images"
    images.mkdir()
    for i in range(2):
        (images / f"im{i}.jpg").write_bytes(_image(i))
    colour = bomb_mask_png(20_000, 3)  # 400 MP RGB: 1.2 GB decoded, through --mask-palette
    for masks, side, extra in ((tmp_path / "grey", 30_000, []),
                               (tmp_path / "rgb", 20_000, ["--mask-palette", "auto"])):
        masks.mkdir()
        for i in range(2):
            (masks / f"im{i}.png").write_bytes(bomb_mask if not extra else colour)
        r = peak_run(*CLI, "convert", images, "--to", "lmdb", "-o", tmp_path / f"o{side}",
                     "--masks", masks, "--workers", "0", "-q", *extra)
        assert r["peak_mb"] < PEAK_LIMIT_MB, (side, r["peak_mb"])
        assert r["rc"] == 2 and "Traceback" not in r["err"], r  # every sample refused, by name
        assert f"mask im0.png: declares {side}x{side}" in r["err"], r["err"]


_LOAD = """
import resource, sys
import feedpipe
loader = feedpipe.make_loader(sys.argv[1], 1, size=16, fields=["image", "mask"], num_workers=0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
try:
    next(iter(loader))
except feedpipe.errors.CorruptRecordError as exc:
    print("REFUSED", exc)
try:
    feedpipe.open_dataset(sys.argv[1])[0]
except feedpipe.errors.CorruptRecordError as exc:
    print("REFUSED", exc)
print("GREW_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before)
"""


def test_stored_mask_declaring_900_megapixels_is_refused_by_the_loader(tmp_path, bomb_mask):
    root = tmp_path / "ds"
    schema = Schema((ImageField("image", "jpeg"), MaskField("mask", "png"), JsonField("path")))
    writer = WRITERS["lmdb"](root, schema)
    writer.write({"image": _image(0), "mask": bomb_mask, "path": "im0.jpg"})
    files, extra = writer.close()
    Manifest("lmdb", 1, schema, (), tuple(FileEntry.of(root, f) for f in files), {}, (),
             extra).write(root)
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(root)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED")]
    assert len(refused) == 2, proc.stdout
    for line in refused:
        assert "mask" in line and "30000x30000" in line and "im0.jpg" in line, line
    grew = int(proc.stdout.split("GREW_MB")[1])
    assert grew < 200, proc.stdout
