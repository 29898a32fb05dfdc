"""The feed engine (feedpipe/loader/position.py): the training thread only takes finished batches,
the workers go on across epoch boundaries, a slot is never reused while a batch holds it, and
another position drops what was made ahead. Real DataLoader workers, real files, on the CPU."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import numpy as np
import psutil
import pytest
import simplejpeg
import torch

import feedpipe
from feedpipe import Output, Workers
from feedpipe.loader.api import LoaderConfig, TorchLoader, resolve
from feedpipe.loader.memory import FEED_DEPTH
from feedpipe.loader.sampler import World
from feedpipe.loader.torch.backend import SlotRing
from feedpipe.loader.torch.device_decode import DeviceDecoder

F32 = dict(size=32, device="cpu", crop="random_resized_crop", flip=True, seed=5,
           output=Output(dtype="float32"))


def cpu_decode(files: list[torch.Tensor]) -> list[torch.Tensor]:
    """Stands in for batched nvJPEG (as tests/test_device_decode.py)."""
    return [torch.from_numpy(simplejpeg.decode_jpeg(f.numpy(), colorspace="RGB")).permute(2, 0, 1)
            for f in files]


def device_decoded(path, batch: int, **kw) -> TorchLoader:
    reader = feedpipe.open_dataset(path)
    cfg = resolve(LoaderConfig(batch, workers=Workers(decode_on="device"), **kw), reader)
    cpu = torch.device("cpu")
    return TorchLoader(reader, cfg, World(0, 1), cpu,
                       DeviceDecoder(cpu, cpu_decode))


def calls_in_next(it, n: int) -> tuple[list[str], list[str]]:
    """The Python functions and the C functions this thread calls inside ``next(it)``, n times."""
    py: list[str] = []
    c: list[str] = []

    def hook(frame, event, arg):
        if event == "call":
            py.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "c_call":
            c.append(f"{getattr(arg, '__module__', None)}.{getattr(arg, '__qualname__', arg)}")

    for _ in range(n):
        time.sleep(0.05)  # the batch is ready: what is left is the hand-out itself
        sys.setprofile(hook)
        try:
            next(it)
        finally:
            sys.setprofile(None)
    return py, c


@pytest.mark.parametrize("kind", ["workers", "in-process", "device-decode"])
def test_the_training_thread_only_takes_finished_batches(packed, kind):
    """Per next(): a handful of Python calls, all in the hand-out (position.py), and
    no torch or numpy function at all: no copy, conversion or decode runs in this thread (the
    workers and the feed thread did them), on the CPU path and on the nvJPEG path."""
    if kind == "device-decode":
        ld = device_decoded(packed["lmdb"], 4, num_workers=2, **F32)
    else:
        ld = feedpipe.make_loader(packed["lmdb"], 4, num_workers=2 if kind == "workers" else 0,
                                  **F32)
    it = iter(ld)
    next(it)
    py, c = calls_in_next(it, 8)
    assert len(py) / 8 < 50, py
    places = {p.rsplit("/", 1)[-1].split(":")[0] for p in py}
    assert places <= {"position.py"}, places
    assert not [f for f in c if f.startswith(("torch", "numpy"))], c


def test_a_batch_the_caller_lets_go_of_is_freed_there(packed):
    """The loader keeps no reference to a batch it handed out, so a batch the caller drops is
    freed in the caller's code, not inside the next ``next()`` (on the nvJPEG path each batch is
    a fresh tensor: freeing 50 MB there cost the training thread ~4 ms a batch)."""
    ld = device_decoded(packed["lmdb"], 4, num_workers=2, **F32)
    it = iter(ld)
    batch = next(it)
    image = weakref.ref(batch["image"])
    del batch  # the feed thread may still be leaving the frame that made it: give it a moment
    deadline = time.monotonic() + 10
    while image() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert image() is None
    assert next(it)["image"].shape[0] == 4


def test_the_workers_go_on_into_the_next_epoch(packed):
    """The epoch's last batch is handed out while the next epoch's first ones are already made:
    the feed engine holds epoch 1's first batches before the caller asks for them."""
    ld = feedpipe.make_loader(packed["lmdb"], 8, num_workers=2, **F32)
    got = list(ld)
    assert len(got) == len(ld) and ld.position() == (1, 0)
    deadline = time.monotonic() + 60
    while ld.engine._out.qsize() < FEED_DEPTH and time.monotonic() < deadline:
        time.sleep(0.01)
    # a look at the queue (taken out and put back in order: the thread waits for room)
    made = [ld.engine._out.get_nowait() for _ in range(FEED_DEPTH)]
    for item in made:
        ld.engine._out.put(item)
    assert [m.following[:2] for _, m in made] == [(1, 1), (1, 2)][:FEED_DEPTH]
    fresh = feedpipe.make_loader(packed["lmdb"], 8, num_workers=0, **F32)
    fresh.set_epoch(1)
    want = list(fresh)
    again = list(ld)  # epoch 1, its first batches taken from what was made ahead
    assert len(again) == len(want)
    assert all(torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
               for a, b in zip(again, want, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_another_position_drops_what_was_made_ahead(packed, workers):
    """An epoch left after 2 batches, then set_epoch(3), then epoch 3 left and started again:
    each iteration yields exactly a fresh loader's batches for its epoch."""
    def fresh(epoch):
        ld = feedpipe.make_loader(packed["hdf5"], 8, num_workers=0, **F32)
        ld.set_epoch(epoch)
        return [b["label"].tolist() for b in ld]

    ld = feedpipe.make_loader(packed["hdf5"], 8, num_workers=workers, **F32)
    it = iter(ld)
    first = [next(it)["label"].tolist() for _ in range(2)]
    assert first == fresh(0)[:2]
    del it
    ld.set_epoch(3)
    it = iter(ld)
    assert next(it)["label"].tolist() == fresh(3)[0]
    del it
    assert [b["label"].tolist() for b in ld] == fresh(3)  # the same epoch from its start
    assert [b["label"].tolist() for b in ld] == fresh(4)  # and on, made ahead this time


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slot_is_never_reused_while_a_batch_holds_it(packed, workers, monkeypatch):
    """Every slot going back to the ring is poisoned at once (NaN images, labels of -7): no
    batch ever shows the poison, neither when handed out nor later while the caller keeps it."""
    poisoned: list[int] = []

    def poison(ring: SlotRing, slot: int) -> None:
        for ts in ring.tensors.values():
            ts[slot].fill_(float("nan") if ts[slot].is_floating_point() else -7)
        poisoned.append(slot)

    real_release, real_reclaim = SlotRing.release, SlotRing._reclaim

    def release(self: SlotRing, slot: int) -> None:
        poison(self, slot)
        real_release(self, slot)

    def reclaim(self: SlotRing) -> None:
        before = set(self._free)
        real_reclaim(self)
        for slot in set(self._free) - before:
            poison(self, slot)

    monkeypatch.setattr(SlotRing, "release", release)
    monkeypatch.setattr(SlotRing, "_reclaim", reclaim)
    ld = feedpipe.make_loader(packed["lmdb"], 4, num_workers=workers, **F32)
    kept, copies = [], []
    rng = np.random.default_rng(0)
    for _ in range(3):  # epochs
        for k, b in enumerate(ld):
            assert not torch.isnan(b["image"]).any() and (b["label"] >= 0).all()
            if rng.random() < 0.3:  # some batches kept, the others let go at once
                kept.append(b)
                copies.append({n: v.clone() for n, v in b.items()})
            if k % 5 == 0:
                time.sleep(0.02)
    assert poisoned and kept  # slots came back (and were poisoned) while batches were kept
    for b, c in zip(kept, copies, strict=True):
        assert torch.equal(b["image"], c["image"]) and torch.equal(b["label"], c["label"])


def test_close_and_del_end_the_workers_and_the_thread(packed):
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    ld = feedpipe.make_loader(packed["lmdb"], 8, num_workers=2, **F32)
    first = [b["label"].tolist() for b in ld]
    workers = [p for p in me.children(recursive=True) if p.pid not in before]
    assert len(workers) >= 2 and ld.engine._thread is not None
    ld.close()
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive and ld.engine._thread is None
    ld.set_epoch(0)
    assert [b["label"].tolist() for b in ld] == first  # iterated again: started afresh
    thread = ld.engine._thread
    workers = [p for p in me.children(recursive=True) if p.pid not in before]
    del ld
    gc.collect()
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive
    thread.join(20)
    assert not thread.is_alive()
    assert not [t for t in threading.enumerate() if t is thread]


def test_a_workers_error_reaches_the_caller_and_the_next_iteration_starts_afresh(tmp_path):
    """A corrupt record raises in the caller's thread (the worker's error, as a DataLoader
    raises it); the workers are stopped; the next epoch runs with new ones."""
    from test_loader import _corrupt_dataset

    root = _corrupt_dataset(tmp_path / "bad", {21})
    ld = feedpipe.make_loader(root, 8, size=16, shuffle=False, num_workers=2,
                              device="cpu", output=Output(dtype="uint8"))
    with pytest.raises(Exception, match="000000021"):
        list(ld)
    ld.set_epoch(1)
    with pytest.raises(Exception, match="000000021"):
        list(ld)  # the same record again: the workers were started afresh, not left broken
    ok = feedpipe.make_loader(root, 8, size=16, shuffle=False, num_workers=2, device="cpu",
                              output=Output(dtype="uint8"), workers=Workers(on_error="skip"))
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        assert sum(len(b["label"]) for b in ok) == 40


def _stuck_on(key: int, seconds: float):
    """A transform that takes ``seconds`` over the sample whose label is ``key``."""
    def fn(sample, rng):
        if int(sample["label"]) == key:
            time.sleep(seconds)
    return fn


def test_a_transform_that_never_returns_is_named_and_stopped(tmp_path):
    """With Workers(batch_timeout=), a worker stuck on a sample fails the loader in the caller's
    thread within the timeout, naming the batch and its samples; the workers are stopped."""
    from test_loader import _corrupt_dataset

    root = _corrupt_dataset(tmp_path / "ds", set())  # 40 good records, label = index
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    ld = feedpipe.make_loader(root, 8, size=16, shuffle=False, num_workers=1, device="cpu",
                              output=Output(dtype="uint8"), transform=_stuck_on(21, 3600),
                              workers=Workers(batch_timeout=3))
    t = time.monotonic()
    with pytest.raises(Exception, match=r"batch 2 of epoch 0 .*000000021.*more than 3 s"):
        list(ld)
    assert time.monotonic() - t < 60
    workers = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive


def test_a_slow_batch_is_named_while_the_caller_waits(tmp_path, caplog):
    from test_loader import _corrupt_dataset

    root = _corrupt_dataset(tmp_path / "ds", set())
    ld = feedpipe.make_loader(root, 8, size=16, shuffle=False, num_workers=1, device="cpu",
                              output=Output(dtype="uint8"), transform=_stuck_on(13, 3))
    ld.engine.patience = 0.5
    with caplog.at_level("WARNING", logger="feedpipe.loader"):
        assert sum(len(b["label"]) for b in ld) == 40  # it waited, and went on
    said = [r.getMessage() for r in caplog.records if "no batch for" in r.getMessage()]
    # (on a loaded machine batch 0 may be named first, rightly: it was late too)
    assert any("batch 1 of epoch 0" in m and "000000013" in m for m in said), said
