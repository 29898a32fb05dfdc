"""The converter on odd image modes, odd file names, and corrupt inputs."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import cli_main, mean_abs_diff, pil_rgb
from PIL import Image, ImageOps

import feedpipe
from converters import convert
from feedpipe.dataset.manifest import Manifest
from feedpipe.dataset.registry import sample_key
from feedpipe.dataset.verify import verify
from feedpipe.errors import BadInputError
from feedpipe.schema.codecs import jpeg_complete, jpeg_info
from feedpipe.schema.imaging import sniff_codec

UNICODE_NAMES = ("ünï cödé name.jpg", "sub dir/фото 1.jpg", "UPPER.JPG")


def save(img: Image.Image, path: Path, fmt: str, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, fmt, **kw)
    return path


@pytest.fixture(scope="module")
def base_rgb(photos) -> np.ndarray:
    """A real photo (smooth content, so JPEG re-encoding errors stay small)."""
    return pil_rgb(photos[0].path)[:96, :128]


@pytest.fixture(scope="module")
def odd_dir(tmp_path_factory, base_rgb, photos) -> tuple[Path, dict[str, np.ndarray]]:
    """A flat folder of odd inputs and, per relative path, the RGB array the converter should give."""
    root = tmp_path_factory.mktemp("odd") / "src"
    rgb = Image.fromarray(base_rgb)
    h, w = base_rgb.shape[:2]
    expect: dict[str, np.ndarray] = {}

    save(rgb.convert("L"), root / "gray.jpg", "JPEG", quality=92)
    expect["gray.jpg"] = pil_rgb(root / "gray.jpg")
    save(rgb.convert("CMYK"), root / "cmyk.jpg", "JPEG", quality=95)
    expect["cmyk.jpg"] = pil_rgb(root / "cmyk.jpg")
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize((w, h)))
    save(rgba, root / "rgba.png", "PNG")
    expect["rgba.png"] = base_rgb  # alpha dropped, not composited
    pal = rgb.convert("P", palette=Image.ADAPTIVE, colors=64)
    save(pal, root / "palette.png", "PNG")
    expect["palette.png"] = np.asarray(pal.convert("RGB"))
    deep = (np.asarray(rgb.convert("L")).astype(np.uint16) * 257)  # full 16-bit range
    deep[0, 0], deep[0, 1] = 65535, 0
    save(Image.fromarray(deep), root / "deep16.png", "PNG")
    assert Image.open(root / "deep16.png").mode in ("I;16", "I")
    expect["deep16.png"] = np.repeat((deep >> 8).astype(np.uint8)[:, :, None], 3, axis=2)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    save(rgb, root / "rotated.jpg", "JPEG", quality=95, exif=exif.tobytes())
    with Image.open(root / "rotated.jpg") as im:
        expect["rotated.jpg"] = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert expect["rotated.jpg"].shape == (w, h, 3)
    save(rgb, root / "photo.webp", "WEBP", lossless=True)
    expect["photo.webp"] = base_rgb
    for k, name in enumerate(UNICODE_NAMES):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(photos[k + 1].path.read_bytes())
        expect[name] = pil_rgb(path)
    return root, expect


PASSTHROUGH = {"gray.jpg", "palette.png", "deep16.png", *UNICODE_NAMES}
REENCODED = {"cmyk.jpg", "rotated.jpg", "photo.webp"}
LOSSLESS = {"palette.png", "deep16.png", "photo.webp"}


@pytest.fixture(scope="module", params=["lmdb", "hdf5", "wds"])
def odd_converted(request, odd_dir, tmp_path_factory):
    root, expect = odd_dir
    out = tmp_path_factory.mktemp("oddout") / request.param
    # "sub dir/" would make it an ImageFolder tree (class folders win): read it flat
    res = convert(root, out, to=request.param, workers=0, quality=95, layout="flat")
    return out, res, {k: v for k, v in expect.items() if k != "rgba.png"}


def test_odd_modes_all_converted(odd_converted):
    out, res, expect = odd_converted
    assert res.written == len(expect)
    # transparent alpha is refused by name, with the option that keeps the RGB
    assert [s["path"] for s in res.skipped] == ["rgba.png"]
    assert "alpha" in res.skipped[0]["reason"] and "--extra-channels drop" in res.skipped[0]["reason"]
    assert res.passthrough == len(PASSTHROUGH) and res.reencoded == len(REENCODED)
    assert res.stored == {"jpeg unchanged": 4, "png unchanged": 2, "jpeg→jpeg": 2, "webp→png": 1}
    ds = feedpipe.open_dataset(out)
    assert ds.schema.names == ["image", "path"]  # a flat folder has no labels
    assert ds.schema["image"].codec == "mixed"  # JPEG and PNG records
    assert sorted(s["path"] for s in ds) == sorted(expect)
    assert ds.manifest.conversion["stored"] == res.stored


def test_lossy_reencodes_are_named(odd_converted, odd_dir, tmp_path, capsys):
    """A CMYK or EXIF-rotated JPEG is re-encoded lossily without being asked: named
    with the reason in the result, the manifest and the CLI summary, not only counted."""
    out, res, _ = odd_converted
    named = {f["path"]: f["reason"] for f in res.lossy}
    assert set(named) == {"cmyk.jpg", "rotated.jpg"}  # photo.webp went losslessly to PNG
    assert "CMYK converted to RGB" in named["cmyk.jpg"]
    assert "EXIF orientation 6 turned upright" in named["rotated.jpg"]
    assert all("re-encoded as jpeg at quality 95" in r for r in named.values())
    conversion = feedpipe.open_dataset(out).manifest.conversion
    assert conversion["reencoded_lossy"] == res.lossy
    rc, text, err = cli_main(capsys, "convert", odd_dir[0], "--to", "lmdb", "-o", tmp_path / "o",
                             "--layout", "flat", "--workers", "0", "-q")
    assert rc == 0, err
    assert "re-encoded (lossy) cmyk.jpg: CMYK converted to RGB" in text
    assert "re-encoded (lossy) rotated.jpg: EXIF orientation 6" in text


def test_odd_modes_decode_to_rgb_uint8(odd_converted):
    out, _, expect = odd_converted
    ds = feedpipe.open_dataset(out)
    for s in ds:
        img, ref = s["image"], expect[s["path"]]
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3, s["path"]
        assert img.shape == ref.shape, s["path"]
        if s["path"] in LOSSLESS:
            assert np.array_equal(img, ref), s["path"]
        tol = 0.5 if s["path"] in PASSTHROUGH else 4.0  # JPEGs re-encoded at quality 95
        assert mean_abs_diff(img, ref) < tol, s["path"]


def test_grayscale_jpeg_is_passthrough_and_gray(odd_converted, odd_dir):
    out, _, _ = odd_converted
    root, _ = odd_dir
    ds = feedpipe.open_dataset(out)
    i = [s["path"] for s in ds].index("gray.jpg")
    assert ds.read_raw(i)["image"] == (root / "gray.jpg").read_bytes()
    img = ds[i]["image"]
    assert np.array_equal(img[..., 0], img[..., 1]) and np.array_equal(img[..., 1], img[..., 2])


def test_exif_rotated_jpeg_is_reencoded_upright(odd_converted, odd_dir, base_rgb):
    out, _, _ = odd_converted
    root, _ = odd_dir
    ds = feedpipe.open_dataset(out)
    i = [s["path"] for s in ds].index("rotated.jpg")
    stored = ds.read_raw(i)["image"]
    assert stored != (root / "rotated.jpg").read_bytes()
    w, h, _, orientation = jpeg_info(stored)
    assert orientation == 1  # the stored image is upright: no orientation tag left to honour
    assert (h, w) == (base_rgb.shape[1], base_rgb.shape[0])  # transposed
    assert ds[i]["image"].shape == (base_rgb.shape[1], base_rgb.shape[0], 3)


def test_lossless_inputs_stay_lossless(odd_converted, odd_dir):
    out, _, _ = odd_converted
    root, _ = odd_dir
    ds = feedpipe.open_dataset(out)
    for i, s in enumerate(ds):
        raw = ds.read_raw(i)["image"]
        if s["path"].endswith((".png", ".webp")):
            assert sniff_codec(raw) == "png", s["path"]
            if s["path"].endswith(".png"):  # PNG bytes are stored unchanged
                assert raw == (root / s["path"]).read_bytes()
        else:
            assert jpeg_info(raw) is not None and jpeg_complete(raw), s["path"]
    i = [s["path"] for s in ds].index("deep16.png")
    with Image.open(io.BytesIO(ds.read_raw(i)["image"])) as im:
        assert im.mode in ("I;16", "I")  # 16 bits kept in the stored bytes


def test_transparent_alpha_dropped_only_when_asked(tmp_path, odd_dir, base_rgb):
    root, _ = odd_dir
    src = tmp_path / "src"
    src.mkdir()
    (src / "rgba.png").write_bytes((root / "rgba.png").read_bytes())
    res = convert(src, tmp_path / "o", to="lmdb", workers=0, extra_channels="drop")
    assert res.written == 1 and res.channels_dropped == ["rgba.png"]
    assert res.stored == {"png→png": 1}
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.manifest.conversion["channels_dropped"] == ["rgba.png"]
    assert np.array_equal(ds[0]["image"], base_rgb)


def test_unicode_and_spaces_in_names(odd_converted, odd_dir):
    out, _, _ = odd_converted
    root, _ = odd_dir
    ds = feedpipe.open_dataset(out)
    by_path = {s["path"]: i for i, s in enumerate(ds)}
    for name in UNICODE_NAMES:
        assert name in by_path
        assert ds.read_raw(by_path[name])["image"] == (root / name).read_bytes()


# --- corrupt inputs ---------------------------------------------------------------------------------

def corrupt_entropy(jpg: bytes) -> bytes:
    """Keep the headers and the end-of-image marker, break the entropy-coded data in the middle."""
    sos = jpg.rfind(b"\xff\xda")
    start = sos + 2 + int.from_bytes(jpg[sos + 2: sos + 4], "big")
    mid = (start + len(jpg)) // 2
    return jpg[:mid] + b"\xff\xc4\x00\x03\x00" + jpg[mid:]


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory, photos) -> Path:
    root = tmp_path_factory.mktemp("bad") / "src"
    root.mkdir()
    good = photos[5].path.read_bytes()
    (root / "good1.jpg").write_bytes(good)
    (root / "good2.jpg").write_bytes(photos[6].path.read_bytes())
    (root / "empty.jpg").write_bytes(b"")
    (root / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "text.jpg").write_text("this is not a picture\n" * 20)
    buf = io.BytesIO()
    Image.open(photos[7].path).save(buf, "PNG")
    (root / "truncated.png").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    bad_entropy = corrupt_entropy(good)
    # the cheap header check cannot see this damage; only a full decode can
    assert jpeg_info(bad_entropy) == jpeg_info(good) and jpeg_complete(bad_entropy)
    (root / "zz-bad-entropy.jpg").write_bytes(bad_entropy)
    (root / "notes.txt").write_text("not an image")
    (root / "labels.json").write_text("{}")
    return root


EXPECTED_REASONS = {"empty.jpg": "empty file", "truncated.jpg": "truncated",
                    "text.jpg": "not an image", "truncated.png": "corrupt image"}


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_bad_inputs_skipped_counted_and_listed(tmp_path, bad_dir, fmt):
    out = tmp_path / "out"
    res = convert(bad_dir, out, to=fmt, workers=0)
    assert res.written == 2  # the default check reads every JPEG whole: the damaged one is out
    assert res.ignored == 2
    reasons = {s["path"]: s["reason"] for s in res.skipped}
    assert reasons.keys() == {*EXPECTED_REASONS, "zz-bad-entropy.jpg"}
    for path, words in EXPECTED_REASONS.items():
        assert words in reasons[path], (path, reasons[path])
    assert reasons["zz-bad-entropy.jpg"].startswith("corrupt image: damaged JPEG data")
    m = Manifest.read(out)
    assert list(m.skipped) == res.skipped
    assert m.conversion["ignored_non_images"] == 2 and m.conversion["inputs"] == 7
    assert m.conversion["check"] == "decode"
    ds = feedpipe.open_dataset(out)
    assert [s["path"] for s in ds.read_raw_batch(range(len(ds)))] == ["good1.jpg", "good2.jpg"]
    assert verify(out).ok


def test_check_header_stores_damage_that_verify_blames_on_the_source(tmp_path, bad_dir):
    out = tmp_path / "out"
    res = convert(bad_dir, out, to="lmdb", workers=0, check="header")
    assert res.written == 3  # the header check cannot see entropy damage
    assert {s["path"] for s in res.skipped} == set(EXPECTED_REASONS)
    # verify decodes every record, so it finds the damage the header check let through, and
    # the record's checksum passing tells it the source was damaged, not the packed record
    report = verify(out)
    assert len(report.problems) == 1 and sample_key(2) in report.problems[0]
    assert "damaged JPEG data" in report.problems[0]
    assert "the source file was already damaged" in report.problems[0]
    assert "[source file: zz-bad-entropy.jpg]" in report.problems[0]


def test_check_decode_in_worker_pool(tmp_path, bad_dir, photo_dir):
    # >= 64 inputs so the process pool is used; the bad files must be caught there too
    src = tmp_path / "src"
    src.mkdir()
    for k, p in enumerate(sorted(photo_dir.rglob("*.jpg"))):
        (src / f"a{k:03d}.jpg").write_bytes(p.read_bytes())
    for p in bad_dir.iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    res = convert(src, tmp_path / "out", to="wds", workers=2, check="decode")
    assert {s["path"] for s in res.skipped} == {*EXPECTED_REASONS, "zz-bad-entropy.jpg"}
    assert res.written == len(list(photo_dir.rglob("*.jpg"))) + 2


def test_strict_raises_naming_the_file_and_leaves_nothing(tmp_path, bad_dir):
    out = tmp_path / "out"
    with pytest.raises(BadInputError, match="empty.jpg"):
        convert(bad_dir, out, to="wds", workers=0, strict=True)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no .out.partial left behind


def test_strict_passes_on_clean_input(tmp_path, photo_dir):
    res = convert(photo_dir, tmp_path / "out", to="hdf5", workers=0, strict=True,
                  check="decode")
    assert not res.skipped and res.written == len(list(photo_dir.rglob("*.jpg")))
