"""make_loader(backend="dali") in DALI's CPU mode: the torch backend's contract, order and pixels.

The GPU graph is the same graph with the decoder on "mixed" and the rest on the GPU, so these
CPU-mode tests cover its structure; no GPU here. Real DALI pipelines, real files, real worker
processes (parallel external_source). Skipped only when DALI cannot be imported.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from feedpipe import Dali, Output, Sampler, Workers

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported; pip install "
                    "'feedpipe[test]'")  # CI installs nvidia-dali-cuda130 with [test]

from conftest import FORMATS, N_PHOTOS
from seg_helpers import write_shapes
from test_loader import _corrupt_dataset

import feedpipe
from converters import convert
from feedpipe.errors import ConfigError, CorruptRecordError, MissingDependencyError
from feedpipe.loader.api import DaliLoader, LoaderConfig, TorchLoader
from feedpipe.loader.config import IMAGENET_MEAN, IMAGENET_STD
from feedpipe.loader.dali import pipeline as dali_pipeline
from feedpipe.loader.dali.backend import DaliWdsLoader
from feedpipe.loader.dali.index import DaliIndex
from feedpipe.loader.sampler import World

CPU = torch.device("cpu")
U8 = dict(device="cpu", output=Output(dtype="uint8"))


def dali(path, batch_size, **kw):
    return feedpipe.make_loader(path, batch_size, **{"backend": "dali", **kw})


def torch_ld(path, batch_size, **kw):
    return feedpipe.make_loader(path, batch_size, backend="torch", num_workers=0, **kw)


def paths(batches) -> list[str]:
    return [p for b in batches for p in b["path"]]


def pixel_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """|a - b| of two uint8 N×3×H×W batches: (everything, without the 1-pixel border)."""
    d = (a.int() - b.int()).abs().numpy()
    return d, d[:, :, 1:-1, 1:-1]


@pytest.fixture(scope="module")
def raw48(tmp_path_factory, photo_dir) -> Path:
    """The photos stored decoded at 48×48 (LMDB, raw): DALI gets them without decoding."""
    out = tmp_path_factory.mktemp("raw") / "raw48"
    convert(photo_dir, out, to="lmdb", store="raw", resize=48, workers=0)
    return out


@pytest.fixture
def wds_copy(packed, copy_dataset) -> Path:
    """A private copy of the WebDataset shards: the native reader writes index files there."""
    return copy_dataset(packed["wds"])


@pytest.mark.parametrize("dtype,channels_last", [("float32", True), ("float16", False),
                                                 ("bfloat16", True), ("uint8", True)])
def test_output_contract(packed, dtype, channels_last):
    """Keys, dtypes, shapes, layout and normalization as the torch backend promises."""
    kw = dict(size=(40, 56), seed=1, device="cpu", fields=["image", "label", "path"])
    ld = dali(packed["lmdb"], 16, output=Output(dtype=dtype, channels_last=channels_last), **kw)
    assert isinstance(ld, DaliLoader) and len(ld) == 5
    batches = list(ld)
    assert [len(b["label"]) for b in batches] == [16] * 4 + [8]
    b = batches[0]
    assert list(b) == ["image", "label", "path"]
    x = b["image"]
    assert x.shape == (16, 3, 40, 56) and x.dtype == getattr(torch, dtype)
    assert x.is_contiguous(memory_format=torch.channels_last if channels_last
                           else torch.contiguous_format)
    assert b["label"].dtype == torch.int64 and isinstance(b["path"], list)
    ref = next(iter(torch_ld(packed["lmdb"], 16, output=Output(dtype=dtype, channels_last=channels_last),
                             **kw)))  # the torch backend's batch: same structure, field by field
    assert list(ref) == list(b) and ref["path"] == b["path"]
    for k in ("image", "label"):
        assert (b[k].dtype, b[k].shape, b[k].stride()) == (ref[k].dtype, ref[k].shape,
                                                           ref[k].stride())
    if dtype != "uint8":  # normalization of the very same pixels, done by hand
        raw = next(iter(dali(packed["lmdb"], 16, output=Output(dtype="uint8"),
                             **kw)))["image"].float()
        mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        tol = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
        torch.testing.assert_close(x.float(), (raw / 255 - mean) / std, atol=tol, rtol=0)
    plain = next(iter(dali(packed["lmdb"], 16, output=Output(dtype="float32", mean=None, std=None),
                           **kw)))
    raw = next(iter(dali(packed["lmdb"], 16, output=Output(dtype="uint8"), **kw)))["image"]
    torch.testing.assert_close(plain["image"], raw.float() / 255, atol=1e-6, rtol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_order_and_pixels_match_torch(packed, fmt):
    """Same seed → the torch backend's batches: labels and paths identical, images within the
    resize tolerance (see test_equivalence_tolerance), random crops and flips included."""
    kw = dict(size=48, crop="random_resized_crop", flip=True, seed=7,
              fields=["image", "label", "path"], **U8)
    got, ref = list(dali(packed[fmt], 10, **kw)), list(torch_ld(packed[fmt], 10, **kw))
    assert len(got) == len(ref) == 8
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a["label"], b["label"]) and a["path"] == b["path"]
        _, inner = pixel_diff(a["image"], b["image"])
        assert inner.max() <= 2, "a different crop window or flip than the torch backend's"


def test_equivalence_tolerance(packed):
    """Center crop, no flip: DALI's pixels against the torch backend's, measured.

    Both decode with libjpeg-turbo and cut the same box; they differ in the antialiased
    bilinear resize. Measured on these photos (160×120 → 64×64): interior max 1, mean 0.16
    levels. The outermost row/column differs more (up to ~15 levels at high-contrast edges):
    torch renormalizes the filter window clipped by the image border, DALI clamps to the edge
    pixel. Hence: interior ≤ 2, border ≤ 24, overall mean ≤ 0.5 levels.
    """
    kw = dict(size=64, seed=3, fields=["image", "label", "path"], **U8)
    got, ref = list(dali(packed["lmdb"], 12, **kw)), list(torch_ld(packed["lmdb"], 12, **kw))
    assert paths(got) == paths(ref)
    full = np.concatenate([pixel_diff(a["image"], b["image"])[0] for a, b in zip(got, ref, strict=True)])
    inner = full[:, :, 1:-1, 1:-1]
    assert inner.max() <= 2 and full.max() <= 24 and full.mean() <= 0.5
    assert full.max() > 0  # two different resizers: equality would mean one path was not taken


def test_raw_images_skip_decoding(raw48):
    """Raw-stored arrays: no decode; at their stored size the output equals the stored pixels."""
    kw = dict(seed=2, fields=["image", "label"], **U8)
    got = list(dali(raw48, 16, crop="none", **kw))
    ref = list(torch_ld(raw48, 16, crop="none", **kw))
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    got = list(dali(raw48, 16, size=32, crop="random_resized_crop", flip=True, **kw))
    ref = list(torch_ld(raw48, 16, size=32, crop="random_resized_crop", flip=True, **kw))
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a["label"], b["label"])
        assert pixel_diff(a["image"], b["image"])[1].max() <= 3


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("uneven,drop_last", [("pad", False), ("drop", True)])
def test_two_ranks(packed, fmt, uneven, drop_last):
    """World(0, 2) and World(1, 2): the torch backend's per-rank plan, equal batch counts."""
    kw = dict(size=32, seed=5, drop_last=drop_last, fields=["image", "path"], **U8)
    per_rank = []
    for rank in (0, 1):
        sampler = Sampler(World(rank, 2), uneven)
        ld = dali(packed[fmt], 8, sampler=sampler, **kw)
        got = list(ld)
        assert len(got) == len(ld)
        assert paths(got) == paths(torch_ld(packed[fmt], 8, sampler=sampler, **kw))
        per_rank.append(got)
    assert len(per_rank[0]) == len(per_rank[1]) > 0
    seen = set(paths(per_rank[0])) | set(paths(per_rank[1]))
    if uneven == "pad" and not drop_last:
        assert len(seen) == N_PHOTOS  # every sample, some twice (padding)
    else:
        assert len(seen) == sum(len(paths(g)) for g in per_rank)  # no duplicates


def test_set_epoch_reshuffles_deterministically(packed):
    kw = dict(size=32, crop="random_resized_crop", flip=True, seed=9,
              fields=["image", "path"], **U8)
    ld = dali(packed["hdf5"], 16, **kw)
    e0, e1 = list(ld), list(ld)  # a full pass advances the epoch, as with the torch backend
    assert sorted(paths(e0)) == sorted(paths(e1)) and paths(e0) != paths(e1)
    ld.set_epoch(0)
    again = list(ld)
    assert paths(again) == paths(e0)
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(again, e0, strict=True))
    ld.set_epoch(1)
    assert paths(list(ld)) == paths(e1)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch(packed, workers):
    """A new loader given state_dict() after 3 batches (taken after ``break``) yields exactly
    the uninterrupted tail; so does the torch backend (same order). The same loader iterated
    again after ``break`` starts the epoch over, as a torch DataLoader does."""
    kw = dict(size=32, crop="random_resized_crop", flip=True, seed=4, num_workers=workers,
              fields=["image", "label", "path"], **U8)
    ld = dali(packed["lmdb"], 8, **kw)
    ld.set_epoch(3)
    full = list(ld)
    ld.set_epoch(3)
    head = []
    for b in ld:
        head.append(b)
        if len(head) == 3:
            break
    state = ld.state_dict()
    assert state["epoch"] == 3 and state["batches"] == 3
    again = list(ld)  # same loader, after break: the whole epoch 3 again
    assert paths(again) == paths(full) and ld.state_dict()["epoch"] == 4
    fresh = dali(packed["lmdb"], 8, **kw)
    fresh.load_state_dict(state)
    resumed = list(fresh)
    assert len(resumed) == len(full) - 3
    for a, b in zip(resumed, full[3:], strict=True):
        assert a["path"] == b["path"] and torch.equal(a["image"], b["image"])
    other = torch_ld(packed["lmdb"], 8, **{k: v for k, v in kw.items() if k != "num_workers"})
    other.load_state_dict(state)
    assert paths(list(other)) == paths(full[3:])
    assert fresh.state_dict()["epoch"] == 4


def test_parallel_readers_match_main_thread(packed):
    """num_workers=2 runs the plan callback in DALI's forked reader processes: same batches."""
    kw = dict(size=32, crop="random_resized_crop", flip=True, seed=8, fields=["image", "label"],
              **U8)
    ref = list(dali(packed["wds"], 10, num_workers=0, **kw))
    before = {p.pid for p in psutil.Process().children()}
    ld = dali(packed["wds"], 10, num_workers=2, workers=Workers(multiprocessing_context="fork"),
              **kw)
    peek = next(iter(ld))
    assert len({p.pid for p in psutil.Process().children()} - before) == 2  # the reader workers
    got = list(ld)  # a new iteration: the epoch from its first batch again
    assert len(got) == len(ref) == 8
    assert torch.equal(peek["image"], ref[0]["image"])
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["image"], b["image"])


def test_corrupt_jpeg_names_the_record(tmp_path):
    root = _corrupt_dataset(tmp_path / "bad", {7, 21})
    with pytest.raises(CorruptRecordError, match="key 000000007"):
        list(dali(root, 8, size=32, shuffle=False, **U8))


def test_requests_dali_cannot_serve(packed, tmp_path):
    with pytest.raises(ConfigError, match="on_error='skip' needs backend='torch'"):
        dali(packed["lmdb"], 8, size=32, workers=Workers(on_error="skip"), **U8)
    with pytest.raises(ConfigError, match="dali_reader='webdataset' reads WebDataset"):
        dali(packed["lmdb"], 8, size=32, backend=Dali(reader="webdataset"), **U8)
    with pytest.raises(ConfigError, match="varying size"):
        dali(packed["lmdb"], 8, **U8)
    images, masks = write_shapes(tmp_path / "seg", [(40, 30)] * 3, seed=0)
    convert(images, tmp_path / "seg.lmdb", to="lmdb", masks=masks, workers=0)
    with pytest.raises(ConfigError, match="masks or targets"):
        dali(tmp_path / "seg.lmdb", 2, size=16, fields=["image", "mask"], **U8)
    with pytest.raises(ConfigError, match="hw_decoder_load"):
        LoaderConfig(batch_size=2, backend=Dali(hw_decoder_load=1.5))
    with pytest.raises(ConfigError, match="'fork' or 'spawn': use one of those"):
        dali(packed["lmdb"], 8, size=32, num_workers=1,
             workers=Workers(multiprocessing_context="forkserver"), **U8)


def test_missing_dali_names_the_wheel(packed, monkeypatch):
    """The import seam points at a module that does not exist: a real ImportError."""
    monkeypatch.setattr(dali_pipeline, "DALI_MODULE", "nvidia.dali_not_installed")
    monkeypatch.setattr(dali_pipeline, "driver_cuda", lambda: None)
    assert not dali_pipeline.dali_installed()
    with pytest.raises(MissingDependencyError) as exc:
        dali(packed["lmdb"], 8, size=32, **U8)
    cuda = torch.version.cuda
    pkg = "nvidia-dali-cuda120" if cuda and int(cuda.split(".")[0]) <= 12 else "nvidia-dali-cuda130"
    assert pkg in str(exc.value) and f"feedpipe[{pkg[7:]}]" in str(exc.value)
    assert dali_pipeline.dali_package("12.4")[0] == "nvidia-dali-cuda120"
    assert dali_pipeline.dali_package("13.0")[0] == "nvidia-dali-cuda130"
    assert dali_pipeline.dali_package(None, lambda: "12.8")[0] == "nvidia-dali-cuda120"
    assert dali_pipeline.dali_package(None, lambda: None)[0] == "nvidia-dali-cuda130"
    # backend="auto" never needs DALI: with it missing, loading goes on with the torch backend
    assert isinstance(feedpipe.make_loader(packed["lmdb"], 8, size=32, **U8), TorchLoader)


def test_auto_backend_is_torch_until_a_gpu_run_shows_dali_feeds_more(packed):
    """backend="auto" is the torch backend on any machine (DALI has yet to feed a training step
    faster in a GPU run, benchmarks/RESULTS.md); asked for by name, DALI is used."""
    ld = feedpipe.make_loader(packed["lmdb"], 8, size=32, **U8)
    assert isinstance(ld, TorchLoader) and ld.describe().backend == "torch"
    assert isinstance(dali(packed["lmdb"], 8, size=32, **U8), DaliLoader)


def test_dali_index_files(wds_copy, tmp_path, monkeypatch, caplog):
    """One index per shard, byte for byte what DALI's own wds2idx writes, reused while fresh,
    rewritten (with a warning) when damaged, kept in the user's cache when the dataset refuses."""
    from wds2idx import IndexCreator  # installed with DALI: the reference implementation

    reader = feedpipe.open_dataset(wds_copy)
    idx = DaliIndex(reader).paths()
    assert [p.name for p in idx] == [s.replace(".tar", ".idx") for s in reader.shards]
    for p, shard in zip(idx, reader.shards, strict=True):
        ref = wds_copy / f"ref-{p.name}"
        with IndexCreator(str(wds_copy / shard), str(ref), verbose=False) as ic:
            ic.create_index()
        assert p.read_text() == ref.read_text()
    assert not list(wds_copy.glob(".*.idx.*"))  # no temporary files left behind
    stamp = idx[0].stat().st_mtime_ns
    assert DaliIndex(reader).paths() == idx and idx[0].stat().st_mtime_ns == stamp
    good = idx[1].read_text()
    for damaged in ("v1.2 3\n", good[:len(good) // 2]):  # another count; cut short
        idx[1].write_text(damaged)
        caplog.clear()
        with caplog.at_level("WARNING", logger="feedpipe.formats"):
            assert DaliIndex(reader).paths() == idx
        assert idx[1].read_text() == good and "is damaged" in caplog.text
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    idx[0].unlink()
    idx[0].mkdir()  # the index cannot be written next to its shard
    moved = DaliIndex(reader).paths()
    assert moved[1:] == idx[1:] and moved[0].parent == tmp_path / "xdg" / "feedpipe" / "dali-index"
    assert moved[0].read_text() == (wds_copy / f"ref-{idx[0].name}").read_text()
    assert DaliIndex(reader).paths() == moved and not list(wds_copy.glob(".*.tmp"))


def test_native_webdataset_reader(wds_copy):
    """dali_reader="webdataset": DALI's order (documented), but every sample once per epoch
    across ranks, equal per-rank batch counts, labels that belong to their images, a
    deterministic set_epoch and resume from a DALI checkpoint."""
    src = feedpipe.open_dataset(wds_copy)
    truth = {s["path"]: s["label"] for s in src}
    kw = dict(size=32, crop="random_resized_crop", flip=True, seed=3,
              fields=["image", "label", "path"], backend=Dali(reader="webdataset"), **U8)
    runs = []
    for rank in (0, 1):
        ld = dali(wds_copy, 10, sampler=Sampler(world=World(rank, 2)), **kw)
        assert isinstance(ld, DaliWdsLoader)
        got = list(ld)
        assert len(got) == len(ld) == 4  # 36 samples per rank: 10, 10, 10, 6
        runs.append(got)
        for b in got:
            assert b["label"].tolist() == [truth[p] for p in b["path"]]
    assert sorted(paths(runs[0]) + paths(runs[1])) == sorted(truth)
    ld = dali(wds_copy, 8, **kw)
    e0, e1 = list(ld), list(ld)
    assert paths(e0) != paths(e1) and sorted(paths(e0)) == sorted(paths(e1))
    ld.set_epoch(0)
    assert paths(list(ld)) == paths(e0)
    ld.set_epoch(1)
    head = []
    for b in ld:
        head.append(b)
        if len(head) == 4:
            break
    state = ld.state_dict()
    assert state["dali_reader"] == "webdataset" and state["dali_checkpoint"]
    assert paths(list(ld)) == paths(e1)  # after break, a new iteration starts epoch 1 over
    fresh = dali(wds_copy, 8, **kw)
    fresh.load_state_dict(state)
    tail = list(fresh)
    assert paths(tail) == paths(e1[4:])
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(tail, e1[4:], strict=True))
    with pytest.raises(ValueError, match="dali_reader"):
        dali(wds_copy, 8, **{**kw, "backend": Dali(reader="plan")}).load_state_dict(state)
