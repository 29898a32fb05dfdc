"""Lossless in, lossless out; channels never dropped silently; JPEGs simplejpeg refuses still load."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import pil_rgb
from PIL import Image

import feedpipe
from converters import convert
from feedpipe.cli import main
from feedpipe.dataset.verify import verify
from feedpipe.errors import BadInputError, DamagedDataError
from feedpipe.schema.fields import ImageField
from feedpipe.schema.imaging import decode_rgb, jpeg_fast_decodable, pil_to_rgb, sniff_codec
from feedpipe.schema.model import field_from_json

tifffile = pytest.importorskip("tifffile")


@pytest.fixture(scope="module")
def base(photos) -> np.ndarray:
    """A real photo crop: fine detail, so a lossy step cannot hide."""
    return pil_rgb(photos[3].path)[:90, :120]


def lossless_inputs(root: Path, rgb: np.ndarray) -> dict[str, Image.Image]:
    """One file per lossless format and mode; value: the Pillow image it holds."""
    root.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(rgb)
    gray16 = Image.fromarray(np.asarray(img.convert("L")).astype(np.uint16) * 257 + 3)
    cases = {"rgb.png": (img, "PNG", {}), "gray.png": (img.convert("L"), "PNG", {}),
             "deep16.png": (gray16, "PNG", {}), "rgb.tif": (img, "TIFF", {}),
             "deep16.tif": (gray16, "TIFF", {}), "rgb.bmp": (img, "BMP", {}),
             "lossless.webp": (img, "WEBP", {"lossless": True}), "rgb.ppm": (img, "PPM", {}),
             "gray.pgm": (img.convert("L"), "PPM", {}), "still.gif": (img.convert("P"), "GIF", {})}
    for name, (im, fmt, kw) in cases.items():
        im.save(root / name, fmt, **kw)
    return {name: im for name, (im, _, _) in cases.items()}


@pytest.fixture(scope="module")
def lossless_out(tmp_path_factory, base) -> tuple[Path, Path, object]:
    root = tmp_path_factory.mktemp("lossless")
    lossless_inputs(root / "src", base)
    res = convert(root / "src", root / "out", to="wds", workers=0)
    return root / "src", root / "out", res


def test_lossless_formats_keep_every_pixel(lossless_out):
    src, out, res = lossless_out
    assert res.written == 10 and not res.skipped
    ds = feedpipe.open_dataset(out)
    assert ds.schema["image"].codec == "png"  # all lossless: one codec, not "mixed"
    for i, s in enumerate(ds):
        with Image.open(src / s["path"]) as im:
            assert np.array_equal(s["image"], pil_to_rgb(im)), s["path"]
        raw = ds.read_raw(i)["image"]
        assert sniff_codec(raw) == "png", s["path"]
        if s["path"].endswith(".png"):
            assert raw == (src / s["path"]).read_bytes()  # PNG bytes stored unchanged


def test_summary_counts_each_conversion(lossless_out):
    _, out, res = lossless_out
    want = {"png unchanged": 3, "tiff→png": 2, "bmp→png": 1, "webp→png": 1, "pnm→png": 2,
            "gif→png": 1}
    assert res.stored == want and res.passthrough == 3 and res.reencoded == 7
    assert feedpipe.open_dataset(out).manifest.conversion["stored"] == want


def test_sixteen_bits_kept_in_the_stored_bytes(lossless_out):
    src, out, _ = lossless_out
    ds = feedpipe.open_dataset(out)
    i = [s["path"] for s in ds].index("deep16.tif")
    with Image.open(io.BytesIO(ds.read_raw(i)["image"])) as im, Image.open(src / "deep16.tif") as o:
        assert im.mode in ("I;16", "I")
        assert np.array_equal(np.asarray(im).astype(np.int64), np.asarray(o).astype(np.int64))


def test_lossy_codec_only_when_asked(tmp_path, base):
    lossless_inputs(tmp_path / "src", base)
    res = convert(tmp_path / "src", tmp_path / "o", to="lmdb", workers=0, codec="jpeg")
    assert res.stored["png→jpeg"] == 3 and res.passthrough == 0
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.schema["image"].codec == "jpeg"
    assert all(sniff_codec(ds.read_raw(i)["image"]) == "jpeg" for i in range(len(ds)))


def test_six_channel_tiff_refused_by_name_unless_dropped(tmp_path, base):
    src = tmp_path / "src"
    src.mkdir()
    six = np.concatenate([base, base[..., ::-1]], axis=2)
    tifffile.imwrite(src / "six.tif", six, photometric="rgb", extrasamples=["unspecified"] * 3)
    tifffile.imwrite(src / "rgb48.tif", base.astype(np.uint16) * 257, photometric="rgb")
    Image.fromarray(base).save(src / "ok.png")
    res = convert(src, tmp_path / "o", to="hdf5", workers=0)
    reasons = {s["path"]: s["reason"] for s in res.skipped}
    assert set(reasons) == {"six.tif", "rgb48.tif"} and res.written == 1
    assert "6 channels" in reasons["six.tif"] and "--extra-channels drop" in reasons["six.tif"]
    assert "16 bits per colour channel" in reasons["rgb48.tif"]
    res = convert(src, tmp_path / "d", to="hdf5", workers=0, extra_channels="drop")
    assert res.written == 3 and sorted(res.channels_dropped) == ["rgb48.tif", "six.tif"]
    ds = feedpipe.open_dataset(tmp_path / "d")
    assert sorted(ds.manifest.conversion["channels_dropped"]) == ["rgb48.tif", "six.tif"]
    i = [s["path"] for s in ds].index("six.tif")
    assert np.array_equal(ds[i]["image"], base)  # the RGB channels, untouched


def test_opaque_alpha_is_not_a_loss(tmp_path, base):
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(base).convert("RGBA").save(src / "opaque.png")
    res = convert(src, tmp_path / "o", to="lmdb", workers=0)
    assert res.stored == {"png unchanged": 1} and not res.channels_dropped
    assert np.array_equal(feedpipe.open_dataset(tmp_path / "o")[0]["image"], base)


def test_sniff_codec_and_mixed_schema(base):
    datas = {}
    for fmt, kw in (("JPEG", {}), ("PNG", {}), ("WEBP", {}), ("GIF", {}), ("TIFF", {}),
                    ("BMP", {}), ("PPM", {}), ("JPEG2000", {})):
        buf = io.BytesIO()
        Image.fromarray(base).save(buf, fmt, **kw)
        datas[fmt] = buf.getvalue()
    assert {k: sniff_codec(v) for k, v in datas.items()} == {
        "JPEG": "jpeg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "TIFF": "tiff",
        "BMP": "bmp", "PPM": "pnm", "JPEG2000": "jp2"}
    assert sniff_codec(b"hello") == "unknown"
    assert np.array_equal(decode_rgb(datas["PNG"], "mixed"), base)
    assert np.array_equal(decode_rgb(datas["JPEG"], "mixed"), decode_rgb(datas["JPEG"], "jpeg"))
    f = field_from_json({"name": "image", "kind": "image", "codec": "mixed", "shape": None})
    assert isinstance(f, ImageField) and f.wds_suffix == "img"
    with pytest.raises(DamagedDataError):
        field_from_json({"name": "image", "kind": "image", "codec": "gif", "shape": None})


def test_mixed_dataset_loads_end_to_end(tmp_path, photo_dir, base):
    src = tmp_path / "src"
    shutil.copytree(photo_dir, src)
    Image.fromarray(base).save(src / "astronaut" / "zz_lossless.png")
    res = convert(src, tmp_path / "o", to="wds", workers=0)
    assert res.stored["png unchanged"] == 1 and res.image_codec == "mixed"
    assert verify(tmp_path / "o").ok
    loader = feedpipe.make_loader(tmp_path / "o", batch_size=16, size=(48, 64), device="cpu",
                                  num_workers=2, shuffle=False)
    n, labels = 0, []
    for b in loader:
        assert b["image"].shape[1:] == (3, 48, 64)
        n += b["image"].shape[0]
        labels += b["label"].tolist()
    assert n == res.written and labels.count(0) == sum(1 for _ in (src / "astronaut").iterdir())


# --- JPEGs simplejpeg refuses (4:1:0 and other samplings libjpeg-turbo's header parser rejects) ---

@pytest.fixture(scope="module")
def odd_sampling(tmp_path_factory) -> Path:
    """Committed cjpeg outputs (tests/data/README.md): 4:1:0, 3x1 and a 2×4-pixel image, plus
    a plain 4:2:0 control."""
    src = tmp_path_factory.mktemp("sampling") / "src"
    shutil.copytree(Path(__file__).parent / "data" / "odd-sampling", src)
    return src


def test_jpegs_the_fast_decoder_refuses_convert_verify_and_load(tmp_path, odd_sampling):
    slow = ["s31.jpg", "s410.jpg", "tiny2x4.jpg"]
    assert [p.name for p in sorted(odd_sampling.iterdir())
            if not jpeg_fast_decodable(p.read_bytes())] == slow
    res = convert(odd_sampling, tmp_path / "o", to="lmdb", workers=0)
    assert res.written == 4 and not res.skipped and res.slow_jpegs == slow
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.manifest.conversion["jpegs_needing_fallback_decoder"] == slow
    report = verify(tmp_path / "o")
    assert report.ok, report.problems
    for s in ds:  # the Pillow fallback decodes them exactly as Pillow does
        assert np.array_equal(s["image"], pil_rgb(odd_sampling / s["path"])), s["path"]
    with pytest.raises(BadInputError, match="truncated JPEG"):
        decode_rgb((odd_sampling / "s410.jpg").read_bytes()[:300], "jpeg")


def test_cli_summary_names_slow_jpegs(tmp_path, odd_sampling, capsys):
    assert main(["convert", str(odd_sampling), "--to", "wds", "-o", str(tmp_path / "o"), "-q",
                 "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "3 JPEGs need the slower fallback decoder" in out and "s410.jpg" in out
    assert main(["verify", str(tmp_path / "o")]) == 0


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_codec_follows_content_not_names(tmp_path, photos, base, fmt):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(photos[0].path, src / "a.jpg")
    Image.fromarray(base).save(src / "disguised.jpg", "PNG")  # as in ImageNet: a PNG named .jpg
    res = convert(src, tmp_path / "o", to=fmt, workers=0)
    assert res.stored == {"jpeg unchanged": 1, "png unchanged": 1}
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.schema["image"].codec == "mixed"
    assert np.array_equal(ds[1]["image"], base)
    (src / "a.jpg").unlink()
    convert(src, tmp_path / "p", to=fmt, workers=0)
    assert feedpipe.open_dataset(tmp_path / "p").schema["image"].codec == "png"
