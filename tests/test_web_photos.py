"""The web photo benchmark set: ``make_web_photos`` writes the documented mix
(progressive and baseline, 4:2:0 and 4:4:4, EXIF orientations, quality 75-95, sizes scaled from
640-4000 px) of real photographs' own pixels (never enlarged), ``jpeg_mix`` measures it back, the
all-baseline control holds the same photos, and converting the mix stores every progressive
upright file as baseline and every EXIF-rotated one upright."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from fp_helpers import needs_transform
from PIL import Image, ImageOps

import feedpipe
from converters import convert
from converters.synth import (
    WEB_PHOTOS,
    WEB_QUALITY,
    _load_photos,
    _real_pixels,
    jpeg_mix,
    make_web_photos,
)
from feedpipe.schema.codecs import JPEG_PROGRESSIVE, jpeg_frame

N, SCALE = 60, 0.05  # longer sides 32-200 px: the mix, not the pixel count, is under test


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> Path:
    return make_web_photos(tmp_path_factory.mktemp("web") / "src", N, classes=3, seed=5,
                           scale=SCALE)


def quality_of(path: Path) -> int:
    """The libjpeg quality whose scaled standard luminance table the file holds (-1: none)."""
    with Image.open(path) as im:
        table = np.sort(np.array(im.quantization[0]))
    for q in range(1, 101):
        scale = 5000 // q if q < 50 else 200 - 2 * q
        if np.array_equal(np.sort(np.clip((np.array(_LUMA) * scale + 50) // 100, 1, 255)), table):
            return q
    return -1


_LUMA = [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57,
         69, 56, 14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64,
         81, 104, 113, 92, 49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99]


def test_web_mix_is_what_the_docs_say(web):
    files = sorted(web.rglob("*.jpg"))
    assert len(files) == N and sorted(p.name for p in web.iterdir()) == sorted(WEB_PHOTOS[:3])
    mix = jpeg_mix(files)
    assert mix["files"] == N
    assert 0.25 <= mix["progressive"] <= 0.55  # 40% drawn
    assert set(mix["subsampling"]) == {"420", "444"} and mix["subsampling"]["420"] > 0.5
    assert {"1", "6"} <= set(mix["orientation"]) and mix["orientation"]["1"] > 0.7
    lo, _, hi = mix["longer_side_px"]
    assert round(640 * SCALE) <= lo and hi <= round(4000 * SCALE) and hi > lo
    qualities = {quality_of(p) for p in files}
    assert qualities <= set(range(WEB_QUALITY[0], WEB_QUALITY[1] + 1)) and len(qualities) > 5
    again = make_web_photos(web.parent / "again", N, classes=3, seed=5, scale=SCALE)
    assert all((again / p.relative_to(web)).read_bytes() == p.read_bytes() for p in files)


@needs_transform
def test_web_set_converts_progressive_to_baseline_and_rotated_upright(web, tmp_path):
    files = {p.relative_to(web).as_posix(): p.read_bytes() for p in sorted(web.rglob("*.jpg"))}
    frames = {k: jpeg_frame(v) for k, v in files.items()}
    upright_prog = {k for k, f in frames.items() if f[4] in JPEG_PROGRESSIVE and f[3] == 1}
    rotated = {k for k, f in frames.items() if f[3] != 1}
    assert upright_prog and rotated
    res = convert(web, tmp_path / "ds", to="lmdb", workers=0)
    assert res.written == N and res.transcoded == len(upright_prog) and not res.progressive_kept
    assert res.reencoded == len(rotated)
    ds = feedpipe.open_dataset(tmp_path / "ds")
    for i in range(len(ds)):
        raw = ds.read_raw(i)
        name, stored = raw["path"], bytes(raw["image"])
        assert jpeg_frame(stored)[4] not in JPEG_PROGRESSIVE, name
        if name in upright_prog:
            assert np.array_equal(simplejpeg.decode_jpeg(stored),
                                  simplejpeg.decode_jpeg(files[name]))
        elif name in rotated:
            with Image.open(web / name) as im:
                assert ds[i]["image"].shape[:2] == ImageOps.exif_transpose(im).size[::-1]
        else:
            assert stored == files[name]


def test_all_baseline_control_is_the_same_photos(web):
    """``progressive=False``: the same files, none progressive, decoding to the same pixels
    (same quantized coefficients: only the entropy coding differs), EXIF orientations kept."""
    ctl = make_web_photos(web.parent / "control", N, classes=3, seed=5, scale=SCALE,
                          progressive=False)
    files = sorted(web.rglob("*.jpg"))
    assert sorted(p.relative_to(ctl) for p in ctl.rglob("*.jpg")) == \
        [p.relative_to(web) for p in files]
    assert jpeg_mix(sorted(ctl.rglob("*.jpg")))["progressive"] == 0
    prog = 0
    for p in files:
        a, b = p.read_bytes(), (ctl / p.relative_to(web)).read_bytes()
        fa, fb = jpeg_frame(a), jpeg_frame(b)
        prog += fa[4] in JPEG_PROGRESSIVE
        assert fb[4] not in JPEG_PROGRESSIVE and fa[:4] == fb[:4], p  # size, channels, EXIF
        assert np.array_equal(simplejpeg.decode_jpeg(a), simplejpeg.decode_jpeg(b)), p
    assert prog >= N // 4


def test_real_pixels_never_enlarge_the_photograph():
    """An image larger than its photograph holds the photograph's detail (mirrored, not
    enlarged): JPEG at quality 85 needs as many bits per pixel as for the photograph itself, and
    neighbouring 2×2 means (grain averages out) differ as much. An enlarged crop with grain, the
    old content, gave 0.60-0.67 and 0.42-0.48 of the photograph's."""
    def bits_per_pixel(a: np.ndarray) -> float:
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(a)).save(buf, "JPEG", quality=85)
        return 8 * len(buf.getvalue()) / (a.shape[0] * a.shape[1])

    def detail(a: np.ndarray) -> float:
        h, w = a.shape[0] // 2 * 2, a.shape[1] // 2 * 2
        pooled = a[:h, :w].astype(np.float32).reshape(h // 2, 2, w // 2, 2, 3).mean((1, 3))
        return float(np.abs(np.diff(pooled, axis=1)).mean())

    for src in _load_photos(("chelsea", "coffee")):  # 451x300, 600x400
        out = np.asarray(_real_pixels(src, 1600, 1200, np.random.default_rng(0)))
        assert out.shape == (1200, 1600, 3)
        assert bits_per_pixel(out) > 0.85 * bits_per_pixel(src)
        assert detail(out) > 0.85 * detail(src)


def test_peers_report_the_mix_against_the_all_baseline_control(capsys, monkeypatch):
    """The peers harness's goal line: each feedpipe contender's images/s on the mix ÷ on the
    control (and the control's CPU per image ÷ the mix's), met at ≥ 0.9; contenders absent
    from either set are left out."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the harness prepends its folders
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "peers" / "run.py"
    spec = importlib.util.spec_from_file_location("peers_run", path)
    assert spec is not None and spec.loader is not None
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)

    def rates(**kw: tuple[float, float]) -> dict:
        return {"contenders": {k.replace("_", " "): {"images_per_s": r, "cpu_ms_per_image": c}
                               for k, (r, c) in kw.items()}}

    sets = {"web": rates(feedpipe_LMDB=(450.0, 4.4), feedpipe_HDF5=(300.0, 6.0),
                         FFCV=(200.0, 9.0)),
            "web-baseline": rates(feedpipe_LMDB=(500.0, 4.0), feedpipe_HDF5=(400.0, 4.5))}
    out = run.web_control(sets)
    assert set(out) == {"feedpipe LMDB", "feedpipe HDF5"}
    assert out["feedpipe LMDB"]["rate_ratio"] == pytest.approx(0.9)
    assert out["feedpipe LMDB"]["cpu_ratio"] == pytest.approx(4.0 / 4.4)
    assert out["feedpipe HDF5"]["rate_ratio"] == pytest.approx(0.75)
    printed = capsys.readouterr().out
    assert "feedpipe LMDB on the web mix vs all-baseline: 0.90x the rate" in printed
    assert printed.count(": met") == 1 and printed.count("not met") == 1
    assert run.web_control({"web": sets["web"]}) == {}  # --no-web-control: nothing to compare


def test_bench_kernel_pairs_the_mix_with_the_control(monkeypatch):
    """bench_kernel's web group: feedpipe LMDB on the mix against the all-baseline control,
    round by round (the median of the rounds' own ratios)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench_kernel = importlib.import_module("bench_kernel")

    def timed(rates: list[float], cpu: list[float]) -> dict:
        return {"rounds": {"rate": rates, "cpu_ms_per_image": cpu}}

    kern = timed([10.0, 10.0, 10.0], [10.0, 10.0, 10.0])
    res = {"kernel 1p": kern, "kernel full-decode 1p": kern, "kernel 2p": kern}
    for w in (0, 2):
        res[f"feedpipe lmdb workers={w}"] = timed([90.0, 50.0, 95.0], [5.5, 9.0, 5.0])
        res[f"feedpipe lmdb all-baseline workers={w}"] = timed([100.0, 100.0, 100.0],
                                                               [5.0, 5.0, 5.0])
    out = bench_kernel.ratios(res)
    for w in (0, 2):  # a slow round on the mix side moves one ratio, not the median
        assert out[f"feedpipe lmdb workers={w}: rate vs all-baseline control"] == \
            pytest.approx(0.9)
        assert out[f"feedpipe lmdb workers={w}: CPU/img vs all-baseline control"] == \
            pytest.approx(1.1)
