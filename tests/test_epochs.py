"""The contract trainers rely on (Lightning, accelerate, the HF Trainer, torchdata), one process:

- an epoch ends when its last planned batch is handed out (trainers take ``len(loader)`` batches
  and never call ``next()`` again);
- ``len(loader)`` is the whole epoch's batch count on this rank, also while a resumed epoch runs;
- ``set_epoch`` is reachable where the frameworks look (``sampler``, ``batch_sampler.sampler``);
- ``uneven="mask"`` counts every sample exactly once across ranks, in full batches;
- a state names its dataset, and a resume with fewer samples left than ranks gives every rank
  the same batch count.
Real frameworks and real processes: tests/test_trainers.py.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import N_ODD as N

import feedpipe
from converters import convert
from feedpipe import Output, Sampler
from feedpipe.errors import ConfigError
from feedpipe.loader.sampler import World

KW = dict(size=16, seed=7, device="cpu", num_workers=0, output=Output(dtype="uint8"))


def loaders(path, world, batch, **kw):
    sampler = kw.pop("sampler", Sampler())  # its uneven, with each rank's world
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [feedpipe.make_loader(path, batch, sampler=replace(sampler, world=World(r, world)),
                                     **{**KW, **kw}) for r in range(world)]


def keys(batch) -> list[int]:
    return batch["index"].tolist() if "index" in batch else list(batch["path"])


def take_len(ld) -> list:
    """What a trainer does: exactly ``len(ld)`` batches, never one more ``next()``."""
    it = iter(ld)
    return [next(it) for _ in range(len(ld))]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_ends_on_its_last_batch(odd, workers):
    ld = loaders(odd["lmdb"], 1, 16, num_workers=workers, fields=["path"])[0]
    orders = []
    for epoch in range(3):
        assert ld.state_dict()["epoch"] == epoch
        batches = take_len(ld)
        assert ld.state_dict()["epoch"] == epoch + 1 and ld.state_dict()["batches"] == 0
        assert ld.end_of_dataloader
        orders.append([p for b in batches for p in b["path"]])
    assert len({tuple(o) for o in orders}) == 3  # every epoch its own order
    assert all(sorted(o) == sorted(orders[0]) and len(o) == N for o in orders)


def test_set_epoch_is_where_the_frameworks_look(odd):
    ld = loaders(odd["lmdb"], 1, 16, fields=["path"])[0]
    ref = loaders(odd["lmdb"], 1, 16, fields=["path"])[0]
    ref.set_epoch(4)
    want = [p for b in ref for p in b["path"]]
    ld.batch_sampler.sampler.set_epoch(4)  # Lightning's second place
    assert [p for b in ld for p in b["path"]] == want
    ld.sampler.set_epoch(4)  # Lightning's first place; the HF Trainer calls the loader's own
    assert ld.state_dict()["epoch"] == 4 and [p for b in ld for p in b["path"]] == want
    assert ld.batch_sampler is ld.sampler and len(ld.sampler) == len(ld) == 7
    assert ld.batch_size == 16 and not ld.drop_last
    with pytest.raises(TypeError, match="whole batches"):
        ld.dataset[0]


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (3, 2)])
def test_len_is_the_epochs_while_a_resumed_epoch_runs(odd, before, after):
    """Elastic resume: len() never becomes the batches left; the resumed epoch hands out the
    rest, ``position()`` counts it in this world's whole-epoch terms, later epochs are whole."""
    savers = loaders(odd["wds"], before, 8, fields=["path"])
    pre = []
    for ld in savers:
        it = iter(ld)
        pre += [p for _, b in zip(range(3), it, strict=False) for p in b["path"]]
    state = json.loads(json.dumps(savers[0].state_dict()))
    resumed = loaders(odd["wds"], after, 8, fields=["path"])
    full = len(resumed[0])
    post = []
    for ld in resumed:
        ld.load_state_dict(state)
        assert len(ld) == full
        rest = list(ld)
        assert len(rest) <= full and ld.state_dict()["epoch"] == 1
        post += [p for b in rest for p in b["path"]]
    assert not set(pre) & set(post) and len(set(pre) | set(post)) == N
    for ld in resumed:
        ld2 = loaders(odd["wds"], after, 8, fields=["path"])[0]
        ld2.load_state_dict(state)
        it = iter(ld2)
        next(it)
        epoch, at = ld2.position()
        assert epoch == 0 and at == full - (len(ld2.planner.plan(0)) - 1)
        assert len(list(ld)) == len(ld) == full  # epoch 1: whole again


@pytest.mark.parametrize("world,batch", [(2, 8), (3, 5), (4, 16)])
def test_mask_counts_every_sample_once_in_full_batches(odd, world, batch):
    lds = loaders(odd["lmdb"], world, batch, shuffle=False, fields=["label"],
                  sampler=Sampler(uneven="mask"))
    per_rank = [take_len(ld) for ld in lds]
    assert len({len(r) for r in per_rank}) == 1
    gathered = []
    # what all_gather / gather_for_metrics concatenates, in rank order
    for step in zip(*per_rank, strict=True):
        assert all(len(b["valid"]) == len(b["index"]) == len(b["label"]) == batch for b in step)
        gathered.append(torch.cat([b["index"][b["valid"]] for b in step]))
        tail = torch.cat([b["valid"] for b in step])
        assert not tail[int(tail.sum()):].any()  # padding only at the gathered step's tail
    assert torch.cat(gathered).tolist() == list(range(N))  # shuffle=False: the dataset's order
    assert all(ld.remainder == N % (batch * world) for ld in lds)
    labels = feedpipe.open_dataset(odd["lmdb"])
    b = per_rank[0][0]
    assert b["label"].tolist() == [labels[i]["label"] for i in b["index"].tolist()]


def test_mask_resumes_at_another_world_and_refuses_drop_last(odd):
    lds = loaders(odd["wds"], 2, 8, fields=["path"], sampler=Sampler(uneven="mask"))
    pre = []
    for ld in lds:
        it = iter(ld)
        pre += [i for _, b in zip(range(2), it, strict=False) for i in b["index"][b["valid"]].tolist()]
    state = lds[0].state_dict()
    assert state["samples"] == 32
    post = []
    for ld in loaders(odd["wds"], 3, 4, fields=["path"], sampler=Sampler(uneven="mask")):
        ld.load_state_dict(state)
        post += [i for b in ld for i in b["index"][b["valid"]].tolist()]
    assert sorted(pre + post) == list(range(N))
    with pytest.raises(ConfigError, match="drop_last"):
        loaders(odd["lmdb"], 1, 8, drop_last=True, sampler=Sampler(uneven="mask"))


def test_one_shape_for_torch_compile(odd):
    """A compiled step sees one batch shape over an epoch under "mask" (no recompile), while
    "pad" ends on a short batch that recompiles."""
    import torch._dynamo

    def recompiles(**kw) -> int:
        torch._dynamo.reset()
        step = torch.compile(lambda x: (x.float() * 2).sum(), backend="eager")
        ld = loaders(odd["lmdb"], 1, 16, fields=["image"], **kw)[0]
        for b in take_len(ld):
            step(b["image"])
        return torch._dynamo.utils.counters["stats"]["unique_graphs"]

    assert recompiles(sampler=Sampler(uneven="mask")) == 1
    assert recompiles(sampler=Sampler(uneven="pad")) > 1


def test_fewer_samples_left_than_ranks(odd):
    """#23.8: a state after all but a few samples resumes on more ranks than samples left, and
    every rank gets the same batch count (a DDP step never waits on a dead rank)."""
    one = loaders(odd["lmdb"], 1, 1, fields=["path"])[0]
    it = iter(one)
    seen = [p for _, b in zip(range(N - 1), it, strict=False) for p in b["path"]]
    state = one.state_dict()
    for world, batch in [(2, 1), (4, 3), (2, 5)]:
        lds = loaders(odd["lmdb"], world, batch, fields=["path"])
        rest = []
        counts = set()
        for ld in lds:
            ld.load_state_dict(state)
            got = list(ld)
            counts.add(len(got))
            rest += [p for b in got for p in b["path"]]
        assert counts == {1}
        assert set(rest) | set(seen) == {p for b in loaders(odd["lmdb"], 1, 8, fields=["path"])[0]
                                         for p in b["path"]}


def test_a_state_names_its_dataset(odd, tmp_path):
    """#23.9: a state is refused on another format or another packing of the same images."""
    ld = loaders(odd["wds"], 1, 8, fields=["path"])[0]
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    assert state["dataset"]["format"] == "wds" and state["dataset"]["samples"] == N
    other = loaders(odd["lmdb"], 1, 8, fields=["path"])[0]
    with pytest.raises(ConfigError, match="another packing"):
        other.load_state_dict(state)
    repacked = tmp_path / "wds9"
    convert(odd["src"], repacked, to="wds", workers=0, writer_options={"shard_count": 9})
    with pytest.raises(ConfigError, match="another packing"):
        loaders(repacked, 1, 8, fields=["path"])[0].load_state_dict(state)
    copy = tmp_path / "copy"
    shutil.copytree(odd["wds"], copy)  # the same files elsewhere: the same dataset
    again = loaders(copy, 1, 8, fields=["path"])[0]
    again.load_state_dict(state)
    assert len(list(again)) == len(ld) - 1


def test_a_rebuilt_dataloader_skips_without_reading(odd):
    """``accelerate.skip_first_batches`` rebuilds a DataLoader from the loader's surface: it must
    yield the loader's own batches from batch n on, without decoding the skipped ones."""
    from accelerate import skip_first_batches

    ref = loaders(odd["lmdb"], 1, 8, fields=["image", "label"])[0]
    want = take_len(ref)
    ld = loaders(odd["lmdb"], 1, 8, fields=["image", "label"])[0]
    reads = []
    visit = ld.reader.visit
    ld.reader.visit = lambda idx, *a, **k: (reads.append(list(idx)), visit(idx, *a, **k))[1]
    skipped = skip_first_batches(ld, 5)
    got = list(skipped)
    assert len(got) == len(want) - 5 == len(skipped)
    for a, b in zip(got, want[5:], strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    # the reads are the plan's batches from 5 on, in order: the skipped ones were never read
    # (what follows them is the next epoch's first batch, made ahead while the last went out)
    plan = [sorted(b.tolist()) for b in ld.planner.plan(0)]
    assert [sorted(r) for r in reads[: len(plan) - 5]] == plan[5:]
    assert sum(len(b) for b in plan[5:]) == N - 5 * 8
    assert ld.state_dict()["epoch"] == 1


def test_torchdata_stateful_dataloader(odd):
    """``StatefulDataLoader(loader, batch_size=None)`` serves the loader's batches and resumes
    them exactly; wrapping a loader that has workers in worker processes is refused by name."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def dl():
        return StatefulDataLoader(loaders(odd["lmdb"], 1, 8, fields=["label", "path"])[0],
                                  batch_size=None)

    want = [list(b["path"]) for b in dl()]
    first = dl()
    it = iter(first)
    head = [list(next(it)["path"]) for _ in range(4)]
    state = first.state_dict()
    second = dl()
    second.load_state_dict(state)
    assert head + [list(b["path"]) for b in second] == want
    inner = loaders(odd["lmdb"], 1, 8, fields=["label"], num_workers=1)[0]
    with pytest.raises(ConfigError, match="own worker processes"):
        next(iter(StatefulDataLoader(inner, batch_size=None, num_workers=1)))


def test_plan_masked_layout():
    from feedpipe.loader.sampler import plan_masked

    order = np.arange(10)
    r0, real0 = plan_masked(order, World(0, 2), 3)
    r1, real1 = plan_masked(order, World(1, 2), 3)
    assert [b.tolist() for b in r0] == [[0, 1, 2], [6, 7, 8]] and real0 == [3, 3]
    assert [b.tolist() for b in r1] == [[3, 4, 5], [9, 0, 1]] and real1 == [3, 1]
