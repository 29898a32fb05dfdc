"""Hostile JPEGs at full size (tests/hostile_jpegs.py): a valid 4096² file of 2,647 scans, the
same with a stray byte, a ~10 KB file claiming 16000×16000, and an 8192² progressive photo for
the transcode to baseline. Each conversion runs the real CLI in a fresh process whose peak RSS is
measured; the bombs are refused from their headers in well under a second of decoding, and the
transcode check holds the source's coefficients only, never two decoded copies. The figures
before (benchmarks/bench_hostile_jpegs.py, RESULTS.md): 52 s to convert the bomb, 13.7 s per load
of the stray-byte one, 1.6 GB and 3.7 GB for the 16000² claim, 2.4 GB for a 16384² transcode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI
from hostile_jpegs import (
    big_progressive,
    claims,
    encode,
    packed,
    photo,
    scan_bomb,
    with_byte_before_first_scan,
)

import feedpipe

pytestmark = pytest.mark.heavy

_PEAK = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr, "peak_mb": peak,
                  "seconds": time.perf_counter() - t}))
"""


def peak_run(*argv: str | Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PEAK, *map(str, argv)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# one loader epoch (batch 1, 224², no workers, on_error="skip") in a fresh process: samples
# served (a skipped one is replaced by another), samples skipped
_EPOCH = ("import feedpipe, sys\n"
          "ld = feedpipe.make_loader(sys.argv[1], 1, size=224, num_workers=0, device='cpu', "
          "workers=feedpipe.Workers(on_error='skip'), shuffle=False)\n"
          "print(sum(len(b['image']) for b in ld), len(ld.skipped))")



def folder(tmp: Path, name: str, data: bytes) -> Path:
    src = tmp / "src"
    src.mkdir()
    (src / name).write_bytes(data)
    (src / "good.jpg").write_bytes(encode(photo(64, 48)))
    return src


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return scan_bomb(4096, 4096, 3)


@pytest.mark.parametrize("stray", [False, True], ids=["valid", "stray-byte"])
def test_scan_bomb_refused_in_milliseconds(tmp_path, bomb, stray):
    data = with_byte_before_first_scan(bomb) if stray else bomb
    src = folder(tmp_path, "bomb.jpg", data)
    got = peak_run(*CLI, "convert", src, "--to", "lmdb", "-o", tmp_path / "o", "--workers", "0")
    assert got["rc"] == 0, got["err"]
    assert "skipped bomb.jpg: 2,647 scans, over the limit of 100" in got["out"]
    assert got["seconds"] < 20 and got["peak_mb"] < 400, got  # was 52 s (valid)
    # a dataset that holds it (packed directly): the loader refuses it from its header
    got = peak_run(sys.executable, "-W", "ignore", "-c", _EPOCH, packed(tmp_path / "ds", data))
    assert got["rc"] == 0 and got["out"].split() == ["2", "1"], got
    assert got["seconds"] < 20, got  # was 13.7 s a read (the stray byte: Pillow)


def test_tiny_file_claiming_16000_square(tmp_path):
    huge = claims(encode(photo(96, 64), progressive=True), 16000, 16000)
    src = folder(tmp_path, "huge.jpg", huge)
    got = peak_run(*CLI, "convert", src, "--to", "lmdb", "-o", tmp_path / "o", "--workers", "0")
    assert got["rc"] == 0 and "skipped huge.jpg: declares 16000x16000" in got["out"], got
    assert got["peak_mb"] < 400, got  # was 1.56 GB, then stored
    got = peak_run(sys.executable, "-W", "ignore", "-c", _EPOCH, packed(tmp_path / "ds", huge))
    assert got["rc"] == 0 and got["out"].split() == ["2", "1"], got
    assert got["peak_mb"] < 1000 and got["seconds"] < 20, got  # was 3.7 GB and 16 s a read


def test_transcode_check_holds_one_copy(tmp_path):
    """An 8192² progressive photo (67 MP, smooth): converted to baseline with its pixels unchanged, at a
    peak near the transform's own (the source's coefficients, 2 bytes a sample), never the two
    decoded images and the coefficients at once."""
    side = 8192
    src_jpeg = big_progressive(side)
    src = folder(tmp_path, "big.jpg", src_jpeg)
    got = peak_run(*CLI, "convert", src, "--to", "lmdb", "-o", tmp_path / "o", "--workers", "0")
    assert got["rc"] == 0 and "made baseline (lossless): 1" in got["out"], got
    coefficients_mb = side * side * 1.5 * 2 / 2**20  # 4:2:0: 1.5 samples a pixel
    rgb_mb = side * side * 3 / 2**20
    assert got["peak_mb"] < coefficients_mb + rgb_mb, got  # the former check held 3 of these
    import simplejpeg

    ds = feedpipe.open_dataset(tmp_path / "o")
    stored = next(bytes(s["image"]) for s in ds.read_raw_batch(range(2)) if s["path"] == "big.jpg")
    assert np.array_equal(simplejpeg.decode_jpeg(stored), simplejpeg.decode_jpeg(src_jpeg))
