"""feedpipe.tools.tune: measured loader autotune (real datasets, real DataLoader workers) and the
batch-size finder (real models trained on CPU against a memory budget; real 2-rank torchrun)."""

from __future__ import annotations

import importlib
import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from fp_helpers import free_port
from torch import nn

import feedpipe
from converters import convert
from feedpipe import Workers, tuned
from feedpipe.cli import main
from feedpipe.errors import ConfigError
from feedpipe.loader.config import LoaderConfig, usable_cores
from feedpipe.loader.memory import ring_bytes, ring_slots
from feedpipe.tools import rss
from feedpipe.tools.throughput import Trial, steady_rate
from feedpipe.tools.tune import autotune, find_batch_size
from feedpipe.tools.tune.autotune import choose
from feedpipe.tools.tune.batch_size import BatchTrial, pick_size, search_batch_size

# the package exports the function of the same name
autotune_mod = importlib.import_module("feedpipe.tools.tune.autotune")

OPTS = dict(size=64, device="cpu")
SAMPLE_BYTES = 64 * 64 * 3 * 4 + 8  # a 64×64 float32 RGB image (as the workers convert it), label


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own $XDG_CACHE_HOME: nothing is read from or written to ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "feedpipe"


# -- autotune --------------------------------------------------------------------------------------

def test_steady_rate_excludes_startup_and_shrugs_off_a_disturbed_window():
    waits = [1.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]  # start-up, then one batch decoded during it
    steps = [0.05] * 8
    rows = [8] * 8
    # three windows of two batches after batch 1 arrives: 16 samples per 2 × (0.05 + 0.1) s
    assert steady_rate(waits, steps, rows, warmup=2) == pytest.approx(16 / 0.3)
    slow = waits[:4] + [2.0] + waits[5:]  # another process stalls the middle window
    assert steady_rate(slow, steps, rows, warmup=2) == pytest.approx(16 / 0.3)
    assert steady_rate(slow, steps, rows, warmup=2, windows=1) == pytest.approx(48 / 2.8)
    with pytest.raises(ValueError, match="need 2 warm-up"):
        steady_rate(waits[:4], steps, rows, warmup=2)


def _trial(workers: int, prefetch: int | None, rate: float | None, first: float | None,
           ram: int, reason: str = "") -> Trial:
    """A tune trial (the one Trial type bench shares): workers, prefetch, samples/s, start-up,
    batch bytes, why skipped."""
    return Trial("lmdb", "torch", 16, str(workers), workers, prefetch,
                 "ok" if rate is not None else "skipped", reason, first_batch_s=first,
                 samples_per_s=rate, ram_bytes=ram)


def test_choose_takes_the_cheapest_within_tolerance():
    trials = [_trial(0, None, 500.0, 0.1, 100), _trial(1, 2, 900.0, 0.1, 400),
              _trial(2, 2, 1000.0, 0.1, 600), _trial(2, 1, 990.0, 0.1, 500),
              _trial(2, 4, 1010.0, 0.1, 1000), _trial(3, 2, None, None, 10**9, "skipped")]

    def pick(tol: float) -> tuple[int, int | None]:
        chosen, best = choose(trials, tol)
        assert (best.workers, best.prefetch) == (2, 4)
        return chosen.workers, chosen.prefetch

    assert pick(0.0) == (2, 4)    # only the best itself
    assert pick(0.05) == (2, 1)   # same workers as the best, least memory
    assert pick(0.15) == (1, 2)   # fewer workers wins
    assert pick(0.6) == (0, None)
    with pytest.raises(ConfigError, match="over the budget"):
        choose([_trial(1, 2, None, None, 10, "skipped")], 0.05)


def test_autotune_picks_one_of_its_trials_by_its_own_rule(packed):
    # how close the pick comes to an exhaustive sweep is a timing claim, measured in
    # benchmarks/bench_tune.py; here: what autotune returns follows from what it measured
    path = packed["lmdb"]
    before = {c.pid for c in psutil.Process().children(recursive=True)}  # earlier tests' loaders
    res = autotune(path, 16, budget_cpus=2, trial_batches=8, repeats=2, cache=False, **OPTS)
    new = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    _, alive = psutil.wait_procs(new, timeout=10)
    assert not alive  # every trial shut its workers down
    tried = {(t.workers, t.prefetch) for t in res.trials}
    assert (res.num_workers, res.prefetch_factor) in tried
    assert (0, None) in tried and any(w == 1 for w, _ in tried)
    assert max(w for w, _ in tried) <= min(2, usable_cores())
    assert all(t.samples_per_s and t.samples_per_s > 0 and t.first_batch_s > 0
               for t in res.trials if t.status != "skipped")
    chosen, top = choose(res.trials, 0.05)  # the result follows its own rule over its own trials
    assert (chosen.workers, chosen.prefetch) == (res.num_workers, res.prefetch_factor)
    assert res.best_samples_per_s == top.samples_per_s == max(
        t.samples_per_s or 0 for t in res.trials)
    assert chosen.samples_per_s >= (1 - 0.05) * top.samples_per_s
    assert chosen.setting in res.reason
    for t in res.trials:
        assert t.ram_bytes == SAMPLE_BYTES * 16 * ring_slots(t.workers, t.prefetch or 0)
    loader = feedpipe.make_loader(path, 16, **res.loader_options(), **OPTS)
    assert loader.config.num_workers == res.num_workers  # the options reproduce the pick


def test_budgets_are_respected(packed):
    path = packed["lmdb"]
    # in-process (4 slots) and 1 worker × prefetch 1 (5 slots) fit; 6 slots do not
    budget = int(5.5 * SAMPLE_BYTES * 16)
    res = autotune(path, 16, budget_cpus=2, budget_ram=budget, trial_batches=6, cache=False,
                   **OPTS)
    for t in res.trials:
        assert (t.samples_per_s is None) == (t.ram_bytes > budget), t
        assert ("skipped" in t.reason) == (t.samples_per_s is None) == (t.status == "skipped")
    assert any(t.workers == 2 and t.samples_per_s is None for t in res.trials)
    assert next(t for t in res.trials if (t.workers, t.prefetch) ==
                (res.num_workers, res.prefetch_factor)).ram_bytes <= budget
    assert "skipped over the RAM budget" in res.reason
    one = autotune(path, 16, budget_cpus=1, trial_batches=6, cache=False, **OPTS)
    assert max(t.workers for t in one.trials) == 1 and one.num_workers <= 1


def test_cache_hit_skips_trials_and_a_changed_dataset_invalidates_it(
        photo_dir, tmp_path, cache_home, monkeypatch, caplog):
    path = tmp_path / "ds"
    convert(photo_dir, path, to="lmdb", workers=0)
    kw = dict(budget_cpus=1, trial_batches=6, **OPTS)
    first = autotune(path, 16, **kw)
    assert not first.cached and first.trials
    assert [f.name for f in cache_home.iterdir()] == [Path(first.cache_path).name]  # no temp left
    stored = json.loads(Path(first.cache_path).read_text())
    assert stored["key"]["dataset"] == str(path.resolve())
    assert stored["result"]["num_workers"] == first.num_workers

    def no_trial(*args: object, **kwargs: object) -> None:
        raise AssertionError("a trial ran")

    real = autotune_mod.measure
    monkeypatch.setattr(autotune_mod, "measure", no_trial)
    hit = autotune(path, 16, **kw)
    assert hit.cached and (hit.num_workers, hit.prefetch_factor) == (first.num_workers,
                                                                     first.prefetch_factor)
    assert hit.trials == first.trials and "(cached)" in hit.report()
    with pytest.raises(AssertionError, match="a trial ran"):
        autotune(path, 32, **kw)  # other settings: not this entry
    monkeypatch.setattr(autotune_mod, "measure", real)

    convert(photo_dir, path, to="lmdb", workers=0, store="raw", resize=64, overwrite=True)
    again = autotune(path, 16, **kw)
    assert not again.cached and again.cache_path != first.cache_path
    assert json.loads(Path(again.cache_path).read_text())["key"]["manifest_sha256"] != \
        stored["key"]["manifest_sha256"]

    Path(again.cache_path).write_text("{half a file")
    with caplog.at_level(logging.WARNING, logger="feedpipe.tune"):
        redone = autotune(path, 16, **kw)
    assert not redone.cached and "unreadable cache file" in caplog.text
    assert json.loads(Path(redone.cache_path).read_text())["result"]["reason"] == redone.reason

    wrong = json.loads(Path(redone.cache_path).read_text())  # valid JSON, right key, bad choice
    wrong["result"]["num_workers"] = "two"
    Path(redone.cache_path).write_text(json.dumps(wrong))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="feedpipe.tune"):
        fixed = autotune(path, 16, **kw)
    assert not fixed.cached and isinstance(fixed.num_workers, int)
    assert "another layout" in caplog.text
    assert json.loads(Path(fixed.cache_path).read_text())["result"]["num_workers"] == \
        fixed.num_workers


def test_num_workers_tune_moved_to_an_explicit_tuned_option(packed):
    """num_workers="tune" (a global hook installed by importing the tools) is gone: the
    ConfigError names workers=feedpipe.tuned(), and importing the loader alone imports no
    tools."""
    code = ("import sys\n"
            "from feedpipe.errors import ConfigError\n"
            "from feedpipe.loader.api import make_loader\n"
            "try:\n"
            f"    make_loader({str(packed['lmdb'])!r}, 8, num_workers='tune', device='cpu')\n"
            "except ConfigError as exc:\n"
            "    print(exc.option, exc)\n"
            "print('feedpipe.tools.tune' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    message, imported = proc.stdout.strip().splitlines()
    assert message.startswith("num_workers ") and "workers=feedpipe.tuned()" in message
    assert imported == "False"


def test_make_loader_num_workers_tune(packed):
    path = packed["lmdb"]
    loader = feedpipe.make_loader(path, 16, workers=tuned(), **OPTS)
    res = autotune(path, 16, **OPTS)  # the same settings: what make_loader cached
    assert res.cached and loader.config.num_workers == res.num_workers
    if res.num_workers:
        assert loader.config.workers.prefetch_factor == res.prefetch_factor
    assert sum(len(b["label"]) for b in loader) == 72
    fixed = feedpipe.make_loader(path, 16, workers=tuned(workers=Workers(prefetch_factor=2)),
                                 **OPTS)
    assert fixed.config.num_workers == 0 or fixed.config.workers.prefetch_factor == 2
    assert {t.prefetch for t in autotune(path, 16, workers=Workers(prefetch_factor=2),
                                         **OPTS).trials} <= {None, 2}
    with pytest.raises(ConfigError, match="feedpipe.tuned"):
        LoaderConfig(batch_size=4, num_workers="tune")
    with pytest.raises(ConfigError, match="chooses num_workers") as exc:
        feedpipe.make_loader(path, 16, num_workers=2, workers=tuned(), **OPTS)
    assert exc.value.option == "num_workers"


@pytest.mark.parametrize("bad, match", [
    (dict(num_workers=2), "leave it out"), (dict(budget_cpus=0), "budget_cpus"),
    (dict(budget_ram=-1), "budget_ram"), (dict(tolerance=1.5), "tolerance"),
    (dict(trial_batches=2), "trial_batches"), (dict(repeats=0), "repeats"),
    (dict(crop="squash"), "crop"),
    (dict(budget_ram="2G"), "budget_ram"), (dict(tolerance="0.05"), "tolerance"),
])
def test_autotune_rejects_bad_options(packed, bad, match):
    with pytest.raises(ConfigError, match=match):
        autotune(packed["lmdb"], 16, **{**OPTS, **bad})


def test_cli_tune_prints_trials_and_choice(packed, capsys):
    rc = main(["tune", str(packed["wds"]), "--batch-size", "16", "--size", "64", "--device",
               "cpu", "--budget-cpus", "1", "--trial-batches", "6", "--no-cache"])
    out = capsys.readouterr().out
    assert rc == 0 and "samples/s" in out and "chose workers=" in out
    assert len([ln for ln in out.splitlines() if ln.split()[:1] in (["0"], ["1"])]) >= 2


# -- batch-size finder -----------------------------------------------------------------------------

@pytest.mark.parametrize("max_size", [1, 7, 64, 1000])
@pytest.mark.parametrize("resolution", [0.0, 1 / 8])
def test_search_against_an_oracle(max_size, resolution):
    for limit in [0, 1, 2, 3, 5, 8, 13, 63, 64, 65, 100, 999, 5000]:
        calls: list[int] = []

        def fits(size: int) -> bool:  # called within this iteration only
            calls.append(size)  # noqa: B023
            return size <= limit  # noqa: B023

        got = search_batch_size(fits, max_size=max_size, resolution=resolution)
        want = min(limit, max_size)
        assert got <= want and want - got <= int(got * resolution), (limit, got, calls)
        if resolution == 0:
            assert got == want
        assert max(calls) <= max_size and len(calls) <= 2 * math.ceil(math.log2(max_size)) + 2
        for i, c in enumerate(calls):  # never tries a size above one that already failed
            assert all(c < f for f in calls[:i] if f > limit), calls
    assert search_batch_size(lambda s: s <= 10, max_size=1000, start=64) == 10


def test_pick_size_margin_and_fastest():
    trials = [BatchTrial(8, True, 10, 100.0), BatchTrial(16, True, 20, 300.0),
              BatchTrial(32, True, 40, 250.0), BatchTrial(64, True, 80, 900.0),
              BatchTrial(128, False, 160, None, "over budget"), BatchTrial(96, True, 120, 950.0)]
    assert pick_size(trials, 96, "largest", 0.1)[0] == 86    # floor(96 × 0.9)
    assert pick_size(trials, 96, "largest", 0.0)[0] == 96
    assert pick_size(trials, 96, "fastest", 0.1)[0] == 64    # 96 is faster but above the cap
    assert pick_size(trials, 96, "fastest", 0.0)[0] == 96
    assert pick_size(trials[:1], 8, "fastest", 0.5)[0] == 4  # nothing measured under the cap
    assert pick_size(trials, 1, "largest", 0.5)[0] == 1


@pytest.mark.parametrize("kernel", [True, False], ids=["VmHWM", "psutil-sampler"])
def test_host_peak_sees_a_freed_allocation(kernel, monkeypatch):
    monkeypatch.setattr(rss, "_kernel_peak_available", lambda: kernel)
    meter = rss.HostPeak()
    assert meter.kernel == kernel
    with rss.exact_heap():
        meter.reset()
        base = meter.rss()
        block = torch.ones(16 << 20)  # 64 MiB, every page touched
        time.sleep(0.05)              # the sampler reads every millisecond
        del block
        peak = meter.peak()
    meter.stop()
    assert peak - base >= 60 << 20 and meter.rss() - base < 16 << 20  # seen, and given back


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))


def images(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 24, 24), torch.randint(0, 4, (n,))


def test_find_batch_size_on_cpu_within_a_memory_budget():
    model = tiny_cnn()
    opt = torch.optim.Adam(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    budget = 24 << 20
    res = find_batch_size(model, images, optimizer=opt, memory_budget=budget, start=16,
                          max_size=4096, steps=1, resolution=1 / 16)
    assert any(not t.ok for t in res.trials)  # the search went past the budget ...
    for t in res.trials:  # ... and every trial's verdict matches its measured peak
        assert t.peak_bytes is not None and (t.peak_bytes <= budget) == t.ok, t
        assert t.ok == (t.samples_per_s is not None) and (t.ok or "budget" in t.note)
    assert res.largest_fit == max(t.size for t in res.trials if t.ok)
    assert res.batch_size == math.floor(res.largest_fit * 0.9)
    sizes = [t.size for t in res.trials]
    assert sizes[:2] == [16, 32] and len(sizes) == len(set(sizes))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # restored
    assert not opt.state and model.training
    check = find_batch_size(model, images, optimizer=opt, memory_budget=budget, margin=0,
                            start=res.batch_size, max_size=res.batch_size, steps=1)
    assert check.trials[0].ok and check.trials[0].peak_bytes <= budget  # the answer fits
    assert "oom" in res.report() and "less 10% margin" in res.report()


@pytest.mark.heavy  # a full run of the tool on CPU (10-17 s): the heavy tier
def test_find_batch_size_from_a_dataset_fastest_and_loader_ram(packed):
    model = tiny_cnn()
    res = find_batch_size(model, packed["lmdb"], mode="fastest", memory_budget=48 << 20,
                          start=8, max_size=256, steps=2, loader_workers=2, loader_prefetch=3,
                          size=32, device="cpu")
    cap = math.floor(res.largest_fit * 0.9)
    measured = [t for t in res.trials if t.ok and t.size <= cap]
    assert res.batch_size == max(measured, key=lambda t: t.samples_per_s).size
    per_sample = 32 * 32 * 3 * 4 + 8  # float32 images, as the workers convert them
    assert res.loader_ram_bytes == per_sample * res.batch_size * ring_slots(2, 3)


def test_find_batch_size_caps_by_the_loaders_host_ram(packed):
    with pytest.warns(UserWarning, match="capped to 1: the loader would hold"):
        res = find_batch_size(tiny_cnn(), packed["lmdb"], memory_budget=48 << 20, start=8,
                              max_size=16, steps=1, loader_workers=2, loader_prefetch=10**9,
                              size=32, device="cpu")
    assert res.largest_fit == 16 and res.batch_size == 1 and "capped" in res.reason


def test_the_loaders_batches_leave_half_the_host_ram(monkeypatch):
    """On the H200 the largest fitting ResNet-50 batch had the loader hold 111 of 128 GiB; the
    loader's batches now take at most half the RAM available."""
    from feedpipe.tools.tune import batch_size as bs

    per_sample, workers, prefetch = 600_000, 16, 4
    at = {n: ring_bytes(per_sample * n, workers, prefetch) for n in (1, 2048, 2937)}
    monkeypatch.setattr(bs, "host_available_bytes", lambda: int(at[2937] / 0.9))
    done = [bs.BatchTrial(n, True, 1 << 30, 100.0) for n in (1024, 2048, 3264)]
    with pytest.warns(UserWarning, match="more than half"):
        res = bs._choose(done, 3264, "largest", 0.1, torch.device("cpu"), None, per_sample,
                         workers, prefetch)
    assert res.largest_fit == 3264 and "capped" in res.reason
    assert res.loader_ram_bytes <= int(at[2937] / 0.9) * bs.LOADER_RAM_SHARE
    assert res.batch_size == int(at[2937] / 0.9 * bs.LOADER_RAM_SHARE) // at[1]
    monkeypatch.setattr(bs, "host_available_bytes", lambda: 3 * at[2937])
    assert bs._choose(done, 3264, "largest", 0.1, torch.device("cpu"), None, per_sample,
                      workers, prefetch).batch_size == 2937  # room enough: no cap


@pytest.mark.heavy  # a full run of the tool on CPU (10-17 s): the heavy tier
def test_allocation_failures_are_ooms_and_other_errors_propagate():
    model = tiny_cnn()

    def step(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if len(batch[0]) > 12:
            torch.empty(1 << 62, dtype=torch.uint8)  # the real allocator refuses: RuntimeError
        return m(batch[0]).mean()

    res = find_batch_size(model, images, step=step, max_size=64, steps=1, margin=0)
    assert res.largest_fit == res.batch_size == 12
    assert all("allocate" in t.note for t in res.trials if not t.ok)

    def broken(m: nn.Module, batch: object) -> torch.Tensor:
        raise ValueError("bug in the step")

    with pytest.raises(ValueError, match="bug in the step"):
        find_batch_size(model, images, step=broken, max_size=8)
    with pytest.raises(ConfigError, match="does not fit"):
        find_batch_size(model, images, memory_budget=1, max_size=8, steps=1)
    for bad, match in [(dict(margin=1.0), "margin"), (dict(mode="big"), "mode"),
                       (dict(start=9, max_size=8), "start"), (dict(memory_budget=0), "budget"),
                       (dict(memory_budget="1G"), "memory_budget"), (dict(steps="3"), "steps"),
                       (dict(loader_workers=-1), "loader_workers"),
                       (dict(resolution="1/32"), "resolution")]:
        with pytest.raises(ConfigError, match=match):
            find_batch_size(model, images, **bad)


@pytest.mark.heavy  # a full run of the tool on CPU (10-17 s): the heavy tier
def test_ddp_ranks_agree_on_the_minimum(tmp_path):
    """Real torchrun, 2 processes, gloo: rank 1 has the smaller budget; both take its answer."""
    budgets = [96 << 20, 24 << 20]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()),
                        str(Path(__file__).with_name("tune_ddp_probe.py")), str(tmp_path),
                        ",".join(map(str, budgets))],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert ranks[0]["batch_size"] == ranks[1]["batch_size"] > 0
    assert [t["ok"] for t in ranks[0]["trials"]] == [t["ok"] for t in ranks[1]["trials"]]
    assert all(t["peak_bytes"] <= budgets[1] for t in ranks[1]["trials"] if t["ok"])
    assert any("another rank" in t["note"] for t in ranks[0]["trials"])  # rank 0 alone fits more
    assert ranks[0]["batch_size"] == math.floor(ranks[1]["largest_fit"] * 0.9)


def test_find_batch_size_on_cpu_stays_within_its_time_budget_and_shows_progress(capsys):
    """On CPU the search has a time cap (it once ran 1,331 s with no output): a size whose trial
    would not end within what is left is not run, and each trial is shown as it ends."""
    def slow_step(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(0.005 * len(batch[0]))  # a step's time grows with the batch, as on a CPU
        return m(batch[0]).mean()

    res = find_batch_size(tiny_cnn(), images, step=slow_step, start=16, max_size=4096, steps=1,
                          time_budget=2.0, memory_budget=1 << 30, device="cpu")
    ran = [t for t in res.trials if t.seconds is not None]
    assert ran and all(t.ok for t in ran)
    assert sum(t.seconds for t in ran[:-1]) <= 2.0  # every trial run began within the budget
    skipped = [t for t in res.trials if "time budget" in t.note]
    assert skipped and all(not t.ok and t.seconds is None for t in skipped)
    assert 16 <= res.largest_fit < min(t.size for t in skipped)
    assert "time budget" in res.reason and res.time_budget_s == 2.0
    err = capsys.readouterr().err
    assert "find_batch_size on cpu" in err and f"batch {res.largest_fit}: ok" in err


def test_find_batch_size_cpu_defaults_cap_time_and_memory():
    """Defaults on CPU: half the RAM available and CPU_TIME_BUDGET_S seconds; no caps on time
    asked for with time_budget=None."""
    from feedpipe.tools.machine import host_available_bytes
    from feedpipe.tools.tune.batch_size import CPU_TIME_BUDGET_S

    res = find_batch_size(tiny_cnn(), images, start=8, max_size=16, steps=1, progress=False)
    assert res.time_budget_s == CPU_TIME_BUDGET_S <= 300
    assert 0 < res.budget_bytes < host_available_bytes()  # half of it, taken at the start
    res = find_batch_size(tiny_cnn(), images, start=8, max_size=16, steps=1, progress=False,
                          time_budget=None)
    assert res.time_budget_s is None and res.largest_fit == 16
    with pytest.raises(ConfigError, match="time_budget"):
        find_batch_size(tiny_cnn(), images, time_budget=0, progress=False)
