"""Elastic resume, one process: several ranks simulated with ``World(rank, size)``. A state saved
mid-epoch at one world size, batch size and backend resumes at another with exactly the samples
not yet read (the contract the torchrun tests check with real processes, tests/test_elastic_ddp.py).
"""

from __future__ import annotations

import importlib.util
import json
import warnings

import pytest

import feedpipe
from feedpipe import Output, Sampler
from feedpipe.loader.sampler import World

HAVE_DALI = importlib.util.find_spec("nvidia.dali") is not None
KW = dict(size=16, seed=11, device="cpu", num_workers=0, output=Output(dtype="uint8"))


def ranks(path, size, batch, backend="torch", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 4 shards for 5 ranks and the like
        fields = ["image", "path"] if backend == "dali" else ["path"]
        return [feedpipe.make_loader(path, batch, backend=backend,
                                     fields=fields, sampler=Sampler(world=World(r, size)),
                                     **{**KW, **kw}) for r in range(size)]


def take(loaders, epoch, batches=None):
    """Each rank's paths after ``batches`` batches (all of them: None), and rank 0's state."""
    seen = []
    for ld in loaders:
        ld.set_epoch(epoch)
        it = iter(ld)
        n = len(ld) if batches is None else batches
        seen += [p for _, b in zip(range(n), it, strict=False) for p in b["path"]]
    return seen, json.loads(json.dumps(loaders[0].state_dict()))


def resume(loaders, state):
    for ld in loaders:
        ld.load_state_dict(state)
    return take(loaders, state["epoch"])[0]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
@pytest.mark.parametrize("before,after", [((4, 4), (2, 4)), ((2, 4), (3, 5)), ((1, 8), (4, 3))])
def test_resume_at_another_world_reads_exactly_the_rest(packed, fmt, before, after):
    """(world, batch) → (world', batch'): the samples read before and after are disjoint and
    together are the epoch; padding repeats only samples of the resumed part, once per rank."""
    everything = {feedpipe.open_dataset(packed[fmt])[i]["path"] for i in range(72)}
    pre, state = take(ranks(packed[fmt], *before), 3, batches=2)
    assert state["samples"] == len(pre) == 2 * before[0] * before[1] and len(set(pre)) == len(pre)
    post = resume(ranks(packed[fmt], *after), state)
    assert not set(pre) & set(post) and set(pre) | set(post) == everything
    assert len(post) - len(set(post)) < after[0]  # the round-robin pad: under one per rank


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_chained_resumes_and_the_same_world_continue_the_plan(packed, fmt):
    """4 → 2 → 3 ranks in one epoch covers it once; at the saver's own world and batch size the
    resume is the saver's plan batch for batch (same samples, same batch numbers)."""
    everything = {feedpipe.open_dataset(packed[fmt])[i]["path"] for i in range(72)}
    pre, state = take(ranks(packed[fmt], 4, 4), 1, batches=1)
    two = ranks(packed[fmt], 2, 4)
    for ld in two:
        ld.load_state_dict(state)
    mid, state2 = take_resumed(two, 2)
    assert state2["samples"] == len(pre) + len(mid) and state2["start"] == len(pre)
    post = resume(ranks(packed[fmt], 3, 4), state2)
    assert not set(pre) & set(mid) and not (set(pre) | set(mid)) & set(post)
    assert set(pre) | set(mid) | set(post) == everything
    again = ranks(packed[fmt], 2, 4)
    for ld in again:
        ld.load_state_dict(state2)
    same = take(again, 1)[0]
    whole = ranks(packed[fmt], 2, 4)
    for ld in whole:
        ld.load_state_dict(state)
    full = take(whole, 1)[0]
    assert same == [p for r in range(2) for p in rank_part(full, whole, r, state["epoch"])[2 * 4:]]


def take_resumed(loaders, batches):
    """Like :func:`take` without ``set_epoch`` (the loaded state's epoch)."""
    seen = []
    for ld in loaders:
        it = iter(ld)
        seen += [p for _, b in zip(range(batches), it, strict=False) for p in b["path"]]
    return seen, json.loads(json.dumps(loaders[0].state_dict()))


def rank_part(flat, loaders, r, epoch):
    """Rank r's slice of ``flat`` (the ranks' paths of ``epoch`` concatenated by :func:`take`)."""
    sizes = [sum(len(b) for b in ld.planner.plan(epoch)) for ld in loaders]
    return flat[sum(sizes[:r]): sum(sizes[:r + 1])]


@pytest.mark.skipif(not HAVE_DALI, reason="NVIDIA DALI cannot be imported")
@pytest.mark.parametrize("direction", ["torch->dali", "dali->torch"])
def test_elastic_across_backends(packed, direction):
    """A state saved by 4 ranks of one backend resumes on 2 ranks of the other."""
    src, dst = direction.split("->")
    everything = {feedpipe.open_dataset(packed["wds"])[i]["path"] for i in range(72)}
    pre, state = take(ranks(packed["wds"], 4, 4, backend=src), 0, batches=2)
    post = resume(ranks(packed["wds"], 2, 4, backend=dst), state)
    assert not set(pre) & set(post) and set(pre) | set(post) == everything


def test_bad_states_are_refused_by_name(packed):
    ld = ranks(packed["wds"], 2, 4)[0]
    legacy = {"epoch": 1, "batches": 2, "seed": 11, "rank": 0, "world_size": 4}
    with pytest.raises(feedpipe.errors.ConfigError, match=r"missing \['dataset'\]"):
        ld.load_state_dict(legacy)  # saved before states named their dataset
    good = ld.state_dict()
    with pytest.raises(feedpipe.errors.ConfigError, match="'start'"):
        ld.load_state_dict({k: v for k, v in good.items() if k not in ("start", "samples")})
    with pytest.raises(feedpipe.errors.ConfigError, match="'samples'"):
        ld.load_state_dict({**good, "samples": 10_000, "world_size": 4})
    with pytest.raises(feedpipe.errors.ConfigError, match="window"):
        ld.load_state_dict({**good, "order": {**good["order"], "window": 0}})
    with pytest.raises(feedpipe.errors.ConfigError, match="missing"):
        ld.load_state_dict({"seed": 11})


@pytest.mark.parametrize("uneven", ["pad", "mask"])
def test_a_tampered_position_is_refused(packed, uneven):
    """A state whose batch count is past its epoch's plan (the epoch would yield nothing and
    count as done), or whose two counts of one position disagree (1 batch of 8 but 24 samples:
    16 samples would be read twice), is refused before the loader's position changes."""
    ld = feedpipe.make_loader(packed["lmdb"], 8, fields=["path"], sampler=Sampler(uneven=uneven),
                              **KW)
    seen, good = take([ld], 0, batches=3)
    assert (good["batches"], good["samples"]) == (3, 24)
    for bad, match in (({"batches": 10**12}, r"'batches'=1000000000000 is past the end of "
                        r"epoch 0: its plan here has 9 batches"),
                       ({"batches": 1}, r"'batches'=1 and 'samples'=24 disagree: 1 batches "
                        r"of 8 on 1 rank\(s\) read 8 samples"),
                       ({"samples": 16}, "disagree")):
        with pytest.raises(feedpipe.errors.ConfigError, match=match):
            ld.load_state_dict({**good, **bad})
    rest = resume([ld], good)  # refused states left it as it was: the good one still resumes
    assert len(rest) == 72 - 24 and not set(rest) & set(seen)
