"""The augmentation libraries people already use, passed as they are: an albumentations
transform and a Kornia augmentation (the real libraries), a torchvision v2 transform where
torchvision imports. Each is seeded from feedpipe's per-sample or per-batch generator (the same
batches for any ``num_workers`` and after a resume), gets the image in its own layout and dtype,
and moves the masks, keypoints and boxes with the image.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import feedpipe
from feedpipe import Output
from feedpipe.errors import ConfigError, TransformError
from feedpipe.loader.augment import RandomGrayscale
from feedpipe.schema import BoxesField, ImageField, KeypointsField, Schema
from feedpipe.schema.masks import MaskField

A = pytest.importorskip("albumentations")
K = pytest.importorskip("kornia.augmentation")

sys.path.insert(0, str(Path(__file__).parent))
from test_writers import write_dataset  # noqa: E402

KW = dict(size=24, seed=3, device="cpu", crop="random_resized_crop", flip=True)
FACES = ["image", "mask", "landmarks", "boxes"]


def epoch(path, **kw):
    return [{k: v.clone() for k, v in b.items()} for b in feedpipe.make_loader(path, 8, **kw)]


def same(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k])
                                                                 for k in x)
                                    for x, y in zip(a, b, strict=True))


def resumed(path, cut, **kw):
    """The batches after the first ``cut`` of an epoch, from a loader resumed there (2 workers
    before, none after)."""
    ld = feedpipe.make_loader(path, 8, num_workers=2, **kw)
    it = iter(ld)
    for _ in range(cut):
        next(it)
    again = feedpipe.make_loader(path, 8, num_workers=0, **kw)
    again.load_state_dict(ld.state_dict())
    return [{k: v.clone() for k, v in b.items()} for b in again]


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """64×80 photos with a class ``mask``, three ``landmarks`` and four ``boxes`` each."""
    rng = np.random.default_rng(3)
    schema = Schema((ImageField("image", "raw", (64, 80, 3)),
                     MaskField("mask", codec="raw", shape=(64, 80), num_classes=5),
                     KeypointsField("landmarks", shape=(3, 2)), BoxesField("boxes")))
    samples = []
    for _ in range(24):
        mask = np.kron(rng.integers(1, 5, (8, 10)), np.ones((8, 8), np.int64)).astype(np.uint8)
        xy = rng.uniform(0, 60, (4, 2))
        samples.append({"image": rng.integers(0, 256, (64, 80, 3), dtype=np.uint8),
                        "mask": mask, "landmarks": rng.uniform(0, 64, (3, 2)).astype(np.float32),
                        "boxes": {"boxes": np.concatenate([xy, xy + 12], 1),
                                  "labels": [0, 1, 2, 3]}})
    return write_dataset("lmdb", tmp_path_factory.mktemp("faces") / "faces", samples, schema)


@pytest.fixture(scope="module")
def dots(tmp_path_factory):
    """32×32 black images with two white pixels, each marked by a landmark at its centre."""
    rng = np.random.default_rng(5)
    schema = Schema((ImageField("image", "raw", (32, 32, 3)),
                     KeypointsField("landmarks", shape=(2, 2))))
    samples = []
    for _ in range(8):
        img = np.zeros((32, 32, 3), np.uint8)
        cols, rows = rng.choice(np.arange(4, 28), 2, replace=False), rng.integers(4, 28, 2)
        img[rows, cols] = 255
        samples.append({"image": img, "landmarks": np.stack([cols + 0.5, rows + 0.5], 1)
                        .astype(np.float32)})
    return write_dataset("lmdb", tmp_path_factory.mktemp("dots") / "dots", samples, schema)


def albumentations_pipeline():
    return A.Compose([A.HorizontalFlip(p=0.5), A.RandomBrightnessContrast(p=0.8),
                      A.Affine(rotate=(-20, 20), p=0.5)])


def kornia_pipeline():
    return [K.ColorJitter(0.3, 0.3, 0.3, 0.05, p=0.8), K.RandomAffine(degrees=15, p=0.5)]


# --- seeded from feedpipe's generators ----------------------------------------------------------
def test_albumentations_compose_batches_do_not_depend_on_workers_and_resume(packed):
    kw = dict(KW, output=Output(dtype="uint8"), transform=albumentations_pipeline())
    ref = epoch(packed["lmdb"], num_workers=0, **kw)
    plain = epoch(packed["lmdb"], num_workers=0, **dict(kw, transform=None))
    assert not same(ref, plain)
    for workers in (1, 2):
        assert same(epoch(packed["lmdb"], num_workers=workers, **kw), ref)
    assert same(resumed(packed["lmdb"], 3, **kw), ref[3:])
    # a single transform, not in a Compose, is accepted as well
    one = dict(kw, transform=A.RandomBrightnessContrast(p=1.0))
    assert same(epoch(packed["lmdb"], num_workers=0, **one),
                epoch(packed["lmdb"], num_workers=2, **one))


def test_kornia_batch_augmentations_do_not_depend_on_workers_and_resume(packed):
    kw = dict(KW, batch_transforms=kornia_pipeline())
    ref = epoch(packed["lmdb"], num_workers=0, **kw)
    assert not same(ref, epoch(packed["lmdb"], num_workers=0, **dict(kw, batch_transforms=None)))
    for workers in (1, 2):
        assert same(epoch(packed["lmdb"], num_workers=workers, **kw), ref)
    assert same(resumed(packed["lmdb"], 3, **kw), ref[3:])
    # as transform=, per sample in the workers (a batch of one)
    per = dict(KW, output=Output(dtype="uint8"), transform=K.ColorJitter(0.3, 0.3, p=1.0))
    got = epoch(packed["lmdb"], num_workers=0, **per)
    assert same(got, epoch(packed["lmdb"], num_workers=2, **per))
    assert not same(got, epoch(packed["lmdb"], num_workers=0, **dict(per, transform=None)))


def test_the_global_generators_are_neither_used_nor_disturbed(packed):
    """The libraries draw from feedpipe's generators, not the process's: the training thread's
    own numpy and random draws during an epoch are what they are without the loader, and its
    torch draws change nothing in the batches, which are the same as with workers (in-process,
    the feed thread runs the transforms beside the training thread)."""
    for kw in (dict(KW, output=Output(dtype="uint8"), transform=albumentations_pipeline()),
               dict(KW, batch_transforms=kornia_pipeline())):
        ref = epoch(packed["lmdb"], num_workers=2, **kw)
        np.random.seed(11)
        random.seed(11)
        got, drawn = [], []
        for b in feedpipe.make_loader(packed["lmdb"], 8, num_workers=0, **kw):
            got.append({k: v.clone() for k, v in b.items()})
            torch.rand(1000)
            drawn.append((np.random.random(3), random.random()))
        np.random.seed(11)
        random.seed(11)
        expect = [(np.random.random(3), random.random()) for _ in drawn]
        assert same(got, ref)
        assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(drawn, expect, strict=True))


def test_a_kornia_step_draws_from_the_batch_generator_only(faces):
    """Seeded by the batch's generator, the torch global generator untouched."""
    from feedpipe.dataset.registry import open_dataset
    from feedpipe.loader.augment import batch_ops

    fields = [open_dataset(faces).schema["image"]]
    ops = batch_ops([K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0), K.RandomAffine(20, p=1.0)],
                    fields)
    x = torch.rand(4, 3, 16, 16)
    state = torch.get_rng_state()
    a = ops({"image": x.clone()}, torch.Generator().manual_seed(1))["image"]
    b = ops({"image": x.clone()}, torch.Generator().manual_seed(1))["image"]
    c = ops({"image": x.clone()}, torch.Generator().manual_seed(2))["image"]
    assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_callers_object_is_left_as_it_was(packed):
    """The loader works on its own copy: the user's Compose draws what it drew before."""
    mine = A.Compose([A.RandomBrightnessContrast(p=1.0)], seed=7)
    image = np.full((8, 8, 3), 100, np.uint8)
    expect = A.Compose([A.RandomBrightnessContrast(p=1.0)], seed=7)(image=image)["image"]
    list(feedpipe.make_loader(packed["lmdb"], 8, num_workers=0, transform=mine, **KW))
    assert np.array_equal(mine(image=image)["image"], expect)


# --- masks, keypoints and boxes follow ----------------------------------------------------------
@pytest.mark.parametrize("how", ["albumentations", "kornia-batch", "kornia-sample"])
def test_a_flip_moves_masks_keypoints_and_boxes(faces, how):
    kw = dict(device="cpu", shuffle=False, fields=FACES, output=Output(dtype="uint8"),
              num_workers=0)
    flip = {"albumentations": dict(transform=A.HorizontalFlip(p=1.0)),
            "kornia-batch": dict(batch_transforms=[K.RandomHorizontalFlip(p=1.0)]),
            "kornia-sample": dict(transform=K.RandomHorizontalFlip(p=1.0))}[how]
    for a, b in zip(epoch(faces, **kw), epoch(faces, **kw, **flip), strict=True):
        w = a["image"].shape[-1]
        assert torch.equal(b["image"], a["image"].flip(-1))
        assert torch.equal(b["mask"], a["mask"].flip(-1))
        # x → W - x in feedpipe's pixel-edge coordinates: pixel column c lands on W - 1 - c
        assert torch.allclose(b["landmarks"][..., 0], w - a["landmarks"][..., 0], atol=1e-4)
        assert torch.equal(b["landmarks"][..., 1], a["landmarks"][..., 1])
        assert torch.equal(b["landmarks_visible"], a["landmarks_visible"])
        assert torch.equal(b["boxes_count"], a["boxes_count"])
        assert torch.equal(b["boxes_labels"], a["boxes_labels"])
        mirrored = torch.stack([w - a["boxes"][..., 2], a["boxes"][..., 1],
                                w - a["boxes"][..., 0], a["boxes"][..., 3]], -1)
        real = torch.arange(a["boxes"].shape[1]) < a["boxes_count"][:, None]
        assert torch.allclose(b["boxes"][real], mirrored[real], atol=1e-4)


def test_a_transform_function_gets_and_changes_keypoints_and_boxes(faces):
    """The user's own function gets the keypoints and boxes on the canvas: an edit in place
    lands in the batch, and returned boxes may be fewer, their labels with them."""
    def edit(sample, rng):
        sample["landmarks"][:, 0] += 1  # in place
        return {"boxes": sample["boxes"][1:], "boxes_labels": sample["boxes_labels"][1:]}

    kw = dict(device="cpu", shuffle=False, fields=FACES, output=Output(dtype="uint8"))
    for workers in (0, 2):
        for a, b in zip(epoch(faces, num_workers=0, **kw),
                        epoch(faces, num_workers=workers, transform=edit, **kw), strict=True):
            assert torch.allclose(b["landmarks"][..., 0], a["landmarks"][..., 0] + 1)
            assert torch.equal(b["boxes_count"], a["boxes_count"] - 1)
            assert torch.equal(b["boxes"][:, :3], a["boxes"][:, 1:])
            assert torch.equal(b["boxes_labels"][:, :3], a["boxes_labels"][:, 1:])
    with pytest.raises(TransformError, match=r"returned 3 boxes in 'boxes' but 4 values in "
                       r"'boxes_labels'"):
        list(feedpipe.make_loader(faces, 8, num_workers=0, **kw, transform=lambda s, r: {
            "boxes": s["boxes"][1:]}))


@pytest.mark.parametrize("how", ["albumentations", "kornia"])
def test_keypoints_stay_on_what_they_mark_under_a_rotation(dots, how):
    """A quarter turn moves each white pixel to another pixel exactly: its landmark must be at
    that pixel's centre (a half-pixel slip between the conventions would show)."""
    kw = dict(device="cpu", shuffle=False, output=Output(dtype="uint8"), num_workers=0,
              fields=["image", "landmarks"])
    turn = dict(transform=A.Rotate(limit=(90, 90), p=1.0)) if how == "albumentations" \
        else dict(batch_transforms=[K.RandomRotation(degrees=(90.0, 90.0), p=1.0)])
    moved = 0
    for b in epoch(dots, **kw, **turn):
        for img, pts in zip(b["image"], b["landmarks"], strict=True):
            for x, y in pts.tolist():
                assert img[:, int(y), int(x)].min() > 200, (x, y)
                assert abs(x % 1 - 0.5) < 1e-3 and abs(y % 1 - 0.5) < 1e-3
                moved += 1
    assert moved == 16


def test_a_rotation_moves_boxes_and_drops_those_it_pushes_off_the_canvas(faces):
    kw = dict(device="cpu", shuffle=False, fields=FACES, output=Output(dtype="uint8"),
              num_workers=0)
    plain = epoch(faces, **kw)
    for how in (dict(transform=A.Compose([A.Affine(translate_px={"x": 60}, p=1.0)])),
                dict(batch_transforms=[K.RandomAffine(0, translate=(0.75, 0.0), p=1.0)])):
        got = epoch(faces, **kw, **how)
        a, b = torch.cat([x["boxes_count"] for x in plain]), \
            torch.cat([x["boxes_count"] for x in got])
        assert (b <= a).all() and (b < a).any()  # the boxes pushed off are gone
        for x in got:
            real = torch.arange(x["boxes"].shape[1]) < x["boxes_count"][:, None]
            assert (x["boxes"][real][:, 2] <= 80).all() and (x["boxes"][real][:, 0] >= 0).all()
            assert (x["boxes_labels"][~real] == -1).all() and (x["boxes"][~real] == 0).all()


# --- layouts and dtypes -------------------------------------------------------------------------
def test_layout_and_dtype_round_trips_are_exact(packed):
    """What each library takes (H×W×C uint8, a float image in [0, 1], a C×H×W tensor) and gives
    back crosses without a change: an identity pipeline gives the plain batches, bit for bit."""
    from albumentations.pytorch import ToTensorV2

    u8 = dict(KW, output=Output(dtype="uint8"), num_workers=0)
    plain = epoch(packed["lmdb"], **u8)
    for t in (A.NoOp(), A.Compose([A.ToFloat(max_value=255)]),
              A.Compose([A.HorizontalFlip(p=0.0), ToTensorV2()]),
              K.RandomHorizontalFlip(p=0.0)):
        assert same(epoch(packed["lmdb"], transform=t, **u8), plain), t
    assert same(epoch(packed["lmdb"], batch_transforms=[K.RandomHorizontalFlip(p=0.0)], **u8),
                plain)
    for out in (Output(), Output(channels_last=False), Output(dtype="float16")):
        # the batch operations' path (images in [0, 1], normalized after), with nothing to do
        kw = dict(KW, output=out, num_workers=0)
        ref = epoch(packed["lmdb"], batch_transforms=[RandomGrayscale(p=0.0)], **kw)
        got = feedpipe.make_loader(packed["lmdb"], 8, batch_transforms=[
            K.RandomHorizontalFlip(p=0.0)], **kw)
        b = next(iter(got))
        assert b["image"].is_contiguous(memory_format=torch.channels_last) == \
            ref[0]["image"].is_contiguous(memory_format=torch.channels_last)
        assert same(epoch(packed["lmdb"], batch_transforms=[K.RandomHorizontalFlip(p=0.0)],
                          **kw), ref)


def test_a_normalizing_transform_is_refused_by_name(packed):
    with pytest.raises(TransformError, match=r"values in \[.*\], not \[0, 1\].*Output\(mean="):
        list(feedpipe.make_loader(packed["lmdb"], 8, num_workers=0, transform=A.Normalize(),
                                  **KW))


# --- what cannot be adapted ---------------------------------------------------------------------
def test_what_cannot_be_adapted_is_a_config_error_naming_the_option(packed, faces):
    with pytest.raises(ConfigError, match=r"batch_transforms=albumentations\..*HorizontalFlip: "
                       r"albumentations transforms one H×W×C image .* pass it as transform=") \
            as exc:
        feedpipe.make_loader(packed["lmdb"], 8, batch_transforms=[A.HorizontalFlip()], **KW)
    assert exc.value.option == "batch_transforms"
    with pytest.raises(ConfigError, match=r"transform=albumentations.*needs an image field"):
        feedpipe.make_loader(faces, 8, fields=["landmarks"], transform=A.HorizontalFlip(),
                             device="cpu")
    ld = feedpipe.make_loader(faces, 8, fields=FACES, output=Output(ragged="list"),
                              device="cpu", num_workers=0,
                              batch_transforms=[K.RandomHorizontalFlip()])
    with pytest.raises(ConfigError, match="ragged='pad'"):
        next(iter(ld))


def test_import_feedpipe_imports_none_of_them():
    import subprocess

    code = ("import sys, feedpipe, feedpipe.loader.api, feedpipe.loader.foreign; "
            "print([m for m in sys.modules if m.split('.')[0] in "
            "('albumentations', 'kornia', 'torchvision', 'cv2')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# --- torchvision, where it imports --------------------------------------------------------------
@pytest.fixture(scope="module")
def v2():
    try:  # (a torchvision built for another torch fails with a RuntimeError)
        from torchvision.transforms import v2
    except Exception as exc:
        pytest.skip(f"torchvision does not import here ({type(exc).__name__}: {exc}); no "
                    "wheel is built for this torch")
    return v2


def test_torchvision_v2_is_seeded_and_moves_masks_keypoints_and_boxes(packed, faces, v2):
    kw = dict(KW, output=Output(dtype="uint8"), transform=v2.Compose(
        [v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4), v2.RandomRotation(10)]))
    ref = epoch(packed["lmdb"], num_workers=0, **kw)
    assert not same(ref, epoch(packed["lmdb"], num_workers=0, **dict(kw, transform=None)))
    assert same(epoch(packed["lmdb"], num_workers=2, **kw), ref)
    assert same(resumed(packed["lmdb"], 3, **kw), ref[3:])
    fk = dict(device="cpu", shuffle=False, fields=FACES, output=Output(dtype="uint8"),
              num_workers=0)
    for how in (dict(transform=v2.RandomHorizontalFlip(p=1.0)),
                dict(batch_transforms=[v2.RandomHorizontalFlip(p=1.0)],
                     fields=["image", "mask", "landmarks"])):
        for a, b in zip(epoch(faces, **fk), epoch(faces, **{**fk, **how}), strict=True):
            w = a["image"].shape[-1]
            assert torch.equal(b["image"], a["image"].flip(-1))
            assert torch.equal(b["mask"], a["mask"].flip(-1))
            assert torch.allclose(b["landmarks"][..., 0], w - a["landmarks"][..., 0], atol=1e-4)
            if "boxes" in b:
                assert torch.equal(b["boxes_labels"], a["boxes_labels"])
                assert torch.allclose(b["boxes"][..., 2], (w - a["boxes"][..., 0]) *
                                      (a["boxes"][..., 2] > 0), atol=1e-4)


def test_torchvision_v1_is_refused_by_name(packed, v2):
    from torchvision import transforms as v1

    with pytest.raises(ConfigError, match=r"transform=torchvision.*use its v2 counterpart"):
        feedpipe.make_loader(packed["lmdb"], 8, transform=v1.RandomHorizontalFlip(), **KW)
