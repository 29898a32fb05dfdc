"""Hostile inputs at conversion: decompression bombs, symlink loops, unreadable files, names that
are not UTF-8, empty files. Each is refused or skipped by name, and the run goes on."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import feedpipe
from converters import convert
from feedpipe.dataset.manifest import Manifest
from feedpipe.errors import BadInputError
from feedpipe.schema.imaging import decode_rgb

BOMB_SIDE = 50_000  # 2.5 gigapixels: 7.5 GB as RGB


def bomb_png() -> bytes:
    """A 1 KB PNG whose header declares BOMB_SIDE² RGB pixels."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    ihdr = struct.pack(">IIBBBBB", BOMB_SIDE, BOMB_SIDE, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * (1 + 3 * BOMB_SIDE) * 4, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def bomb_jpeg() -> bytes:
    """A small valid JPEG whose frame header is patched to declare BOMB_SIDE² pixels."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.find(b"\xff\xc0")
    data[sof + 5: sof + 9] = struct.pack(">HH", BOMB_SIDE, BOMB_SIDE)
    return bytes(data)


@pytest.fixture
def bombs(tmp_path, photos) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "bomb.png").write_bytes(bomb_png())
    (src / "bomb.jpg").write_bytes(bomb_jpeg())
    shutil.copy(photos[0].path, src / "fine.jpg")
    return src


_CONVERT_UNDER_LIMIT = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a 7.5 GB allocation cannot happen
from converters import convert
res = convert(sys.argv[1], sys.argv[2], to="lmdb", workers=0)
print(json.dumps({"written": res.written, "skipped": res.skipped}))
"""


@pytest.mark.heavy
def test_decompression_bombs_refused_before_allocating(tmp_path, bombs):
    # in a child process with 3 GB of address space: refusing must not need the memory
    proc = subprocess.run([sys.executable, "-c", _CONVERT_UNDER_LIMIT, str(bombs),
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["written"] == 1
    reasons = {s["path"]: s["reason"] for s in res["skipped"]}
    assert set(reasons) == {"bomb.png", "bomb.jpg"}
    for reason in reasons.values():
        assert "50000x50000" in reason and "--max-pixels" in reason
    m = Manifest.read(tmp_path / "o")
    assert m.conversion["max_pixels"] == feedpipe.schema.imaging.DEFAULT_MAX_PIXELS


def test_pixel_limit_is_the_users_to_set(tmp_path, bombs):
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(bombs / "small.png")  # 64 pixels
    res = convert(bombs, tmp_path / "o", to="wds", workers=0, max_pixels=100)
    assert res.written == 1
    assert {s["path"] for s in res.skipped} == {"fine.jpg", "bomb.png", "bomb.jpg"}
    assert all("over the limit of 100 " in s["reason"] for s in res.skipped)
    assert Manifest.read(tmp_path / "o").conversion["max_pixels"] == 100
    with pytest.raises(BadInputError, match="bomb.jpg"):
        convert(bombs, tmp_path / "s", to="wds", workers=0, strict=True)


def test_loader_side_decode_refuses_a_stored_bomb():
    for data in (bomb_jpeg(), bomb_png()):
        with pytest.raises(BadInputError):
            decode_rgb(data, "mixed")


def test_loops_bad_names_and_empty_files_are_named_and_skipped(tmp_path, photos):
    src = tmp_path / "src"
    (src / "cls").mkdir(parents=True)
    shutil.copy(photos[0].path, src / "cls" / "fine.jpg")
    os.symlink("loop.jpg", src / "cls" / "loop.jpg")           # a link to itself
    os.symlink("..", src / "cls" / "up")                       # a folder link to its parent
    os.symlink("missing.jpg", src / "cls" / "dangling.jpg")
    (src / "cls" / "empty.jpg").write_bytes(b"")
    raw_name = os.fsencode(str(src / "cls")) + b"/caf\xe9.jpg"   # Latin-1 bytes: not UTF-8
    with open(raw_name, "wb") as fh:
        fh.write(photos[1].path.read_bytes())
    res = convert(src, tmp_path / "o", to="wds", workers=0)
    assert res.written == 1
    assert res.skipped == [{"path": "cls/empty.jpg", "reason": "empty file"}]
    taken = {f["path"]: f["reason"] for f in res.ignored_files}
    assert taken["cls/loop.jpg"] == "symlink loop"
    assert "symlink loop" in taken["cls/up/"]
    assert "broken symlink" in taken["cls/dangling.jpg"]
    assert "not valid UTF-8" in taken["cls/caf\\xe9.jpg"]
    m = Manifest.read(tmp_path / "o")  # the manifest holds the names as valid JSON
    assert {f["path"] for f in m.conversion["ignored"]} == set(taken)
    with pytest.raises(BadInputError, match="not valid UTF-8|symlink"):
        convert(src, tmp_path / "s", to="wds", workers=0, strict=True)


_CONVERT = """
import json, sys
from converters import convert
res = convert(sys.argv[1], sys.argv[2], to="hdf5", workers=0)
print(json.dumps({"written": res.written, "skipped": res.skipped}))
"""


@pytest.mark.heavy
def test_unreadable_file_is_named_and_skipped(photos):
    # chmod 000 stops reads only for a user without CAP_DAC_OVERRIDE: as root, the conversion
    # runs as 'nobody' in a folder everyone can enter
    work = Path(tempfile.mkdtemp(prefix="fp-unreadable-"))
    try:
        os.chmod(work, 0o777)
        src = work / "src"
        src.mkdir()
        shutil.copy(photos[0].path, src / "fine.jpg")
        shutil.copy(photos[1].path, src / "locked.jpg")
        for p in (src, src / "fine.jpg"):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        os.chmod(src / "locked.jpg", 0)
        as_nobody = os.geteuid() == 0
        if as_nobody and shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: chmod 000 cannot stop reads here")
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody \
            else []
        probe = subprocess.run([*prefix, sys.executable, "-c", "import converters"],
                               capture_output=True, text=True, timeout=300, cwd=work)
        if probe.returncode != 0:
            pytest.skip(f"'nobody' cannot import feedpipe here: {probe.stderr[-200:]}")
        proc = subprocess.run([*prefix, sys.executable, "-c", _CONVERT, str(src),
                               str(work / "out")], capture_output=True, text=True, timeout=300,
                              cwd=work)
        assert proc.returncode == 0, proc.stderr
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        assert res["written"] == 1
        assert res["skipped"] == [{"path": "locked.jpg", "reason": "unreadable: Permission denied"}]
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the owner may delete a mode-000 file
