"""Real torchrun (gloo on CPU): elastic resume across world sizes, and two "nodes" on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fp_helpers import free_port

import feedpipe

PROBE = str(Path(__file__).with_name("elastic_ddp_probe.py"))


def torchrun(*args: str, nproc: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                             str(nproc), *extra, PROBE, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out


def read(out: Path, mode: str, world: int) -> list[dict]:
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
@pytest.mark.parametrize("before,after", [(4, 2), (2, 3), (1, 4)])
def test_torchrun_resume_at_another_world_size(packed, tmp_path, fmt, before, after):
    """Save after 2 batches on ``before`` ranks, resume on ``after`` ranks with another batch
    size: pre- and post-resume samples are disjoint and together one epoch."""
    everything = {feedpipe.open_dataset(packed[fmt])[i]["path"] for i in range(72)}
    local = ("--master-addr", "127.0.0.1", "--master-port")
    finish(torchrun(str(packed[fmt]), str(tmp_path), "pre", "4", "0", "2", nproc=before,
                    extra=(*local, str(free_port()))))
    finish(torchrun(str(packed[fmt]), str(tmp_path), "post", "3", "0", nproc=after,
                    extra=(*local, str(free_port()))))
    pre = [p for r in read(tmp_path, "pre", before) for b in r["batches"] for p in b]
    post_ranks = read(tmp_path, "post", after)
    post = [p for r in post_ranks for b in r["batches"] for p in b]
    assert len(pre) == len(set(pre)) == 2 * 4 * before
    assert not set(pre) & set(post) and set(pre) | set(post) == everything
    assert len(post) - len(set(post)) < after  # round-robin padding, under one per rank
    lens = {r["len"] for r in post_ranks} | {n for r in post_ranks for n in r["all_len"]}
    assert len(lens) == 1  # len() is the whole epoch's on every rank, resumed or not
    assert len({len(r["batches"]) for r in post_ranks}) == 1  # the rest: equal on every rank
    assert all(len(r["batches"]) <= r["len"] for r in post_ranks)


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_two_nodes_on_loopback(packed, tmp_path, fmt):
    """--nnodes 2, two processes per node, static rendezvous on 127.0.0.1: equal batch counts on
    every global rank, disjoint samples covering the epoch, and num_workers="auto" sharing each
    node's cores among its LOCAL_WORLD_SIZE processes."""
    everything = {feedpipe.open_dataset(packed[fmt])[i]["path"] for i in range(72)}
    port = str(free_port())
    nodes = [torchrun(str(packed[fmt]), str(tmp_path), "epoch", "4", "auto", nproc=2,
                      extra=("--nnodes", "2", "--node-rank", str(node), "--master-addr",
                             "127.0.0.1", "--master-port", port))
             for node in (0, 1)]
    for proc in nodes:
        finish(proc)
    ranks = read(tmp_path, "epoch", 4)
    assert [r["world"] for r in ranks] == [[k, 4] for k in range(4)]
    assert [r["node"] for r in ranks] == [0, 0, 1, 1]
    n = ranks[0]["len"]
    assert all(r["all_len"] == [n] * 4 and len(r["batches"]) == r["len"] == n for r in ranks)
    per_rank = [{p for b in r["batches"] for p in b} for r in ranks]
    assert set().union(*per_rank) == everything
    assert sum(len(s) for s in per_rank) == 72  # disjoint: lmdb 4 x 18; wds one shard each
    for r in ranks:
        assert r["local_world_size"] == 2
        assert r["workers"] == max(1, r["cores"] // 2)
