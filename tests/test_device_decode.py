"""Decoding JPEG on the device (the nvJPEG path of the torch backend), checked on the CPU.

No GPU or CUDA torchvision here, so the device decode is a CPU JPEG decoder behind the same seam
(``DeviceDecoder``); everything else is the real path: workers ship encoded bytes + crop boxes
through real DataLoader worker processes, the main process decodes, crops, resizes and flips.
The result must match the CPU-decode path pixel for pixel within resize rounding, keep labels and
order, and keep masks aligned under random crops and flips.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from conftest import FORMATS
from seg_helpers import nearest_class, uniform_within, write_shapes
from test_loader import _corrupt_dataset

import feedpipe
from converters import convert
from feedpipe import Output, Workers
from feedpipe.errors import ConfigError, CorruptRecordError
from feedpipe.loader.api import LoaderConfig, TorchLoader, resolve
from feedpipe.loader.dataset import BatchDataset
from feedpipe.loader.sampler import BatchRequest, World
from feedpipe.loader.torch.device_decode import DeviceDecoder, EncodedBatch, choose, nvjpeg
from feedpipe.loader.transforms import ImageOp

CPU = torch.device("cpu")
U8 = dict(device="cpu", output=Output(dtype="uint8"))


def cpu_decode(files: list[torch.Tensor]) -> list[torch.Tensor]:
    """Stands in for batched nvJPEG: 3×H×W uint8 per file."""
    return [torch.from_numpy(simplejpeg.decode_jpeg(f.numpy(), colorspace="RGB")).permute(2, 0, 1)
            for f in files]


def device_loader(path: Path, batch_size: int, **options) -> TorchLoader:
    """A torch-backend loader whose JPEGs are decoded by ``cpu_decode`` in the device stage."""
    reader = feedpipe.open_dataset(path)
    cfg = resolve(LoaderConfig(batch_size, **options), reader)
    return TorchLoader(reader, cfg, World(0, 1), CPU,
                       DeviceDecoder(CPU, cpu_decode))


@pytest.mark.parametrize("fmt,workers", [(f, 0) for f in FORMATS] + [("lmdb", 2)])
def test_same_batches_as_cpu_decode(packed, fmt, workers):
    """Center crop to 64 px from ~160×120 photos: no DCT downscale on the CPU path, so both paths
    cut the same box and differ only by resize rounding (float vs uint8 kernels)."""
    kw = dict(size=64, seed=3, num_workers=workers, **U8)
    ref = list(feedpipe.make_loader(packed[fmt], 10, **kw))
    ld = device_loader(packed[fmt], 10, **kw)
    assert ld.batch_dataset.encoded_images and ld.stage.decoder is not None
    got = list(ld)
    assert len(got) == len(ref) == 8
    diffs = []
    for a, b in zip(ref, got, strict=True):
        assert a.keys() == b.keys()
        assert torch.equal(a["label"], b["label"])
        assert b["image"].shape == a["image"].shape == (a["image"].shape[0], 3, 64, 64)
        assert b["image"].dtype == torch.uint8
        assert b["image"].is_contiguous(memory_format=torch.channels_last)
        diffs.append((a["image"].int() - b["image"].int()).abs())
    d = torch.cat([x.flatten() for x in diffs]).float()
    assert d.max() <= 2 and d.mean() < 0.2, (d.max(), d.mean())


def test_normalized_output_matches(packed):
    kw = dict(size=48, shuffle=False, num_workers=0, device="cpu", output=Output(dtype="float32"))
    a = next(iter(feedpipe.make_loader(packed["hdf5"], 8, **kw)))["image"]
    b = next(iter(device_loader(packed["hdf5"], 8, **kw)))["image"]
    assert b.dtype == torch.float32 and b.shape == a.shape
    assert (a - b).abs().max() <= 2 / 255 / 0.224 + 1e-5  # two levels over the smallest std


@pytest.fixture(scope="module")
def shapes_lmdb(tmp_path_factory) -> Path:
    """Flat-coloured shapes (class = colour) as JPEGs with their masks, packed as LMDB."""
    root = tmp_path_factory.mktemp("dev_shapes")
    sizes = [(200, 150), (176, 208), (240, 170), (150, 150), (260, 200), (140, 230)]
    images, masks = write_shapes(root, sizes, seed=5)
    res = convert(images, root / "lmdb", to="lmdb", workers=0, masks=masks)
    assert res.written == len(sizes)
    return root / "lmdb"


@pytest.mark.parametrize("workers", [0, 2])
def test_random_crops_and_flips_keep_the_mask_aligned(shapes_lmdb, workers):
    ld = device_loader(shapes_lmdb, 3, size=32, crop="random_resized_crop", flip=True, seed=4,
                       fields=("image", "mask"), num_workers=workers, **U8)
    total = good = mirrored = 0
    for _ in range(4):  # four epochs of different crops and flips
        for b in ld:
            img = b["image"].permute(0, 2, 3, 1).numpy()
            for k, m in enumerate(b["mask"].numpy()):
                inner = uniform_within(m, 2)
                cls = nearest_class(img[k])
                total += inner.sum()
                good += (cls == m)[inner].sum()
                mirrored += (cls == m[:, ::-1])[inner].sum()
    assert total > 3000 and good / total >= 0.99 and mirrored / total < 0.9


def test_workers_ship_the_stored_bytes_and_the_planned_geometry(packed):
    reader = feedpipe.open_dataset(packed["lmdb"])
    op = ImageOp((40, 40), "random_resized_crop", flip=True)
    enc = BatchDataset(reader, ["image", "label"], op, seed=9, on_error="raise",
                       encoded_images=True)
    req = BatchRequest([5, 0, 33], epoch=1, number=2, rank=0)
    out = enc.__getitems__(req)
    batch = out["image"]
    assert isinstance(batch, EncodedBatch) and batch.offsets.tolist()[0] == 0
    files, pos = batch.files()
    assert pos == [0, 1, 2] and batch.rows is None  # baseline JPEGs: all still encoded
    for f, i in zip(files, req, strict=True):
        assert f.numpy().tobytes() == bytes(reader.read_raw(i)["image"])
    # the same random draws as the CPU path: plan() over a fresh rng for the same request
    from feedpipe.loader.sampler import rng_for
    rng = rng_for(9, 1, 0, 2)
    for k, i in enumerate(req):
        w, h = simplejpeg.decode_jpeg_header(bytes(reader.read_raw(i)["image"]))[1::-1]
        geo = op.plan(h, w, rng)
        assert batch.boxes[k].tolist() == list(geo[:4]) and bool(batch.flips[k]) == geo.flip
    assert out["label"].tolist() == [reader.read_raw(i)["label"] for i in req]


def test_bad_records_are_caught_in_the_workers(tmp_path):
    """Truncated files fail the worker's end-of-image check (so ``on_error`` applies as on the
    CPU path, naming the key); files without a JPEG header fail its header parse."""
    root = _corrupt_dataset(tmp_path / "bad", {7, 21})
    kw = dict(size=16, shuffle=False, num_workers=0, **U8)
    with pytest.raises(CorruptRecordError, match="key 000000007.*truncated JPEG"):
        list(device_loader(root, 8, **kw))
    ld = device_loader(root, 8, workers=Workers(on_error="skip"), **kw)
    with pytest.warns(UserWarning, match="skipped 2 corrupt"):
        labels = torch.cat([b["label"] for b in ld]).tolist()
    assert len(labels) == 40 and 7 not in labels and 21 not in labels
    reader = feedpipe.open_dataset(_headerless(tmp_path / "nohdr"))
    enc = BatchDataset(reader, ["image"], ImageOp((16, 16)), seed=0, on_error="raise",
                       encoded_images=True)
    enc.__getitems__([0, 1, 2])  # intact records pass
    with pytest.raises(CorruptRecordError, match="key 000000004.*damaged JPEG header"):
        enc.__getitems__([3, 4])


def test_undecodable_file_on_the_device_names_its_record(tmp_path):
    reader = feedpipe.open_dataset(_headerless(tmp_path / "ds"))
    good = np.frombuffer(bytes(reader.read_raw(0)["image"]), np.uint8)
    junk = np.frombuffer(b"\xff\xd8" + bytes(range(200)) + b"\xff\xd9", np.uint8)
    batch = EncodedBatch.pack([good, junk, good], [(0, 0, 20, 20)] * 3, [False] * 3, [0, 5, 2])
    dec = DeviceDecoder(CPU, cpu_decode, reader.describe)
    with pytest.raises(CorruptRecordError, match="key 000000005: cannot decode image on cpu"):
        dec(batch, (10, 10))
    ok = EncodedBatch.pack([good, good], [(0, 0, 20, 20), (5, 0, 10, 20)], [False, True], [0, 1])
    out = dec(ok, (10, 10))
    assert out.shape == (2, 10, 10, 3) and out.dtype == torch.uint8
    assert (out.int() - 50).abs().max() <= 2  # a flat grey JPEG stays grey through it all


def _headerless(root: Path) -> Path:
    """An LMDB dataset whose record 4 is not a JPEG at all."""
    import io

    from PIL import Image

    from feedpipe.dataset.manifest import FileEntry, Manifest
    from feedpipe.dataset.registry import WRITERS
    from feedpipe.schema.fields import ImageField
    from feedpipe.schema.model import Schema

    schema = Schema((ImageField("image", "jpeg"),))
    good = io.BytesIO()
    Image.fromarray(np.full((20, 20, 3), 50, np.uint8)).save(good, "JPEG")
    w = WRITERS["lmdb"](root, schema)
    for i in range(6):
        w.write({"image": b"not a jpeg at all" if i == 4 else good.getvalue()})
    files, _ = w.close()
    Manifest("lmdb", 6, schema, files=tuple(FileEntry.of(root, f) for f in files)).write(root)
    return root


def test_choice_of_decoder(packed, tmp_path):
    assert choose("cpu", CPU, True) is None
    assert choose("auto", CPU, True) is None  # no CUDA device: workers decode
    # on any device "auto" decodes in the workers until a GPU run shows nvJPEG feeds more
    assert choose("auto", torch.device("cuda"), True) is None
    with pytest.raises(ConfigError, match="decodes JPEG only"):
        choose("device", torch.device("cuda"), False)
    reason = nvjpeg(CPU)
    assert isinstance(reason, str) and "not cuda" in reason
    with pytest.raises(ConfigError, match="decode_on"):
        feedpipe.make_loader(packed["lmdb"], 4, size=32, workers=Workers(decode_on="gpu"), **U8)
    # on this machine (no CUDA) "auto" keeps decoding in the workers
    ld = feedpipe.make_loader(packed["lmdb"], 4, size=32, num_workers=0, **U8)
    assert ld.stage.decoder is None and not ld.batch_dataset.encoded_images
    png = tmp_path / "png"
    convert(_png_source(tmp_path), png, to="lmdb", workers=0, store="reencode", codec="png")
    ld = feedpipe.make_loader(png, 4, size=32, num_workers=0, **U8)
    assert ld.stage.decoder is None  # PNG: nothing for nvJPEG to do


def _png_source(tmp_path: Path) -> Path:
    from PIL import Image

    src = tmp_path / "pngsrc"
    src.mkdir()
    for i in range(4):
        Image.fromarray(np.full((30, 40, 3), 40 * i, np.uint8)).save(src / f"{i}.png")
    return src


def test_progressive_jpegs_are_decoded_in_the_workers(tmp_path):
    """A progressive JPEG (kept as it is at conversion) leaves the worker decoded, as pixels cut
    by its planned box; the rest stay encoded. The batch is the CPU path's within resize
    rounding either way."""
    from PIL import Image

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for i in range(6):
        pixels = (rng.random((90, 120, 3)) * 64 + np.linspace(0, 180, 120)[None, :, None])
        Image.fromarray(pixels.astype(np.uint8)).save(src / f"{i}.jpg", quality=92,
                                                       progressive=i % 2 == 0)
    out = tmp_path / "ds"
    convert(tmp_path / "src", out, to="lmdb", workers=0, jpeg="keep")
    reader = feedpipe.open_dataset(out)
    op = ImageOp((40, 40), "random_resized_crop", flip=True)
    enc = BatchDataset(reader, ["image"], op, seed=2, on_error="raise", encoded_images=True)
    batch = enc.__getitems__(BatchRequest(list(range(6)), epoch=0, number=0, rank=0))["image"]
    assert batch.rows is not None and batch.rows.tolist() == [0, 2, 4]
    assert batch.decoded.shape == (3, 40, 40, 3)
    files, pos = batch.files()
    assert pos == [1, 3, 5] and all(len(f) > 0 for f in files)
    kw = dict(size=40, seed=2, shuffle=False, crop="random_resized_crop", flip=True,
              num_workers=0, **U8)
    ref = torch.cat([b["image"] for b in feedpipe.make_loader(out, 3, **kw)]).int()
    got = torch.cat([b["image"] for b in device_loader(out, 3, **kw)]).int()
    d = (ref - got).abs().float()
    assert d.max() <= 3 and d.mean() < 0.3, (d.max(), d.mean())


def test_the_batched_resize_is_interpolate_per_image():
    """Crop, antialiased resize and flip of a batch of images of different sizes in two batched
    matrix products: F.interpolate(antialias=True)'s pixels per image, within rounding."""
    import torch.nn.functional as F

    from feedpipe.loader.torch.device_decode import resize_boxes

    g = torch.Generator().manual_seed(0)
    sizes = [(120, 160), (300, 200), (64, 64), (500, 375), (31, 47), (200, 90)]
    images = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in sizes]
    boxes = torch.tensor([[10, 20, 100, 120], [0, 0, 300, 200], [5, 7, 30, 40],
                          [100, 50, 300, 200], [0, 0, 31, 47], [50, 10, 20, 70]])
    flips = torch.tensor([False, True, False, True, False, True])
    out = torch.zeros((7, 48, 56, 3), dtype=torch.uint8)
    rows = torch.tensor([6, 0, 1, 2, 3, 5])
    resize_boxes(images, boxes, flips, (48, 56), out, rows)
    assert not out[4].any()  # the row nothing was written to
    for x, (t, left, h, w), flip, row in zip(images, boxes.tolist(), flips.tolist(),
                                             rows.tolist(), strict=True):
        ref = F.interpolate(x[None, :, t: t + h, left: left + w].float(), size=(48, 56),
                            mode="bilinear", antialias=True, align_corners=False)[0]
        ref = ref.round().clamp(0, 255)
        ref = ref.flip(-1) if flip else ref
        d = (out[row].permute(2, 0, 1).int() - ref.int()).abs()
        assert d.max() <= 1 and d.float().mean() < 0.01
