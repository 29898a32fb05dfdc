"""``make_loader(..., transform=fn)``: the user's per-sample function in the workers, after
feedpipe's decode and geometry, writing into the batch being filled; seeded per sample, so
batches are the same for any ``num_workers`` and resume exactly; its errors named, never skipped.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import N_PHOTOS
from test_writers import write_dataset

import feedpipe
from feedpipe import Output, Workers
from feedpipe.errors import ConfigError, TransformError
from feedpipe.loader.memory import FEED_DEPTH
from feedpipe.schema import ImageField, Schema, TextField

KW = dict(size=24, seed=3, device="cpu", crop="random_resized_crop", flip=True,
          output=Output(dtype="uint8"))


def noisy(sample, rng):
    """A RandAugment-like op: per-sample random brightness shift and an inverted channel."""
    img = sample["image"]  # C×H×W uint8, a view of the batch row
    shift = int(rng.integers(-40, 40))
    img.copy_((img.to(torch.int16) + shift).clamp(0, 255).to(torch.uint8))
    img[int(rng.integers(0, 3))] = 255 - img[int(rng.integers(0, 3))]


#: batches the feed engine makes ahead of those handed out, in-process (engine.py)
AHEAD = FEED_DEPTH + 1


def epoch(path, **kw):
    return [{k: v.clone() for k, v in b.items()} for b in feedpipe.make_loader(path, 8, **kw)]


@pytest.fixture(scope="module")
def reference(packed):
    return epoch(packed["lmdb"], transform=noisy, num_workers=0, **KW)


def test_same_batches_for_any_workers_and_runs(packed, reference):
    plain = epoch(packed["lmdb"], num_workers=0, **KW)
    assert any(not torch.equal(a["image"], b["image"]) for a, b in zip(reference, plain, strict=True))
    for workers in (0, 2):
        again = epoch(packed["lmdb"], transform=noisy, num_workers=workers, **KW)
        assert len(again) == len(reference)
        for a, b in zip(again, reference, strict=True):
            assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])


def test_resume_is_exact(packed, reference):
    ld = feedpipe.make_loader(packed["lmdb"], 8, transform=noisy, num_workers=2, **KW)
    it = iter(ld)
    for _ in range(3):
        next(it)
    state = ld.state_dict()
    again = feedpipe.make_loader(packed["lmdb"], 8, transform=noisy, num_workers=0, **KW)
    again.load_state_dict(state)
    rest = [b["image"].clone() for b in again]
    assert len(rest) == len(reference) - 3
    assert all(torch.equal(a, b["image"]) for a, b in zip(rest, reference[3:], strict=True))


def test_returned_values_and_in_place_edits(packed):
    def red_off_and_relabel(sample, rng):
        sample["image"][0] = 0  # in place
        return {"label": torch.tensor(7)}  # returned

    for workers in (0, 2):
        for b in feedpipe.make_loader(packed["hdf5"], 8, transform=red_off_and_relabel,
                                      num_workers=workers, **KW):
            assert not b["image"][:, 0].any() and b["image"][:, 1].any()
            assert (b["label"] == 7).all()


@pytest.mark.parametrize("on_error,workers", [("raise", 0), ("skip", 0), ("raise", 2)])
def test_an_error_names_the_sample_and_is_never_skipped(packed, on_error, workers):
    """Named by key and source file, the user's exception its cause: also from a worker process
    (where DataLoader alone would re-raise the type and the traceback's text only)."""
    def fails_on_one(sample, rng):
        if int(sample["label"]) == 2 and rng.random() < 2:  # every sample of class 2
            raise KeyError("my bug")

    ld = feedpipe.make_loader(packed["lmdb"], 8, transform=fails_on_one, num_workers=workers,
                              workers=Workers(on_error=on_error), **KW)
    with pytest.raises(TransformError, match=r"transform failed on sample \d+ \(from .*\.jpg\)"
                       r": KeyError: 'my bug'") as exc:
        list(ld)
    err = exc.value
    assert isinstance(err.__cause__, KeyError) and err.__cause__.args == ("my bug",)
    assert err.key is not None and f"sample {err.key} (from {err.file})" in str(err)
    assert str(err.file).endswith(".jpg") and err.dataset == packed["lmdb"]
    assert int(feedpipe.open_dataset(packed["lmdb"]).get_batch([int(err.key)])[0]["label"]) == 2
    notes = "".join(getattr(err, "__notes__", []))
    assert ("DataLoader worker process" in notes and "fails_on_one" in notes) == bool(workers)
    assert ld.skipped == []


@pytest.mark.parametrize("workers", [0, 2])
def test_a_key_it_was_not_given_is_refused_with_the_nearest(packed, workers):
    """A returned key that is no field of the sample (a typo), or one added to the sample in
    place, is refused by name with the nearest field, never silently dropped."""
    def typo(sample, rng):
        return {"imgae": sample["image"] // 2}

    def added(sample, rng):
        sample["lable"] = sample["label"] + 1

    for fn, name, near in ((typo, "imgae", "image"), (added, "lable", "label")):
        ld = feedpipe.make_loader(packed["lmdb"], 8, transform=fn, num_workers=workers, **KW)
        with pytest.raises(TransformError, match=rf"returned '{name}', which is not one of the "
                           rf"fields it was given \['image', 'label'\] \(did you mean "
                           rf"'{near}'\?\)") as exc:
            list(ld)
        assert exc.value.key is not None


def test_a_field_collated_after_it_runs_is_refused(tmp_path):
    """Text is collated for the whole batch after transform= runs, and not given to it:
    returning it is refused (it would be overwritten), pointing to batch_transforms.
    (Keypoints and boxes are given, and may change: tests/test_augment_libs.py.)"""
    schema = Schema((ImageField("image", "raw", (24, 24, 3)), TextField("text")))
    rng = np.random.default_rng(0)
    path = write_dataset("lmdb", tmp_path / "txt", [
        {"image": rng.integers(0, 255, (24, 24, 3), np.uint8), "text": b"ab"}
        for _ in range(4)], schema)

    def rewrites_text(sample, rng):
        return {"text": "zz"}

    with pytest.raises(TransformError, match="returned 'text': keypoints, boxes.*batch_transforms"):
        list(feedpipe.make_loader(path, 4, fields=["image", "text"], transform=rewrites_text,
                                  num_workers=0, **KW))


def test_a_wrong_shape_or_dtype_is_refused_by_name(packed):
    def hwc_float(sample, rng):
        return {"image": sample["image"].permute(1, 2, 0).float()}

    with pytest.raises(TransformError, match=r"returned 'image' as torch.float32 \(24, 24, 3\)"):
        list(feedpipe.make_loader(packed["lmdb"], 8, transform=hwc_float, num_workers=0, **KW))


def test_refused_where_it_cannot_run(packed):
    with pytest.raises(ConfigError, match="transform="):
        feedpipe.make_loader(packed["lmdb"], 8, transform="not callable", **KW)
    with pytest.raises(ConfigError, match="decode_on='device'"):
        feedpipe.make_loader(packed["lmdb"], 8, transform=noisy,
                             workers=Workers(decode_on="device"), **KW)
    with pytest.raises(ConfigError, match="DALI"):
        feedpipe.make_loader(packed["lmdb"], 8, transform=noisy, backend="dali", **KW)


def test_numpy_users_get_views_too(packed):
    """A numpy function works on ``sample["image"].numpy()`` (a view: edits land in the batch)."""
    def invert(sample, rng):
        arr = sample["image"].numpy()
        np.subtract(255, arr, out=arr)

    plain = epoch(packed["lmdb"], num_workers=0, **KW)
    inverted = epoch(packed["lmdb"], transform=invert, num_workers=0, **KW)
    assert all(torch.equal(255 - a["image"], b["image"]) for a, b in zip(plain, inverted, strict=True))


def test_sample_streams_are_their_own_and_cheap(monkeypatch):
    """Per (seed, epoch, sample) its own reproducible stream, from the seed's Philox key and a
    counter: no SeedSequence hashed per sample (~90 µs each, the same order as a user's whole
    light augmentation)."""
    from feedpipe.loader import order

    draws = {(s, e, i): order.sample_rng(s, e, i).random(4).tolist()
             for s in (0, 1) for e in (0, 1, 2) for i in (0, 1, 2**40)}
    assert len({tuple(v) for v in draws.values()}) == len(draws)
    assert order.sample_rng(1, 2, 2**40).random(4).tolist() == draws[(1, 2, 2**40)]
    hashed = []
    real = np.random.SeedSequence
    monkeypatch.setattr(np.random, "SeedSequence", lambda *a, **k: hashed.append(1) or real(*a, **k))
    order.sample_rng(0, 5, 7)
    order.sample_rng(0, 5, 8)
    assert not hashed



def test_sample_generators_are_reset_not_rebuilt_and_a_kept_one_is_left_alone(packed,
                                                                               monkeypatch):
    """One process's samples share a generator whose Philox state is set per sample (building
    a Philox drew OS entropy and cost ~30 µs a sample in the workers), with the draws of a fresh
    ``sample_rng``; a generator the function keeps is never reset under it: the next sample
    gets a new one."""
    from feedpipe.loader import order

    built: list[int] = []
    real = np.random.Philox
    monkeypatch.setattr(np.random, "Philox", lambda *a, **k: built.append(1) or real(*a, **k))
    draws: list[list[float]] = []
    kw = dict(KW, shuffle=False)  # sample i is the i-th transformed

    def draw(sample, rng):
        draws.append(rng.random(3).tolist())

    batches = len(epoch(packed["lmdb"], transform=draw, num_workers=0, **kw))
    n = N_PHOTOS  # the epoch's samples (the feed engine may have made the next epoch's first)
    assert len(draws) >= n > batches > 1
    # a generator per batch (those made ahead too), the epochs' orders, one shared
    assert len(built) <= batches + AHEAD + 3
    monkeypatch.setattr(np.random, "Philox", real)
    assert draws[:n] == [order.sample_rng(3, 0, i).random(3).tolist() for i in range(n)]

    kept: list[np.random.Generator] = []

    def keep(sample, rng):
        rng.random(3)
        kept.append(rng)

    epoch(packed["lmdb"], transform=keep, num_workers=0, **kw)
    assert len({id(g) for g in kept}) == len(kept) >= n
    assert [g.random(2).tolist() for g in kept[:n]] == \
        [order.sample_rng(3, 0, i).random(5)[3:].tolist() for i in range(n)]


def test_the_function_runs_after_the_batch_is_decoded(packed, monkeypatch):
    """transform= runs on each sample once the whole batch is decoded, in batch order: run
    between decodes, the function and the decoder evicted each other's code and data from the
    caches (the function ran ~12% slower than on its own); the batches are the same."""
    from feedpipe.loader.transforms import ImageOp

    log: list[str] = []
    real = ImageOp.apply
    monkeypatch.setattr(ImageOp, "apply", lambda self, *a, **k: (log.append("d"),
                                                                  real(self, *a, **k))[1])

    def mark(sample, rng):
        log.append("t")
        noisy(sample, rng)

    got = epoch(packed["lmdb"], transform=mark, num_workers=0, **KW)
    sizes = [len(b["image"]) for b in got]
    want = "".join("d" * n + "t" * n for n in sizes)
    seen = "".join(log)  # then the batches the feed engine made ahead, each the same way
    assert seen.startswith(want) and re.fullmatch(r"(d{8}t{8})*", seen[len(want):])
    ref = epoch(packed["lmdb"], transform=noisy, num_workers=2, **KW)
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, ref, strict=True))
