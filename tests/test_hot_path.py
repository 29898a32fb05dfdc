"""The decode hot path: per-image decoder fallback, the pixel limit, "mixed" fields,
the DCT-downscale margin's fidelity, and the zero-copy ring slots handed out on CPU."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image

import feedpipe
from converters import convert
from converters.synth import make_photos
from feedpipe import Output, Workers
from feedpipe.errors import BadInputError, CorruptRecordError
from feedpipe.loader import transforms
from feedpipe.loader.memory import FEED_DEPTH, ring_slots
from feedpipe.loader.transforms import DCT_MARGIN, ImageOp, _resize_rgb_into

U8 = dict(device="cpu", output=Output(dtype="uint8"))


@pytest.fixture(scope="module")
def refused_dir(tmp_path_factory) -> Path:
    """An ImageFolder tree of photos plus one 4:1:0 JPEG that simplejpeg refuses."""
    root = make_photos(tmp_path_factory.mktemp("refused") / "src", 12, size=(96, 72), classes=2,
                       seed=4)
    data = (Path(__file__).parent / "data" / "odd-sampling" / "s410.jpg").read_bytes()  # cjpeg's
    with pytest.raises(ValueError):
        simplejpeg.decode_jpeg_header(data)  # the premise: the fast decoder refuses it
    (root / "astronaut" / "zz_410.jpg").write_bytes(data)
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_refused_jpeg_falls_back_to_pillow_and_is_counted(tmp_path, refused_dir, workers):
    out = tmp_path / "ds"
    convert(refused_dir, out, to="lmdb", workers=0)
    ds = feedpipe.open_dataset(out)
    key = next(i for i in range(len(ds)) if ds.read_raw(i)["path"].endswith("zz_410.jpg"))
    ld = feedpipe.make_loader(out, 4, size=32, shuffle=False, num_workers=workers,
                              fields=["image", "label", "path"], **U8)
    batches = list(ld)
    assert sum(len(b["label"]) for b in batches) == len(ds)
    assert len(ld.decoder_fallbacks) == 1  # the record, and the source file it came from
    assert ld.decoder_fallbacks[0] == f"{ds.describe(key)} [source file: astronaut/zz_410.jpg]"
    img = torch.cat([b["image"] for b in batches])[key].permute(1, 2, 0).numpy()
    ref = np.empty_like(img)
    with Image.open(io.BytesIO(ds.read_raw(key)["image"])) as im:
        ImageOp((32, 32)).apply(np.asarray(im.convert("RGB")), "raw", ref, None, "ref")
    assert np.abs(img.astype(int) - ref).max() <= 1


def test_no_decoder_reads_it_is_corrupt():
    bad = b"\xff\xd8\xff\xe0" + b"\x00\x10JFIF" + bytes(200)
    with pytest.raises(BadInputError, match="damaged JPEG header"):
        ImageOp((16, 16)).apply(bad, "jpeg", np.empty((16, 16, 3), np.uint8), None, "image")


def test_pixel_limit_refuses_before_decoding(tmp_path, photo_dir):
    out = tmp_path / "ds"
    convert(photo_dir, out, to="lmdb", workers=0)
    with pytest.raises(CorruptRecordError, match="max_pixels=1,000"):
        next(iter(feedpipe.make_loader(out, 4, size=16, num_workers=0,
                                       workers=Workers(max_pixels=1000), **U8)))
    # the limit the converter recorded in the manifest applies when the caller sets none
    manifest = out / "feedpipe.json"
    doc = json.loads(manifest.read_text())
    doc.setdefault("conversion", {})["max_pixels"] = 2000
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CorruptRecordError, match="max_pixels=2,000"):
        next(iter(feedpipe.make_loader(out, 4, size=16, num_workers=0, **U8)))
    assert len(next(iter(feedpipe.make_loader(out, 4, size=16, num_workers=0,
                                              workers=Workers(max_pixels=10**6), **U8)))["image"]) == 4


def test_pixel_limit_on_a_huge_header_never_allocates():
    """A 65500×65500 JPEG header (4.3 gigapixels) over a few bytes: refused from the header."""
    data = bytearray(_tiny_jpeg())
    sof = data.index(b"\xff\xc0")
    data[sof + 5: sof + 9] = (65500).to_bytes(2, "big") * 2
    with pytest.raises(BadInputError, match="max_pixels"):
        ImageOp((16, 16)).apply(bytes(data), "jpeg", np.empty((16, 16, 3), np.uint8), None, "x")


def _tiny_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "JPEG")
    return buf.getvalue()


def test_mixed_field_routes_by_magic_bytes():
    rng = np.random.default_rng(0)
    arr = (rng.random((40, 60, 3)) * 255).astype(np.uint8)
    png, jpg = io.BytesIO(), io.BytesIO()
    Image.fromarray(arr).save(png, "PNG")
    Image.fromarray(arr).save(jpg, "JPEG", quality=95)
    op = ImageOp((20, 20))
    for data, codec in ((png.getvalue(), "png"), (jpg.getvalue(), "jpeg")):
        a, b = np.empty((20, 20, 3), np.uint8), np.empty((20, 20, 3), np.uint8)
        op.apply(data, "mixed", a, None, "x")
        op.apply(data, codec, b, None, "x")
        assert np.array_equal(a, b)
    exact = np.empty((40, 60, 3), np.uint8)
    ImageOp((40, 60), "none").apply(png.getvalue(), "mixed", exact, None, "x")
    assert np.array_equal(exact, arr)  # the PNG went through a lossless decoder


def test_dct_margin_scales_common_large_crops():
    """A 1280×853 photo centre-cropped to 224 decodes at 1/2 (the old 2× margin never scaled)."""
    assert ImageOp._dct_factor(853, 853, (224, 224)) == 2
    assert ImageOp._dct_factor(853, 853, (224, 224), margin=2.0) == 1
    assert ImageOp._dct_factor(400, 400, (224, 224)) == 1  # never below 1.5× the output


def test_dct_downscale_error_against_float_reference(tmp_path):
    """The documented tolerance (see ImageOp._dct_factor): at DCT_MARGIN, 1280-px photos to 224
    stay within 0.5 level on average of a float64 resize of the full-resolution decode."""
    root = make_photos(tmp_path / "big", 6, size=(1280, 853), classes=3, seed=2)
    op = ImageOp((224, 224), "center_crop")
    out = np.empty((224, 224, 3), np.uint8)
    errs = []
    for p in sorted(root.rglob("*.jpg")):
        data = p.read_bytes()
        geo = op.apply(data, "jpeg", out, None, "x")
        assert geo.height < 1000 and DCT_MARGIN == 1.5
        full = simplejpeg.decode_jpeg(data, colorspace="RGB")
        box = full[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
        x = torch.from_numpy(np.ascontiguousarray(box)).permute(2, 0, 1)[None].double()
        ref = F.interpolate(x, size=(224, 224), mode="bilinear", antialias=True)[0]
        errs.append(np.abs(out.astype(np.float64) - ref.permute(1, 2, 0).numpy()).mean())
    assert max(errs) <= 0.5, errs


def test_bench_kernel_does_the_same_work(tmp_path):
    """benchmarks/bench_kernel.py's bare kernel decodes at the DCT scale feedpipe picks and cuts
    the same box: its pixels equal feedpipe's (a fair baseline, not a cheaper or dearer one)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_kernel

    root = make_photos(tmp_path / "big", 3, size=(1280, 853), classes=1, seed=3)
    blobs = [p.read_bytes() for p in sorted(root.rglob("*.jpg"))]
    out = np.empty((224, 224, 3), np.uint8)
    for blob, box in zip(blobs, bench_kernel.plan(blobs, "center_crop"), strict=True):
        assert box[4] == 2
        ImageOp((224, 224)).apply(blob, "jpeg", out, None, "x")
        assert np.array_equal(bench_kernel.kernel_one(blob, box, True).numpy(), out)


def _ring_ptrs(ld) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in ld.ring.tensors["image"]}


@pytest.mark.parametrize("workers, context", [(0, None), (2, "fork"), (2, "spawn")])
def test_cpu_batches_are_the_ring_slots_and_slots_come_back(packed, workers, context):
    """uint8 on CPU, with workers or in-process: each batch is handed out as its ring slot (no
    copy, no fresh buffer), and a caller that lets go of each batch gets every slot back."""
    mp = {"workers": Workers(multiprocessing_context=context)} if context else {}
    ld = feedpipe.make_loader(packed["lmdb"], 4, size=32, num_workers=workers, **mp, **U8)
    ptrs, n = _ring_ptrs(ld), 0
    for batch in ld:
        assert batch["image"].untyped_storage().data_ptr() in ptrs
        n += 1
    del batch
    assert n == len(ld) > ld.ring.count  # so slots were reused, not only used once each
    ld.close()  # (the feed engine holds the next epoch's first batches, made ahead)
    ld.ring.reclaim()
    assert sorted(ld.ring._free) == list(range(ld.ring.count)) and not ld.ring._lent


@pytest.mark.parametrize("workers", [0, 2])
def test_kept_batches_are_never_overwritten(packed, workers):
    """Holding batches (or views of them) keeps their slots out of the ring: every kept batch
    still holds its own pixels at the end of the epoch, as a copy taken at once does."""
    kw = dict(size=32, seed=1, crop="random_resized_crop", flip=True, **U8)
    ref = [b["image"].clone() for b in feedpipe.make_loader(packed["lmdb"], 4, num_workers=0,
                                                            **kw)]
    ld = feedpipe.make_loader(packed["lmdb"], 4, num_workers=workers, **kw)
    views, copies = [], []
    for batch in ld:
        views.append(batch["image"][1:])  # a view only: the batch dict itself is dropped
        copies.append(batch["image"][1:].clone())
    assert len(views) == len(ref) > ld.ring.count
    for a, b, r in zip(views, copies, ref, strict=True):
        assert torch.equal(a, b) and torch.equal(a, r[1:])
    views.clear()
    del batch, a  # the loop variables were the last references
    ld.ring.reclaim()
    assert not ld.ring._lent  # released once the caller let go


@pytest.mark.parametrize("workers", [0, 2])
def test_a_kept_storage_pins_its_slot(packed, workers):
    """#23.15: keeping only ``batch["image"].untyped_storage()`` (no tensor) keeps the slot out
    of the ring too: the bytes it holds stay that batch's pixels."""
    kw = dict(size=32, seed=1, crop="random_resized_crop", flip=True, **U8)
    ref = [b["image"].clone() for b in feedpipe.make_loader(packed["lmdb"], 4, num_workers=0,
                                                            **kw)]
    ld = feedpipe.make_loader(packed["lmdb"], 4, num_workers=workers, **kw)
    kept = [batch["image"].untyped_storage() for batch in ld]
    assert len(kept) == len(ref) > ld.ring.count
    for storage, r in zip(kept, ref, strict=True):
        got = torch.empty(0, dtype=torch.uint8).set_(storage)[: r.numel()]
        assert torch.equal(got, r.permute(0, 2, 3, 1).reshape(-1))
    kept.clear()
    del storage, got
    ld.ring.reclaim()
    assert not ld.ring._lent


def test_in_process_ring_only_where_slots_can_be_lent(packed):
    """Without workers the ring is plain memory on CPU (the batch being made, those the feed
    engine keeps ready, the one in use); a CUDA device copies each batch out anyway, so it keeps
    building fresh batches."""
    ld = feedpipe.make_loader(packed["lmdb"], 8, size=32, num_workers=0, **U8)
    assert ld.ring is not None and ld.ring.count == ring_slots(0, 0) == FEED_DEPTH + 2
    assert not any(t.is_shared() for t in ld.ring.tensors["image"])
    if torch.cuda.is_available():
        gpu = feedpipe.make_loader(packed["lmdb"], 8, size=32, num_workers=0, device="cuda",
                                   output=Output(dtype="uint8"))
        assert gpu.ring is None


@pytest.mark.parametrize("private", [True, False])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("src, dst", [((300, 410), (224, 224)), ((97, 61), (224, 160)),
                                      ((64, 64), (31, 47))])
def test_resize_into_the_slot_is_interpolate_bit_for_bit(src, dst, flip, private, monkeypatch):
    """The resize writes straight into the batch slot through the op F.interpolate dispatches
    to: the same pixels as F.interpolate's result copied in (down- and upscales, flips, and a
    read-only crop of a larger image, as a zero-copy read buffer gives); without that private op
    (``private=False``) the public F.interpolate path gives them too."""
    if not private:
        monkeypatch.setattr(transforms, "_UPSAMPLE_AA", None)
    rng = np.random.default_rng(sum(src) + sum(dst))
    full = rng.integers(0, 256, (src[0] + 9, src[1] + 5, 3), dtype=np.uint8)
    full.flags.writeable = False
    region = full[4: 4 + src[0], 2: 2 + src[1]]
    x = torch.from_numpy(region.copy()).permute(2, 0, 1)[None]
    ref = F.interpolate(x.contiguous(memory_format=torch.channels_last), size=dst,
                        mode="bilinear", antialias=True, align_corners=False)[0].permute(1, 2, 0)
    out = np.zeros((*dst, 3), np.uint8)
    _resize_rgb_into(region, out, flip)
    assert np.array_equal(out, ref.numpy()[:, ::-1] if flip else ref.numpy())


@pytest.mark.parametrize("opts", [{}, {"dtype": "bfloat16", "channels_last": False},
                                  {"dtype": "float16", "mean": None, "std": None},
                                  {"dtype": "uint8", "channels_last": False}])  # Output fields
def test_cpu_workers_convert_without_setting_torchs_thread_count(packed, monkeypatch, opts):
    """With workers on the CPU, the workers convert their own batches into the ring's slots
    (one torch thread each): torch's process-wide thread count in the main process, which the
    user's step runs with, is never set. The batches are the in-process loader's, bit for bit,
    in dtype, layout and values."""
    calls: list[int] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n))[1])
    before = torch.get_num_threads()
    kw = dict(size=32, device="cpu", shuffle=False, crop="center_crop", flip=False,
              output=Output(**opts))
    ld = feedpipe.make_loader(packed["lmdb"], 8, num_workers=2, **kw)
    assert ld.batch_dataset.convert is not None
    got = list(ld)
    assert not calls and torch.get_num_threads() == before
    want = list(feedpipe.make_loader(packed["lmdb"], 8, num_workers=0, **kw))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        x, y = a["image"], b["image"]
        assert (x.dtype, x.shape, x.stride()) == (y.dtype, y.shape, y.stride())
        assert torch.equal(x, y) and torch.equal(a["label"], b["label"])


_WITHOUT_PRIVATE_OP = """
import sys
import numpy as np
import torch

namespace = type(torch.ops.aten)
real = namespace.__getattr__

def gone(self, name):  # a torch release without the private op
    if name == "_upsample_bilinear2d_aa":
        raise AttributeError(name)
    return real(self, name)

namespace.__getattr__ = gone
torch.ops.aten.__dict__.pop("_upsample_bilinear2d_aa", None)
import feedpipe
from feedpipe.loader import transforms

assert transforms._UPSAMPLE_AA is None
ld = feedpipe.make_loader(sys.argv[1], 16, size=48, shuffle=False, num_workers=0, flip=True,
                          seed=3, output=feedpipe.Output(dtype="uint8"), device="cpu")
np.save(sys.argv[2], np.concatenate([b["image"].numpy() for b in ld]), allow_pickle=False)
"""


def test_a_torch_without_the_private_resize_op_loads_the_same_pixels(packed, tmp_path):
    """The private ATen op is looked up at import; a torch without it imports feedpipe and loads
    the same batches through the public F.interpolate (it used to fail at import)."""
    import subprocess

    out = tmp_path / "images.npy"
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_PRIVATE_OP, str(packed["lmdb"]),
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ld = feedpipe.make_loader(packed["lmdb"], 16, size=48, shuffle=False, num_workers=0,
                              flip=True, seed=3, output=Output(dtype="uint8"), device="cpu")
    want = np.concatenate([b["image"].numpy() for b in ld])
    assert transforms._UPSAMPLE_AA is not None  # this process took the private op
    assert np.array_equal(np.load(out, allow_pickle=False), want)


def test_a_flipped_sample_is_mirrored_by_one_torch_flip(monkeypatch):
    """Flipping after the resize into the slot is one vectorized pass (torch's flip), not
    numpy's copy of a negative-stride view (~170 µs a 224² image, more than the resize itself);
    what each costs is a benchmark's to say, not a timed test's."""
    rng = np.random.default_rng(0)
    region = rng.integers(0, 256, (300, 410, 3), dtype=np.uint8)
    plain, flipped = np.zeros((224, 224, 3), np.uint8), np.zeros((224, 224, 3), np.uint8)
    flips = []
    real = torch.Tensor.flip
    monkeypatch.setattr(torch.Tensor, "flip", lambda t, *a: (flips.append(a), real(t, *a))[1])
    _resize_rgb_into(region, plain, False)
    assert not flips
    _resize_rgb_into(region, flipped, True)
    assert flips == [(1,)] and np.array_equal(flipped, plain[:, ::-1])


@pytest.mark.parametrize("writeable", [True, False])
def test_a_same_size_crop_is_mirrored_into_the_slot(writeable):
    """A crop already at the batch's size is copied (mirrored when flipped) without a resize,
    from a strided, possibly read-only decode buffer."""
    rng = np.random.default_rng(1)
    full = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    full.flags.writeable = writeable
    op = ImageOp((32, 24), crop="center_crop")
    geo = transforms.Geometry(3, 7, 32, 24, True)
    out = np.zeros((32, 24, 3), np.uint8)
    assert op._cut(full, out, geo, 1, "image") == geo
    assert np.array_equal(out, full[3:35, 7:31][:, ::-1])
    op._cut(full, out, geo._replace(flip=False), 1, "image")
    assert np.array_equal(out, full[3:35, 7:31])


def test_crops_are_made_dense_in_one_reused_buffer(monkeypatch):
    """A crop of the decoded image (strided rows) is copied into this thread's reused buffer
    for the resize, not into a fresh tensor per image (fresh pages cost twice the copy's CPU):
    crops of any size resize from the same memory, and read-only views take the same path."""
    seen: list[int] = []
    real = transforms._UPSAMPLE_AA
    monkeypatch.setattr(transforms, "_UPSAMPLE_AA",
                        lambda x, *a, **k: (seen.append(x.data_ptr()), real(x, *a, **k))[1])
    rng = np.random.default_rng(2)
    full = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
    out = np.zeros((224, 224, 3), np.uint8)
    for k, (top, left, h, w) in enumerate([(10, 20, 300, 410), (0, 5, 120, 90),
                                           (40, 1, 335, 499)]):
        region = full[top: top + h, left: left + w]
        region.flags.writeable = bool(k % 2)
        _resize_rgb_into(region, out, False)
        ref = F.interpolate(torch.from_numpy(region.copy()).permute(2, 0, 1)[None]
                            .contiguous(memory_format=torch.channels_last), size=(224, 224),
                            mode="bilinear", antialias=True, align_corners=False)
        assert np.array_equal(out, ref[0].permute(1, 2, 0).numpy())
    buf = transforms._BUFFERS.region
    start = buf.__array_interface__["data"][0]
    assert all(start <= p < start + buf.size for p in seen) and len(seen) == 3
