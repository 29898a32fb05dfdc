"""Damaged and hostile JPEGs (made in tests/hostile_jpegs.py). A decode that does not reach the
end of the image is a corrupt sample in every CPU decoder path (simplejpeg, its DCT-scaled form,
the fallback for kinds simplejpeg cannot read), never an image two thirds grey; conversion
refuses each such file by name, `verify` finds one stored anyway and blames its source; and what
one JPEG may cost is bounded from its header before anything is decoded: pixels, scans, pixels a
byte of file, each named with its bound and the option that raises it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fp_helpers import cli_main, needs_transform
from hostile_jpegs import (
    claims,
    cut_with_eoi,
    dnl,
    encode,
    entropy_damaged,
    photo,
    scan_bomb,
    twelve_bit,
    with_byte_before_first_scan,
)

import feedpipe
from converters import convert
from feedpipe import Output, Workers
from feedpipe.errors import BadInputError, CorruptRecordError, DamagedImageError
from feedpipe.loader.transforms import ImageOp
from feedpipe.schema.codecs import jpeg_header
from feedpipe.schema.imaging import (
    DEFAULT_MAX_SCANS,
    check_jpeg,
    decode_jpeg_fallback,
    decode_rgb,
    jpeg_fast_decodable,
)

U8 = dict(device="cpu", output=Output(dtype="uint8"), num_workers=0, shuffle=False)
BASE = encode(photo())
PROG = encode(photo(), progressive=True)
DAMAGED = {"cut baseline": cut_with_eoi(BASE), "cut progressive": cut_with_eoi(PROG),
           "entropy damaged": entropy_damaged(BASE)}
ODD = Path(__file__).parent / "data" / "odd-sampling" / "s410.jpg"  # simplejpeg cannot read it


def grey_rows(rgb: np.ndarray) -> int:
    """Rows within 2 of 128 everywhere: what a decoder makes up past the end of the data."""
    return int((np.abs(rgb.astype(int) - 128).max(axis=(1, 2)) <= 2).sum())


@pytest.mark.parametrize("name", DAMAGED)
def test_damaged_jpeg_is_corrupt_in_every_cpu_decoder_path(name):
    data = DAMAGED[name]
    check_jpeg(data)  # every header check passes: only reading the data finds the damage
    with pytest.raises(DamagedImageError, match="damaged JPEG data.*libjpeg-turbo: "):
        decode_rgb(data, "jpeg", "image")
    for size in ((240, 320), (60, 80)):  # full scale, and the DCT-scaled decode (1/4)
        with pytest.raises(DamagedImageError, match="image: damaged JPEG data"):
            ImageOp(size).apply(data, "jpeg", np.empty((*size, 3), np.uint8), None, "image")
    with pytest.raises(DamagedImageError):
        decode_rgb(data, "mixed")


@needs_transform
def test_fallback_decoder_refuses_damage_too():
    """A 4:1:0 JPEG (simplejpeg cannot read it) cut with its end marker put back: Pillow made it
    grey; the fallback now reads it with turbojpeg, strictly, and names the damage."""
    data = ODD.read_bytes()
    assert not jpeg_fast_decodable(data)
    whole = decode_jpeg_fallback(data)
    cut = cut_with_eoi(data, 0.5)
    with pytest.raises(DamagedImageError, match="premature end"):
        decode_jpeg_fallback(cut)
    out = np.empty((90, 120, 3), np.uint8)
    with pytest.raises(DamagedImageError):
        ImageOp((90, 120)).apply(cut, "jpeg", out, None, "image")
    assert ImageOp((90, 120)).apply(data, "jpeg", out, None, "image").fallback
    assert np.array_equal(out, whole)


@pytest.mark.parametrize("make, words", [(twelve_bit, "12-bit JPEG"), (dnl, "DNL marker")])
def test_jpegs_no_decoder_reads_are_named_not_a_bytesio(make, words):
    data = make(BASE)
    for decode in (lambda: decode_rgb(data, "jpeg", "image"),
                   lambda: ImageOp((8, 8)).apply(data, "jpeg", np.empty((8, 8, 3), np.uint8),
                                                 None, "image")):
        with pytest.raises(BadInputError, match=words) as err:
            decode()
        assert "BytesIO" not in str(err.value)


@pytest.fixture(scope="module")
def damaged_dir(tmp_path_factory) -> Path:
    """Two good photos, every damaged case, a 12-bit and a DNL JPEG."""
    root = tmp_path_factory.mktemp("damaged") / "src"
    root.mkdir()
    files = {"good.jpg": BASE, "good-prog.jpg": PROG,
             **{name.replace(" ", "-") + ".jpg": data for name, data in DAMAGED.items()},
             "twelve.jpg": twelve_bit(BASE), "dnl.jpg": dnl(BASE)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


REASONS = {"cut-baseline.jpg": "damaged JPEG data", "cut-progressive.jpg": "damaged JPEG data",
           "entropy-damaged.jpg": "damaged JPEG data", "twelve.jpg": "12-bit JPEG",
           "dnl.jpg": "DNL marker"}


@pytest.mark.parametrize("jpeg", ["baseline", "keep"])
def test_conversion_refuses_every_jpeg_the_loader_could_not_decode_whole(tmp_path, damaged_dir,
                                                                          jpeg):
    res = convert(damaged_dir, tmp_path / "o", to="lmdb", workers=0, layout="flat", jpeg=jpeg)
    reasons = {s["path"]: s["reason"] for s in res.skipped}
    assert reasons.keys() == REASONS.keys()
    for path, words in REASONS.items():
        assert words in reasons[path], (path, reasons[path])
    assert res.written == 2 and not res.progressive_kept and not res.slow_jpegs
    for s in feedpipe.open_dataset(tmp_path / "o"):
        assert grey_rows(s["image"]) == 0, s["path"]


def test_conversion_in_the_worker_pool_refuses_them_too(tmp_path, damaged_dir):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(64):  # >= 64 inputs: the pool reads them
        (src / f"a{k:02d}.jpg").write_bytes(encode(photo(64, 48, seed=k)))
    for p in damaged_dir.iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    res = convert(src, tmp_path / "o", to="wds", workers=2, layout="flat")
    assert {s["path"] for s in res.skipped} == REASONS.keys() and res.written == 66


def test_header_check_stores_them_and_the_loader_and_verify_name_each(tmp_path, damaged_dir):
    """``check="header"`` (markers only) stores the damaged files (never the 12-bit or DNL
    ones): the loader raises naming the record and its source, or with on_error="skip" serves
    the others and lists them; verify names each and says the source was damaged."""
    out = tmp_path / "o"
    res = convert(damaged_dir, out, to="lmdb", workers=0, layout="flat", check="header",
                  jpeg="keep")
    assert {s["path"] for s in res.skipped} == {"twelve.jpg", "dnl.jpg"} and res.written == 5
    ds = feedpipe.open_dataset(out)
    paths = [s["path"] for s in ds.read_raw_batch(range(len(ds)))]
    with pytest.raises(CorruptRecordError, match="damaged JPEG data") as err:
        list(feedpipe.make_loader(out, 8, size=32, **U8))
    assert "[source file: " in str(err.value)
    ld = feedpipe.make_loader(out, 8, size=32, workers=Workers(on_error="skip"),
                              fields=["image", "path"], **U8)
    with pytest.warns(UserWarning, match="skipped 3 corrupt record"):
        batches = list(ld)
    assert sorted(s.split("source file: ")[1][:-1] for s in ld.skipped) == sorted(DAMAGED_NAMES)
    assert not ld.decoder_fallbacks
    for b in batches:  # the substitutes are the good photos, never a grey image
        for img in b["image"]:
            assert grey_rows(img.permute(1, 2, 0).numpy()) < 8
    report = feedpipe.verify(out)
    assert len(report.problems) == 3
    for p in report.problems:
        assert "the source file was already damaged" in p
        assert any(f"[source file: {n}]" in p for n in DAMAGED_NAMES), p
    assert sorted(paths) == sorted(["good.jpg", "good-prog.jpg", *DAMAGED_NAMES])


DAMAGED_NAMES = ["cut-baseline.jpg", "cut-progressive.jpg", "entropy-damaged.jpg"]


def test_summary_says_only_what_the_fallback_read(tmp_path, capsys):
    """The fallback decoder is named for the JPEGs it read whole; a 12-bit one is refused by
    name, never counted under "Pillow reads them"."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "s410.jpg").write_bytes(ODD.read_bytes())
    (src / "twelve.jpg").write_bytes(twelve_bit(BASE))
    rc, out, _ = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "o",
                          "--workers", "0", "-q")
    assert rc == 0
    assert "Pillow reads them" not in out
    assert "1 JPEGs need the slower fallback decoder" in out and "s410.jpg" in out
    assert "skipped twelve.jpg: 12-bit JPEG" in out


# --- hostile: bounded cost, set from the header ---------------------------------------------------

def test_scans_are_counted_without_searching_a_baseline_file():
    assert jpeg_header(BASE).scans == 1
    assert jpeg_header(PROG).scans == PROG.count(b"\xff\xda") > 1
    bomb = scan_bomb(64, 48, 3)
    assert jpeg_header(bomb).scans == 1 + 3 * 63 * 14 == 2647
    assert jpeg_header(with_byte_before_first_scan(bomb)).scans == 2647  # counted on from there


def test_scan_bomb_refused_from_its_header_with_the_bound_and_option(tmp_path):
    bomb = scan_bomb(96, 64, 3)
    rgb = decode_rgb(bomb, "jpeg", max_scans=None)  # valid: a flat image, decoded whole
    assert rgb.shape == (64, 96, 3) and int(rgb.min()) == int(rgb.max()) == 200
    for data in (bomb, with_byte_before_first_scan(bomb)):
        with pytest.raises(BadInputError, match=rf"2,647 scans, over the limit of "
                           rf"{DEFAULT_MAX_SCANS} .*max_scans=100, --max-scans"):
            decode_rgb(data, "jpeg")
        with pytest.raises(BadInputError, match="2,647 scans"):
            ImageOp((32, 32)).apply(data, "jpeg", np.empty((32, 32, 3), np.uint8), None, "x")
    src = tmp_path / "src"
    src.mkdir()
    (src / "bomb.jpg").write_bytes(bomb)
    (src / "bomb-byte.jpg").write_bytes(with_byte_before_first_scan(bomb))
    (src / "good.jpg").write_bytes(BASE)
    for check in ("decode", "header"):
        res = convert(src, tmp_path / check, to="lmdb", workers=0, check=check, jpeg="keep")
        assert res.written == 1 and {s["path"] for s in res.skipped} == {"bomb.jpg",
                                                                         "bomb-byte.jpg"}
        assert all("2,647 scans" in s["reason"] for s in res.skipped)
    res = convert(src, tmp_path / "raised", to="lmdb", workers=0, max_scans=3000, jpeg="keep")
    assert [s["path"] for s in res.skipped] == ["bomb-byte.jpg"]  # a stray byte is damage
    assert "extraneous bytes" in res.skipped[0]["reason"]
    out = tmp_path / "raised"  # the limit it was converted with holds when loading it
    assert feedpipe.open_dataset(out).manifest.conversion["max_scans"] == 3000
    assert len(list(feedpipe.make_loader(out, 2, size=16, **U8))[0]["image"]) == 2
    assert feedpipe.verify(out).ok  # verify decodes under the recorded limits too
    with pytest.raises(CorruptRecordError, match="over the limit of 100"):
        list(feedpipe.make_loader(out, 2, size=16, workers=Workers(max_scans=100), **U8))


def test_file_too_small_for_its_pixels_refused_before_decoding(tmp_path):
    """A 10 KB-class progressive file whose header claims 16000×16000: every decoder would
    allocate gigabytes and return grey; refused from its size, at conversion and when loading."""
    small = encode(photo(96, 64), progressive=True)
    huge = claims(small, 16000, 16000)
    assert jpeg_header(huge)[:2] == (16000, 16000) and len(huge) < 20_000
    with pytest.raises(BadInputError, match=r"256,000,000 pixels in [\d,]+ bytes.*at most 512"
                       r".*max_pixels_per_byte=512, --max-pixels-per-byte"):
        decode_rgb(huge, "jpeg")
    with pytest.raises(BadInputError, match="pixels in"):
        ImageOp((32, 32)).apply(huge, "jpeg", np.empty((32, 32, 3), np.uint8), None, "x")
    src = tmp_path / "src"
    src.mkdir()
    (src / "huge.jpg").write_bytes(huge)
    (src / "good.jpg").write_bytes(BASE)
    res = convert(src, tmp_path / "o", to="lmdb", workers=0, check="header")
    assert [s["path"] for s in res.skipped] == ["huge.jpg"]
    assert "--max-pixels-per-byte" in res.skipped[0]["reason"]
    # stored anyway (the bound lifted, header check only), the loader refuses it undecoded
    medium = claims(small, 4000, 3000)  # 12 MP: what the old loader decoded to grey
    (src / "huge.jpg").write_bytes(medium)
    out = tmp_path / "stored"
    convert(src, out, to="lmdb", workers=0, check="header", jpeg="keep",
            max_pixels_per_byte=None)
    with pytest.raises(CorruptRecordError, match="pixels in .* bytes"):
        list(feedpipe.make_loader(out, 2, size=16, **U8))


def test_whole_real_jpegs_are_far_under_the_bound():
    """The bound is a floor of the format, not a guess: a flat image written by an encoder stays
    far under 512 pixels a byte, and one coded at the floor itself (a grey scan of one bit per
    block, the rest end-of-band runs) still passes."""
    for data in (encode(np.full((1024, 1024, 3), 77, np.uint8), progressive=True,
                        optimize=True),
                 encode(np.full((1024, 1024), 200, np.uint8), quality=10, optimize=True)):
        h = jpeg_header(data)
        assert h.width * h.height / len(data) < 512 / 2, len(data)
        check_jpeg(data)
    floor = scan_bomb(1024, 1024, 1, al=0)
    assert 300 < 1024 * 1024 / len(floor) < 512
    check_jpeg(floor)
    assert decode_rgb(floor, "jpeg").shape == (1024, 1024, 3)


def test_limits_are_checked_options(tmp_path):
    from feedpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="max_scans=0"):
        convert(tmp_path, tmp_path / "o", to="lmdb", max_scans=0)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(BASE)
    convert(tmp_path / "src", tmp_path / "ds", to="lmdb")
    with pytest.raises(ConfigError, match="max_pixels_per_byte=-1"):
        feedpipe.make_loader(tmp_path / "ds", 1, workers=Workers(max_pixels_per_byte=-1), **U8)


def test_device_decode_workers_check_the_header_too(tmp_path):
    """Images decoded on the device leave the workers encoded: the workers run the same header
    checks on the bytes first, so a scan bomb or a file too small for its pixels is a corrupt
    sample there too (under on_error), never handed to nvJPEG."""
    from feedpipe.loader.dataset import BatchDataset
    from feedpipe.loader.sampler import BatchRequest

    src = tmp_path / "src"
    src.mkdir()
    for name, data in (("a.jpg", BASE), ("bomb.jpg", scan_bomb(96, 64, 3)),
                       ("huge.jpg", claims(encode(photo(96, 64), progressive=True), 4000, 3000))):
        (src / name).write_bytes(data)
    convert(src, tmp_path / "ds", to="lmdb", workers=0, check="header", jpeg="keep",
            max_scans=None, max_pixels_per_byte=None)
    reader = feedpipe.open_dataset(tmp_path / "ds")
    enc = BatchDataset(reader, ["image"], ImageOp((16, 16)), seed=0, on_error="raise",
                       encoded_images=True)
    paths = [s["path"] for s in reader.read_raw_batch(range(3))]
    good = enc.__getitems__(BatchRequest([paths.index("a.jpg")], 0, 0, 0))["image"]
    assert len(good.files()[0]) == 1
    for name, words in (("bomb.jpg", "2,647 scans"), ("huge.jpg", "pixels in")):
        with pytest.raises(CorruptRecordError, match=words):
            enc.__getitems__(BatchRequest([paths.index(name)], 0, 0, 0))

