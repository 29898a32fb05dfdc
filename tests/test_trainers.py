"""feedpipe inside real trainers, in real processes (probes: tests/*_probe.py):

- Lightning ``Trainer.fit``: every epoch its own order, every sample once an epoch, exact
  validation counts, the data-wait share in the logger; DDP on 2 CPU processes (gloo) killed
  with SIGKILL mid-epoch and resumed from its checkpoint at 2 ranks and at 1 (heavy);
- accelerate on 2 processes (torchrun, gloo): ``gather_for_metrics`` exact, gradient
  accumulation flushing the last batch, ``save_state``/``load_state`` resumed at 2 and 1 ranks;
- the HF ``Trainer``: exact evaluation counts and ``resume_from_checkpoint`` mid-epoch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from conftest import N_ODD
from fp_helpers import free_port

from feedpipe import Output

HERE = Path(__file__).parent
EVERY = list(range(N_ODD))


def probe(name: str, cfg: dict, *, nproc: int = 0, expect_kill: bool = False) -> None:
    """Run tests/<name>_probe.py on ``cfg`` (under torchrun with ``nproc`` > 0)."""
    path = Path(cfg["out"]) / f"{cfg['run']}.json"
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, str(HERE / f"{name}_probe.py"), str(path)]
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *cmd[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if expect_kill:
        assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def lightning_seen(out: Path, run: str) -> dict[int, list[tuple[int, list[int]]]]:
    """{epoch: [(batch_idx, indices)]} over every rank of a Lightning probe run."""
    seen: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
    for f in out.glob(f"seen-{run}-rank*.jsonl"):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            seen[row["epoch"]].append((row["batch_idx"], row["index"]))
    return seen


def flat(rows) -> list[int]:
    return [i for _, idx in rows for i in idx]


def test_lightning_fit_and_validate(odd, tmp_path):
    probe("lightning", {"data": str(odd["lmdb"]), "val": str(odd["wds"]), "out": str(tmp_path),
                        "run": "fit", "devices": 1, "epochs": 3, "batch": 8, "save_after": True})
    seen = lightning_seen(tmp_path, "fit")
    orders = [flat(sorted(seen[e])) for e in range(3)]
    assert all(sorted(o) == EVERY for o in orders)  # every sample once an epoch
    assert len({tuple(o) for o in orders}) == 3  # and every epoch its own order
    metrics = json.loads((tmp_path / "fit-metrics.json").read_text())
    assert metrics["val_count"] == N_ODD and metrics["val_rows"] == 104  # 13 full batches
    assert metrics["validate_count"] == N_ODD  # Trainer.validate on its own
    assert 0 <= metrics["feedpipe/data_wait_share"] <= 1 and metrics["feedpipe/samples_per_s"] > 0
    logged = (tmp_path / "logs-fit").rglob("metrics.csv")
    assert any("feedpipe/data_wait_share" in p.read_text().splitlines()[0] for p in logged)
    # trainer.save_checkpoint once fit is over: the loader's position is the next epoch's start
    ckpt = torch.load(tmp_path / "fit-after-fit.ckpt", weights_only=False)
    (state,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert (state["epoch"], state["batches"], state["samples"]) == (3, 0, 0)


@pytest.mark.heavy
@pytest.mark.parametrize("saver,resumers", [(2, (2, 1)), (1, (2,))])
def test_lightning_killed_mid_epoch_resumes_at_any_rank_count(odd, tmp_path, saver, resumers):
    """A checkpoint every 3 steps, SIGKILL at step 5 (DDP on 2 CPU processes, or 1 process);
    resumed from the step-3 checkpoint at 2 ranks and at 1: epoch 0 is the 3 trained batches
    plus exactly the rest, the later epochs whole, validation counts every sample once."""
    base = {"data": str(odd["lmdb"]), "val": str(odd["wds"]), "out": str(tmp_path),
            "epochs": 3, "batch": 8, "workers": 1}
    probe("lightning", {**base, "run": "kill", "devices": saver, "every": 3, "kill_at": 5},
          expect_kill=True)
    ckpt = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    assert ckpt.exists()
    pre = flat(r for r in lightning_seen(tmp_path, "kill")[0] if r[0] < 3)
    assert len(pre) == len(set(pre)) == saver * 3 * 8
    for devices in resumers:
        run = f"resume{devices}"
        probe("lightning", {**base, "run": run, "devices": devices, "resume": str(ckpt)})
        seen = lightning_seen(tmp_path, run)
        assert sorted(pre + flat(seen[0])) == EVERY, devices
        assert sorted(flat(seen[1])) == sorted(flat(seen[2])) == EVERY
        metrics = json.loads((tmp_path / f"{run}-metrics.json").read_text())
        assert metrics["val_count"] == metrics["validate_count"] == N_ODD


def accelerate_runs(out: Path, run: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{run}-rank*.json"))]


def test_accelerate_gathers_exactly_and_flushes_the_last_batch(odd, tmp_path):
    """2 processes, 103 samples: gather_for_metrics returns each validation sample once;
    gradient accumulation of 4 over 7 batches steps twice an epoch (the last batch syncs)."""
    probe("accelerate", {"data": str(odd["lmdb"]), "val": str(odd["wds"]), "out": str(tmp_path),
                         "run": "full", "epochs": 2, "batch": 8, "accum": 4}, nproc=2)
    ranks = accelerate_runs(tmp_path, "full")
    assert [r["world"] for r in ranks] == [2, 2] and {r["len"] for r in ranks} == {7}
    for r in ranks:
        assert sorted(r["gathered"]) == EVERY
        assert r["steps"] == {"0": 2, "1": 2}
    for epoch in ("0", "1"):
        assert sorted(i for r in ranks for i in r["seen"][epoch]) == EVERY
    assert ranks[0]["logged"] == 2  # the data-wait share went to the tracker each epoch
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))


def test_plain_accelerator_prepare_gathers_exactly(odd, tmp_path):
    """The loaders through accelerate's own prepare (which returns them as they are): the loader
    joins accelerate's gradient state while it runs, so gather_for_metrics still drops the
    padding of Sampler(uneven="mask") (103 samples, not 8 x 8 x 2 = 128) and accumulation still
    steps on the last batch."""
    probe("accelerate", {"data": str(odd["lmdb"]), "val": str(odd["wds"]), "out": str(tmp_path),
                         "run": "plain", "epochs": 1, "batch": 8, "accum": 4, "plain": True},
          nproc=2)
    ranks = accelerate_runs(tmp_path, "plain")
    assert [r["world"] for r in ranks] == [2, 2]
    for r in ranks:
        assert len(r["gathered"]) == N_ODD and sorted(r["gathered"]) == EVERY
        assert r["steps"] == {"0": 2}


@pytest.mark.heavy
@pytest.mark.parametrize("saver,resumers", [(2, (2, 1)), (1, (2,))])
def test_accelerate_save_state_resumes_at_any_rank_count(odd, tmp_path, saver, resumers):
    base = {"data": str(odd["lmdb"]), "val": str(odd["wds"]), "out": str(tmp_path),
            "epochs": 2, "batch": 8, "accum": 4}
    probe("accelerate", {**base, "run": "stop", "stop_after": 3}, nproc=saver)
    pre = [i for r in accelerate_runs(tmp_path, "stop") for i in r["seen"]["0"]]
    assert len(pre) == saver * 3 * 8
    for n in resumers:
        probe("accelerate", {**base, "run": f"res{n}", "resume": str(tmp_path / "state")},
              nproc=n)
        ranks = accelerate_runs(tmp_path, f"res{n}")
        assert sorted(pre + [i for r in ranks for i in r["seen"]["0"]]) == EVERY, n
        assert sorted(i for r in ranks for i in r["seen"]["1"]) == EVERY


def test_data_wait_share_in_a_summary_writer(odd, tmp_path):
    """A loop of your own: StallMeter's epoch summary written to TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    import feedpipe
    from feedpipe.tools.monitor import StallMeter

    ld = feedpipe.make_loader(odd["lmdb"], 8, size=16, device="cpu",
                              num_workers=0, output=Output(dtype="uint8"))
    writer = SummaryWriter(tmp_path)
    for epoch in range(2):
        meter = StallMeter(cuda_sync=False)
        for _ in meter.wrap(ld):
            pass
        meter.summary().log_to(writer, epoch)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    share = events.Scalars("feedpipe/data_wait_share")
    assert [e.step for e in share] == [0, 1] and all(0 <= e.value <= 1 for e in share)


def test_hf_trainer_evaluates_exactly_and_resumes_mid_epoch(odd, tmp_path):
    base = {"data": str(odd["lmdb"]), "val": str(odd["wds"]), "out": str(tmp_path),
            "epochs": 2, "batch": 8}
    probe("hf", {**base, "run": "full"})
    full = json.loads((tmp_path / "full.json").read_text())
    assert full["metrics"]["eval_count"] == N_ODD  # padding trimmed by gather_for_metrics
    assert full["logged"] == 2  # the data-wait share logged once an epoch
    for epoch in ("0", "1"):
        assert sorted(set(full["seen"][epoch])) == EVERY and len(full["seen"][epoch]) == 104
    assert full["seen"]["0"] != full["seen"]["1"]
    probe("hf", {**base, "run": "stop", "stop_at": 5})
    probe("hf", {**base, "run": "res", "resume": str(tmp_path / "ckpt-stop" / "checkpoint-3")})
    res = json.loads((tmp_path / "res.json").read_text())
    assert res["seen"]["0"] == full["seen"]["0"][3 * 8:]  # exactly the batches after step 3
    assert res["seen"]["1"] == full["seen"]["1"]
