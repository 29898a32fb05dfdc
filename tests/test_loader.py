"""make_loader (torch backend): order, workers, resume, decode correctness, errors, memory."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from fp_helpers import free_port
from PIL import Image

import feedpipe
from feedpipe import Output, Sampler, Workers
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.dataset.registry import WRITERS
from feedpipe.errors import ConfigError, CorruptRecordError
from feedpipe.loader.config import auto_workers, usable_cores
from feedpipe.loader.sampler import World
from feedpipe.schema.fields import ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema

FORMATS = ("lmdb", "hdf5", "wds")
U8 = dict(device="cpu", output=Output(dtype="uint8"))


def labels_and_paths(loader) -> tuple[list[int], list[str]]:
    labels, paths = [], []
    for b in loader:
        labels += b["label"].tolist()
        paths += b["path"]
    return labels, paths


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_same_batches_whatever_workers(packed, fmt, ctx):
    """Same seed and epoch → the same batches (images included) with 0 or 2 workers."""
    kw = dict(size=48, crop="random_resized_crop", flip=True, seed=5, fields=["image", "label"],
              **U8)
    ref = list(feedpipe.make_loader(packed[fmt], 10, num_workers=0, **kw))
    got = list(feedpipe.make_loader(packed[fmt], 10, num_workers=2,
                                    workers=Workers(multiprocessing_context=ctx), **kw))
    assert len(ref) == len(got) == 8  # 72 samples, batch 10, last partial kept
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a["label"], b["label"])
        assert torch.equal(a["image"], b["image"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_epochs_shuffle_deterministically(packed, fmt):
    kw = dict(size=32, fields=["label", "path"], num_workers=0, seed=1, **U8)
    ld = feedpipe.make_loader(packed[fmt], 8, **kw)
    e0 = labels_and_paths(ld)[1]
    e1 = labels_and_paths(ld)[1]  # a full pass advances the epoch
    assert sorted(e0) == sorted(e1) and e0 != e1
    ld.set_epoch(0)
    assert labels_and_paths(ld)[1] == e0
    other = feedpipe.make_loader(packed[fmt], 8, **{**kw, "seed": 2})
    assert labels_and_paths(other)[1] != e0
    plain = feedpipe.make_loader(packed[fmt], 8, **{**kw, "shuffle": False})
    assert labels_and_paths(plain)[1] == [feedpipe.open_dataset(packed[fmt])[i]["path"]
                                          for i in range(72)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch(packed, fmt, workers):
    kw = dict(size=32, num_workers=workers, seed=4, fields=["image", "label"], **U8)
    ld = feedpipe.make_loader(packed[fmt], 8, **kw)
    ld.set_epoch(3)
    full = list(ld)
    ld2 = feedpipe.make_loader(packed[fmt], 8, **kw)
    ld2.set_epoch(3)
    it = iter(ld2)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(ld2.state_dict()))  # survives a checkpoint file
    fresh = feedpipe.make_loader(packed[fmt], 8, **kw)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert len(rest) == len(full) - 4
    for a, b in zip(rest, full[4:], strict=True):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["image"], b["image"])
    with pytest.raises(ValueError, match="seed"):
        feedpipe.make_loader(packed[fmt], 8, **{**kw, "seed": 9}).load_state_dict(state)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_rank_partition(packed, fmt, uneven):
    """5 ranks over 72 samples: disjoint (drop) or covering (pad), always equal batch counts."""
    per_rank, counts = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rank in range(5):
            ld = feedpipe.make_loader(packed[fmt], 4, fields=["path"], num_workers=0,
                                      sampler=Sampler(world=World(rank, 5), uneven=uneven), **U8)
            paths = [p for b in ld for p in b["path"]]
            per_rank.append(paths)
            counts.append(len(ld))
            assert len([b for b in ld]) == len(ld)
    assert len(set(counts)) == 1
    flat = [p for r in per_rank for p in r]
    if uneven == "drop":
        assert len(flat) == len(set(flat)) == 70  # 72 // 5 * 5
    else:
        assert set(flat) == {feedpipe.open_dataset(packed[fmt])[i]["path"] for i in range(72)}


def test_torchrun_ddp_gloo(packed, tmp_path):
    """Real torchrun, 2 processes, gloo: ranks see disjoint samples covering the dataset."""
    script = Path(__file__).with_name("ddp_probe.py")
    for fmt in ("lmdb", "wds"):
        out = tmp_path / fmt
        out.mkdir()
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                            "2", "--master-port", str(free_port()), str(script),
                            str(packed[fmt]), str(out)],
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        ranks = [json.loads((out / f"rank{k}.json").read_text()) for k in range(2)]
        n = ranks[0]["batches"]
        assert ranks[1]["batches"] == n and ranks[0]["all_batches"] == [n, n]
        if fmt == "lmdb":
            assert n == 9  # ceil(36 / 4); wds deals whole shards, padded to the longer rank
        assert ranks[0]["world"] == [0, 2] and ranks[1]["world"] == [1, 2]
        a, b = set(ranks[0]["paths"]), set(ranks[1]["paths"])
        assert not a & b and len(a | b) == 72


def test_decode_matches_pil(packed):
    """Center crop + antialiased bilinear resize agrees with a plain PIL pipeline."""
    ds = feedpipe.open_dataset(packed["lmdb"])
    ld = feedpipe.make_loader(packed["lmdb"], 12, size=64, shuffle=False, num_workers=0,
                              fields=["image"], **U8)
    batch = next(iter(ld))["image"].permute(0, 2, 3, 1).numpy()
    for i in range(12):
        img = Image.open(io.BytesIO(ds.read_raw(i)["image"])).convert("RGB")
        w, h = img.size
        c = min(w, h)
        ref = np.asarray(img.resize((64, 64), Image.BILINEAR,
                                    box=((w - c) // 2, (h - c) // 2, (w - c) // 2 + c,
                                         (h - c) // 2 + c)))
        diff = np.abs(batch[i].astype(int) - ref)
        assert diff.mean() < 2.5, diff.mean()


def test_normalization_and_layout(packed):
    ld = feedpipe.make_loader(packed["hdf5"], 6, size=40, device="cpu", num_workers=0,
                              shuffle=False, output=Output(channels_last=False))
    u8 = feedpipe.make_loader(packed["hdf5"], 6, size=40, shuffle=False, num_workers=0, **U8)
    x, ref = next(iter(ld))["image"], next(iter(u8))["image"].float()
    assert x.dtype == torch.float32 and x.is_contiguous()
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    assert torch.allclose(x, (ref - mean) / std, atol=1e-4)
    half = feedpipe.make_loader(packed["hdf5"], 6, size=40, num_workers=0, device="cpu",
                                output=Output(dtype="bfloat16", mean=None, std=None))
    y = next(iter(half))["image"]
    assert y.dtype == torch.bfloat16 and 0 <= y.min() and y.max() <= 1


def _corrupt_dataset(root: Path, bad: set[int]) -> Path:
    schema = Schema((ImageField("image", "jpeg"), LabelField("label"), JsonField("path")))
    good = io.BytesIO()
    Image.fromarray(np.full((40, 50, 3), 90, np.uint8)).save(good, "JPEG")
    w = WRITERS["lmdb"](root, schema)
    for i in range(40):
        data = good.getvalue()[:300] if i in bad else good.getvalue()
        w.write({"image": data, "label": i, "path": f"img{i}.jpg"})
    files, extra = w.close()
    Manifest("lmdb", 40, schema, files=tuple(FileEntry.of(root, f) for f in files)).write(root)
    return root


@pytest.mark.parametrize("workers", [0, 1])  # torch takes ~5 s per worker to shut down after
def test_on_error(tmp_path, workers):
    root = _corrupt_dataset(tmp_path / "bad", {7, 21})
    kw = dict(size=32, shuffle=False, num_workers=workers, **U8)
    with pytest.raises(CorruptRecordError) as exc:
        list(feedpipe.make_loader(root, 8, **kw))
    msg = str(exc.value)
    assert str(root) in msg and "key 000000007" in msg
    assert exc.value.key == "000000007" and exc.value.dataset == root  # also from a worker
    if workers:  # the worker's traceback is kept, as a note
        assert "DataLoader worker" in "".join(exc.value.__notes__)
    ld = feedpipe.make_loader(root, 8, workers=Workers(on_error="skip"), **kw)
    with pytest.warns(UserWarning, match="skipped 2 corrupt"):
        batches = list(ld)
    assert [len(b["label"]) for b in batches] == [8] * 5
    labels = torch.cat([b["label"] for b in batches]).tolist()
    assert 7 not in labels and 21 not in labels and len(ld.skipped) == 2


@pytest.mark.parametrize("bug", [TypeError("a transform got a str"), KeyError("image"),
                                 ConfigError("size=3: a bad option")])
def test_a_bug_while_filling_a_sample_propagates_under_skip(tmp_path, monkeypatch, bug):
    """on_error="skip" replaces damaged records only: a bug in the decode step (a TypeError from a
    transform) or a bad option raised while filling a sample is raised as itself; it used to be
    turned into CorruptRecordError, every sample refilled until "16 substitutes in a row"."""
    from feedpipe.loader.transforms import ImageOp

    root = _corrupt_dataset(tmp_path / "bad", {7})
    calls = []

    def buggy(self, *args, **kw):
        calls.append(1)
        raise bug

    monkeypatch.setattr(ImageOp, "apply", buggy)
    ld = feedpipe.make_loader(root, 8, size=32, shuffle=False, num_workers=0,
                              workers=Workers(on_error="skip"), **U8)
    with pytest.raises(type(bug)) as exc:
        next(iter(ld))
    assert exc.value is bug and len(calls) == 1 and not ld.skipped


def test_worker_memory_is_stable(packed):
    """Persistent workers do not grow by copy-on-write over epochs (index data is numpy)."""
    psutil = pytest.importorskip("psutil")
    ld = feedpipe.make_loader(packed["wds"], 8, size=32, num_workers=2, **U8)
    rss = []
    for _ in range(5):
        for _ in ld:
            pass
        kids = psutil.Process().children(recursive=True)
        rss.append(sum(k.memory_info().rss for k in kids))
    assert rss[4] <= rss[0] * 1.10 + (8 << 20), rss


def test_config_errors(packed):
    """A bad option is refused naming it, an option group's when the group is built."""
    p = packed["lmdb"]
    for kwargs, hint in [(lambda: dict(batch_size=0), "positive"),
                         (lambda: dict(num_workers=-1), "num_workers"),
                         (lambda: dict(crop="bogus"), "center_crop"),
                         (lambda: dict(output=Output(dtype="int7")), "float16"),
                         (lambda: dict(output=Output(mean=(0.5, 0.5))), "three"),
                         (lambda: dict(output=Output(std=None)), "together"),
                         (lambda: dict(crop="resize", size=None), "pass size="),
                         (lambda: dict(workers=Workers(on_error="ignore")), "skip"),
                         (lambda: dict(fields=["nope"]), "not in the dataset")]:
        with pytest.raises(ConfigError, match=hint):
            feedpipe.make_loader(p, **{"batch_size": 4, "size": 32, **kwargs()})


def test_auto_workers_heuristic(monkeypatch):
    assert auto_workers(True, cores=8, local_procs=1) == 8
    assert auto_workers(True, cores=8, local_procs=4) == 2
    assert auto_workers(True, cores=2, local_procs=4) == 1
    # raw (decode-free) data: workers too, at most RAW_WORKERS (memory-bound; 2 measured faster
    # than in-process, benchmarks/bench_kernel.py --groups raw)
    assert auto_workers(False, cores=8, local_procs=1) == 2
    assert auto_workers(False, cores=2, local_procs=1) == 2
    assert auto_workers(False, cores=2, local_procs=2) == 1
    assert auto_workers(False, cores=1) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert auto_workers(True, cores=8) == 4


def test_raw_store_loads_exact_pixels(tmp_path, photo_dir):
    from converters import convert

    out = tmp_path / "raw"
    convert(photo_dir, out, to="lmdb", store="raw", resize=40, workers=0)
    ds = feedpipe.open_dataset(out)
    ld = feedpipe.make_loader(out, 9, size=40, crop="none", shuffle=False, **U8)
    assert ld.config.num_workers == min(usable_cores(), 2)  # "auto" on raw data
    imgs = torch.cat([b["image"] for b in ld]).permute(0, 2, 3, 1).numpy()
    assert all(np.array_equal(imgs[i], ds[i]["image"]) for i in range(len(ds)))


def test_wds_fewer_shards_than_ranks_warns(tmp_path, photo_dir):
    from converters import convert

    out = tmp_path / "one"
    convert(photo_dir, out, to="wds", workers=0)
    with pytest.warns(UserWarning, match="splitting by sample"):
        ld = feedpipe.make_loader(out, 4, size=32, fields=["label"],
                                  num_workers=0, sampler=Sampler(world=World(1, 3)), **U8)
        assert len(ld) == 6
    shutil.rmtree(out)


def test_dct_downscale_stays_close_to_full_resolution(tmp_path):
    """Large sources take the DCT 1/2-1/8 path: the simplejpeg and Pillow(-SIMD) paths agree, and
    neither strays further from a full-resolution resize than Pillow's own draft+resize."""
    from converters import convert
    from converters.synth import make_photos
    from feedpipe.loader.transforms import ImageOp

    make_photos(tmp_path / "big", 6, size=(640, 480), classes=2, seed=3)
    convert(tmp_path / "big", tmp_path / "ds", to="lmdb", workers=0)
    ds = feedpipe.open_dataset(tmp_path / "ds")
    op = ImageOp((48, 48), "center_crop")
    for i in range(len(ds)):
        data = ds.read_raw(i)["image"]
        img = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = img.size
        assert op._dct_factor(h, h, (48, 48)) >= 2
        c = min(w, h)
        ref = np.asarray(img.resize((48, 48), Image.BILINEAR, box=((w - c) // 2, (h - c) // 2,
                                                                   (w - c) // 2 + c,
                                                                   (h - c) // 2 + c)))
        a, b = np.empty((48, 48, 3), np.uint8), np.empty((48, 48, 3), np.uint8)
        op.apply(data, "jpeg", a, None, "t")
        op._apply_pil(data, b, None)
        # as close to the full-resolution resize as Pillow's own draft+resize (reducing_gap=2)
        assert np.abs(a.astype(int) - ref).mean() <= np.abs(b.astype(int) - ref).mean() + 0.5
        assert np.abs(a.astype(int) - b).mean() < 1
