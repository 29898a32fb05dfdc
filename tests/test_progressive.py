"""Progressive JPEGs stored as baseline at conversion, losslessly: the stored
file decodes to the source's pixels exactly (4:2:0 and 4:4:4, grayscale), keeps its EXIF, ICC
and comment markers, and is counted; baseline files and ``jpeg="keep"`` stay byte for byte; a
progressive file the transcode cannot take is stored as it is and named; one whose data is
damaged is refused by name (it would decode to grey), in this process and in the worker pool."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from fp_helpers import cli_main, needs_transform, pil_rgb
from PIL import Image

import feedpipe
from converters import convert, progressive, worker
from converters.merge import merge
from converters.parts import Part
from converters.progressive import TRANSCODED
from converters.synth import _load_photos, _real_pixels
from feedpipe.schema.codecs import JPEG_PROGRESSIVE, jpeg_frame, jpeg_info

SIZE = (257, 191)  # W×H, not a multiple of the 16-pixel MCU: edge blocks are transcoded too
ICC = b"\x00\x00\x02\x00fake icc profile" + bytes(range(256)) * 2


def jpeg(rgb: np.ndarray, **save) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "JPEG", **save)
    return out.getvalue()


def exif(orientation: int = 1) -> bytes:
    e = Image.Exif()
    e[0x010F], e[0x0110], e[0x0132] = "FeedpipeCam", "Model 24", "2026:11:27 10:00:00"
    e[0x0112] = orientation
    return e.tobytes()


def markers(data: bytes) -> list[tuple[int, bytes]]:
    """The APPn and COM segments before the first scan, in order, with their payloads."""
    pos, out = 2, []
    while pos + 4 <= len(data) and data[pos + 1] != 0xDA:
        marker, (length,) = data[pos + 1], struct.unpack_from(">H", data, pos + 2)
        if 0xE0 <= marker <= 0xEF or marker == 0xFE:
            out.append((marker, data[pos + 4: pos + 2 + length]))
        pos += 2 + length
    return out


def damaged(data: bytes) -> bytes:
    """A progressive file with 600 bytes cut from inside a scan: its end-of-image marker is
    still there (the header check passes), its entropy-coded data is broken."""
    mid = len(data) // 2
    return data[:mid] + data[mid + 600:]


@pytest.fixture(scope="module")
def rgb(photos) -> np.ndarray:
    """A real photo (scikit-image's, via the test run's photo set) at an odd size."""
    return np.asarray(Image.fromarray(pil_rgb(photos[0].path)).resize(SIZE, Image.BICUBIC))


@pytest.fixture(scope="module")
def src(rgb, tmp_path_factory) -> Path:
    """A flat folder: progressive 4:2:0 (EXIF, ICC, comment), 4:4:4 (EXIF) and grayscale
    files, a baseline one, and a damaged progressive one."""
    root = tmp_path_factory.mktemp("progressive") / "src"
    root.mkdir()
    files = {
        "p420.jpg": jpeg(rgb, quality=90, progressive=True, subsampling=2, exif=exif(),
                         icc_profile=ICC, comment=b"shot for feedpipe"),
        "p444.jpg": jpeg(rgb, quality=85, progressive=True, subsampling=0, exif=exif()),
        "pgray.jpg": jpeg(rgb[..., 1].copy(), quality=80, progressive=True),
        "base.jpg": jpeg(rgb, quality=90, subsampling=2, exif=exif()),
    }
    files["damaged.jpg"] = damaged(files["p444.jpg"])
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


TRANSCODES = ("p420.jpg", "p444.jpg", "pgray.jpg")


def stored(out: Path) -> dict[str, bytes]:
    ds = feedpipe.open_dataset(out)
    return {ds.read_raw(i)["path"]: bytes(ds.read_raw(i)["image"]) for i in range(len(ds))}


def test_jpeg_frame_tells_progressive(rgb):
    for kw, prog in (({}, False), ({"optimize": True}, False), ({"progressive": True}, True)):
        frame = jpeg_frame(jpeg(rgb, **kw))
        assert frame is not None and (frame[4] in JPEG_PROGRESSIVE) is prog, kw
        assert frame[:4] == jpeg_info(jpeg(rgb, **kw)) == (*SIZE, 3, 1)


@needs_transform
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_progressive_stored_as_baseline_bit_exact(src, tmp_path, fmt):
    res = convert(src, tmp_path / fmt, to=fmt, workers=0, layout="flat")
    assert res.written == 4 and res.transcoded == 3 and res.passthrough == 1 and not res.reencoded
    assert res.stored == {TRANSCODED: 3, "jpeg unchanged": 1}
    assert not res.progressive_kept
    assert [(k["path"], k["reason"].split(",")[0]) for k in res.skipped] == \
        [("damaged.jpg", "corrupt image: damaged JPEG data")]
    got = stored(tmp_path / fmt)
    ds = feedpipe.open_dataset(tmp_path / fmt)
    assert ds.schema["image"].codec == "jpeg"
    decoded = {s["path"]: s["image"] for s in ds}
    for name in TRANSCODES:
        before, after = (src / name).read_bytes(), got[name]
        assert jpeg_frame(after)[4] not in JPEG_PROGRESSIVE and jpeg_frame(after)[4] in (0xC0, 0xC1)
        assert jpeg_frame(before)[4] == 0xC2
        assert np.array_equal(simplejpeg.decode_jpeg(after), simplejpeg.decode_jpeg(before)), name
        assert np.array_equal(decoded[name], simplejpeg.decode_jpeg(before)), name  # the loader's
        assert simplejpeg.decode_jpeg_header(after)[3] == \
            simplejpeg.decode_jpeg_header(before)[3]  # chroma subsampling kept
        assert markers(after) == markers(before), name  # EXIF, ICC, comment: every APPn and COM
    assert {m for m, _ in markers(got["p420.jpg"])} >= {0xE1, 0xE2, 0xFE}
    assert Image.open(io.BytesIO(got["p420.jpg"])).getexif()[0x010F] == "FeedpipeCam"
    assert got["base.jpg"] == (src / "base.jpg").read_bytes()  # baseline: byte for byte
    assert "damaged.jpg" not in got
    conv = json.loads((tmp_path / fmt / "feedpipe.json").read_text())["conversion"]
    assert conv["jpeg"] == "baseline" and conv["jpeg_transcoded"] == 3
    assert conv["jpeg_progressive_kept"] == res.progressive_kept
    assert conv["stored"] == res.stored


@needs_transform
@pytest.mark.parametrize("scans", [1, 3, 6])
def test_a_file_ending_before_its_last_scans_is_kept(src, scans):
    """A progressive file whose end-of-image marker comes after its first few scans decodes
    with the missing coefficients estimated (libjpeg's block smoothing): a baseline file of the
    same coefficients would not give those pixels, so it is kept as it is, with the reason."""
    full = (src / "p444.jpg").read_bytes()
    assert progressive.scans_complete(full)
    cut = [i for i in range(len(full) - 1) if full[i: i + 2] == b"\xff\xda"][scans]
    early = full[:cut] + b"\xff\xd9" + full[cut:]  # the rest, after the marker, is never read
    assert not progressive.scans_complete(early)
    out, why = progressive.to_baseline(early)
    assert out is None and "leave coefficients out" in why
    assert not np.array_equal(simplejpeg.decode_jpeg(early), simplejpeg.decode_jpeg(full))


def test_jpeg_keep_is_byte_for_byte(src, tmp_path):
    res = convert(src, tmp_path / "keep", to="lmdb", workers=0, layout="flat", jpeg="keep")
    assert res.transcoded == 0 and res.passthrough == 4 and not res.progressive_kept
    assert [k["path"] for k in res.skipped] == ["damaged.jpg"]  # read whole: refused
    assert stored(tmp_path / "keep") == {p.name: p.read_bytes() for p in src.iterdir()
                                         if p.name != "damaged.jpg"}
    conv = feedpipe.open_dataset(tmp_path / "keep").manifest.conversion
    assert conv["jpeg"] == "keep" and conv["jpeg_transcoded"] == 0
    res = convert(src, tmp_path / "header", to="lmdb", workers=0, layout="flat", jpeg="keep",
                  check="header")  # markers only: the damage goes unseen
    assert res.passthrough == 5 and stored(tmp_path / "header") == \
        {p.name: p.read_bytes() for p in src.iterdir()}


@needs_transform
def test_transcode_in_worker_pool_keeps_source_order(rgb, src, tmp_path, monkeypatch):
    """70 files (over the 64 that start a pool), every other one progressive and one damaged:
    with 2 workers and the header check the transcodes run in the pool while the baseline files
    are read, and the dataset is record for record the in-process one; the damaged file is
    refused by the transcode's own reading, in the pool as in this process."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(70):
        img = np.roll(rgb, 7 * i, axis=1)
        data = jpeg(img, quality=80 + i % 15, progressive=i % 2 == 0, subsampling=2 * (i % 3 > 0))
        (many / f"{i:03d}.jpg").write_bytes(damaged(data) if i == 10 else data)
    monkeypatch.setattr(worker, "_INLINE_S", 0.0)  # the pool from the first progressive file
    started, pool = [], worker._pool
    monkeypatch.setattr(worker, "_pool", lambda n: started.append(n) or pool(n))
    pooled = convert(many, tmp_path / "pooled", to="hdf5", workers=2, check="header")
    assert started == [2]  # one pool, started by the transcodes (passthrough stays in-process)
    inline = convert(many, tmp_path / "inline", to="hdf5", workers=0, check="header")
    assert pooled.transcoded == inline.transcoded == 34
    assert not pooled.progressive_kept and not inline.progressive_kept
    assert pooled.skipped == inline.skipped and [k["path"] for k in pooled.skipped] == ["010.jpg"]
    assert "damaged JPEG data" in pooled.skipped[0]["reason"]
    a, b = feedpipe.open_dataset(tmp_path / "pooled"), feedpipe.open_dataset(tmp_path / "inline")
    assert len(a) == 69 and a.read_raw_batch(range(69)) == b.read_raw_batch(range(69))
    for k, s in enumerate(a.read_raw_batch(range(69))):
        i = int(s["path"][:3])
        if i % 2 == 0:
            assert np.array_equal(a[k]["image"],
                                  simplejpeg.decode_jpeg((many / f"{i:03d}.jpg").read_bytes()))


@needs_transform
def test_cli_summary_and_keep(src, tmp_path, capsys):
    rc, out, _ = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "a", "-q",
                          "--workers", "0", "--layout", "flat")
    assert rc == 0
    assert "progressive JPEGs made baseline (lossless): 3" in out
    assert "stored as they are" not in out
    assert "skipped damaged.jpg: corrupt image: damaged JPEG data" in out
    rc, out, _ = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "b", "-q",
                          "--workers", "0", "--layout", "flat", "--jpeg", "keep")
    assert rc == 0 and "made baseline (lossless): 0" in out and "stored as they are" not in out
    assert stored(tmp_path / "b") == {p.name: p.read_bytes() for p in src.iterdir()
                                      if p.name != "damaged.jpg"}
    with pytest.raises(SystemExit):  # argparse names the flag and its choices
        cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "c", "--jpeg", "x")
    assert "--jpeg: invalid choice: 'x' (choose from 'baseline', 'keep')" in capsys.readouterr().err


def test_without_the_transform_progressive_files_are_kept_and_named(src, tmp_path, monkeypatch):
    monkeypatch.setattr(progressive, "turbojpeg", None)  # a platform without the wheel
    res = convert(src, tmp_path / "out", to="lmdb", workers=0, layout="flat")
    assert res.transcoded == 0 and res.passthrough == 4
    assert sorted(k["path"] for k in res.progressive_kept) == ["p420.jpg", "p444.jpg", "pgray.jpg"]
    assert all("turbojpeg" in k["reason"] for k in res.progressive_kept)
    assert [k["path"] for k in res.skipped] == ["damaged.jpg"]  # read whole without it too
    assert stored(tmp_path / "out") == {p.name: p.read_bytes() for p in src.iterdir()
                                        if p.name != "damaged.jpg"}


@needs_transform
def test_merged_parts_count_the_transcodes(src, tmp_path):
    for i in range(2):
        convert(src, tmp_path / "ds", to="lmdb", workers=0, layout="flat", part=Part(i, 2))
    merge(tmp_path / "ds")
    conv = feedpipe.open_dataset(tmp_path / "ds").manifest.conversion
    assert conv["jpeg_transcoded"] == 3 and not conv["jpeg_progressive_kept"]
    assert conv["stored"] == {TRANSCODED: 3, "jpeg unchanged": 1}


@needs_transform
def test_foreign_shards_progressive_transcoded(src, tmp_path, capsys):
    wds = pytest.importorskip("webdataset")
    (tmp_path / "shards").mkdir()
    with wds.TarWriter(str(tmp_path / "shards" / "a-000.tar")) as w:
        for name in ("p420.jpg", "base.jpg"):
            w.write({"__key__": name[:-4], "jpg": (src / name).read_bytes(), "cls": 1})
    rc, _, _ = cli_main(capsys, "convert", tmp_path / "shards", "--to", "lmdb", "-o",
                        tmp_path / "out", "-q")
    assert rc == 0
    ds = feedpipe.open_dataset(tmp_path / "out")
    prog, base = (bytes(ds.read_raw(i)["image"]) for i in range(2))
    assert jpeg_frame(prog)[4] == 0xC0 and base == (src / "base.jpg").read_bytes()
    assert np.array_equal(simplejpeg.decode_jpeg(prog),
                          simplejpeg.decode_jpeg((src / "p420.jpg").read_bytes()))
    assert ds.manifest.conversion["jpeg_transcoded"] == 1



@pytest.fixture(scope="module")
def real_photos() -> list[np.ndarray]:
    return _load_photos(("coffee", "rocket", "hubble_deep_field", "retina"))


@needs_transform
@pytest.mark.parametrize("subsampling", [0, 1, 2], ids=["444", "422", "420"])
@pytest.mark.parametrize("quality", [75, 85, 95])
def test_to_baseline_bit_exact_on_real_photos(real_photos, subsampling, quality):
    """The lossless transcode on real photographs' pixels (the web mix's content: odd sizes, up
    to 1024 px, portrait and landscape), each with an EXIF orientation: two decoders give the
    source's pixels exactly; quantization tables, every APPn/COM marker and the orientation stay."""
    rng = np.random.default_rng(quality + subsampling)
    sizes = ((803, 535), (535, 803), (257, 191), (1024, 683))
    for photo, (w, h), orientation in zip(real_photos, sizes, (1, 6, 3, 8), strict=True):
        rgb = np.asarray(_real_pixels(photo, w, h, rng))
        src = jpeg(rgb, quality=quality, subsampling=subsampling, progressive=True,
                   exif=exif(orientation))
        out, why = progressive.to_baseline(src)
        assert why is None and out is not None
        frame = jpeg_frame(out)
        assert frame[4] not in JPEG_PROGRESSIVE and frame[:4] == jpeg_frame(src)[:4]
        assert frame[3] == orientation
        assert np.array_equal(simplejpeg.decode_jpeg(out), simplejpeg.decode_jpeg(src))
        with Image.open(io.BytesIO(out)) as a, Image.open(io.BytesIO(src)) as b:
            assert a.quantization == b.quantization
            assert np.array_equal(np.asarray(a), np.asarray(b))  # libjpeg via Pillow too
        assert markers(out) == markers(src)
