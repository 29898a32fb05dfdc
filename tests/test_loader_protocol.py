"""One contract, run against every backend: the Loader protocol, torch's iteration rules (a new
``iter()`` starts the epoch over; only ``load_state_dict`` resumes), ``classes``, and tune, bench
and monitor through the protocol. DALI runs in its CPU mode (see tests/test_dali.py).
"""

from __future__ import annotations

import importlib.util
import shutil

import pytest
import torch
from conftest import N_PHOTOS

import feedpipe
from converters import convert
from feedpipe import Output, tuned
from feedpipe.loader.api import DaliLoader, Loader, LoaderView, TorchLoader
from feedpipe.tools.bench import BenchConfig, run_bench
from feedpipe.tools.monitor import LoaderInfo, StallMeter, StallSummary, advise
from feedpipe.tools.tune import autotune, find_batch_size

HAVE_DALI = importlib.util.find_spec("nvidia.dali") is not None
needs_dali = pytest.mark.skipif(not HAVE_DALI, reason="NVIDIA DALI cannot be imported; pip "
                                "install 'feedpipe[test]'")
BACKENDS = [pytest.param(("torch", 0), id="torch-w0"), pytest.param(("torch", 2), id="torch-w2"),
            pytest.param(("dali", 0), id="dali", marks=needs_dali)]
KW = dict(size=32, seed=5, device="cpu", fields=["image", "label", "path"],
          output=Output(dtype="uint8"))


def loader(path, backend, workers=0, batch_size=8, **kw):
    return feedpipe.make_loader(path, batch_size, backend=backend, num_workers=workers,
                                **{**KW, **kw})


def paths(batches) -> list[str]:
    return [p for b in batches for p in b["path"]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_peek_and_break_never_shorten_the_next_epoch(packed, backend):
    """``next(iter(L))`` then ``for b in L`` yields the whole epoch; so does a ``for`` after a
    ``break``; state_dict is exact after the break; a full epoch advances to the next."""
    ld = loader(packed["lmdb"], *backend)
    ref = loader(packed["lmdb"], *backend)
    e0, e1 = list(ref), list(ref)
    assert len(e0) == len(ld) == 9 and paths(e0) != paths(e1)
    peek = next(iter(ld))
    assert peek["path"] == e0[0]["path"] and ld.state_dict()["batches"] == 1
    assert paths(list(ld)) == paths(e0)  # all N samples, not N - batch_size
    assert ld.state_dict()["epoch"] == 1
    for n, _ in enumerate(ld, 1):
        if n == 3:
            break
    assert {k: ld.state_dict()[k] for k in ("epoch", "batches")} == {"epoch": 1, "batches": 3}
    again = list(ld)
    assert paths(again) == paths(e1) and len(again) == 9  # not resumed at batch 3
    assert ld.state_dict()["epoch"] == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_state_dict_resumes_once(packed, backend):
    """A loaded state resumes the next iteration only; ``set_epoch`` to its own epoch keeps it,
    another epoch drops it."""
    ref = loader(packed["wds"], *backend)
    ref.set_epoch(2)
    full = list(ref)
    saver = loader(packed["wds"], *backend)
    saver.set_epoch(2)
    it = iter(saver)
    for _ in range(4):
        next(it)
    state = saver.state_dict()
    ld = loader(packed["wds"], *backend)
    ld.load_state_dict(state)
    assert ld.state_dict()["batches"] == 4  # saved again before iterating: the same position
    head = next(iter(ld))  # the resumed iteration begins at batch 4 ...
    assert head["path"] == full[4]["path"] and ld.state_dict()["batches"] == 5
    assert paths(list(ld)) == paths(full)  # ... and only that one: the next starts over
    ld.load_state_dict(state)
    ld.set_epoch(2)  # the usual loop re-states the epoch: the resume survives that
    assert paths(list(ld)) == paths(full[4:])
    ld.load_state_dict(state)
    ld.set_epoch(3)  # another epoch drops it
    assert len(list(ld)) == 9


@needs_dali
@pytest.mark.parametrize("direction", ["torch->dali", "dali->torch"])
def test_mid_iteration_states_are_interchangeable(packed, direction):
    src, dst = direction.split("->")
    a = loader(packed["hdf5"], src)
    a.set_epoch(1)
    it = iter(a)
    head = [next(it) for _ in range(3)]
    state = a.state_dict()
    b = loader(packed["hdf5"], dst)
    b.load_state_dict(state)
    ref = loader(packed["hdf5"], src)
    ref.set_epoch(1)
    full = list(ref)
    assert paths(head) + paths(list(b)) == paths(full)


@pytest.mark.parametrize("backend", BACKENDS)
def test_protocol_classes_and_describe(packed, photo_classes, backend):
    ld = loader(packed["lmdb"], *backend, batch_size=16)
    assert isinstance(ld, Loader) and isinstance(ld, TorchLoader if backend[0] == "torch"
                                                  else DaliLoader)
    assert ld.classes == photo_classes and all(isinstance(c, str) for c in ld.classes)
    assert ld.skipped == []
    batch = next(iter(ld))
    assert {ld.classes[i] for i in batch["label"].tolist()} <= set(photo_classes)
    assert all(p.split("/")[0] == ld.classes[i] for p, i in zip(batch["path"],
                                                                batch["label"].tolist(), strict=True))
    v = ld.describe()
    assert isinstance(v, LoaderView)
    assert (v.backend, v.format, v.codec, v.num_samples, v.batch_size, v.device) == \
        (backend[0], "lmdb", "jpeg", N_PHOTOS, 16, "cpu")
    assert v.num_workers == backend[1] and (v.prefetch_factor is None) == (backend[1] == 0)
    image = 32 * 32 * 3
    assert v.sample_bytes >= image
    assert (v.decode_threads > 0) == (backend[0] == "dali")


@pytest.mark.parametrize("backend", [pytest.param("torch"),
                                     pytest.param("dali", marks=needs_dali)])
def test_unlabeled_data_has_no_classes(photos, tmp_path, backend):
    flat = tmp_path / "flat"
    flat.mkdir()
    for p in photos[:10]:
        shutil.copy(p.path, flat / p.path.name.replace(".", f"-{p.label}."))
    convert(flat, tmp_path / "packed", to="lmdb", workers=0)
    ld = feedpipe.make_loader(tmp_path / "packed", 4, backend=backend, size=32, device="cpu",
                              num_workers=0, output=Output(dtype="uint8"))
    assert ld.classes == () and "label" not in next(iter(ld))


@pytest.mark.parametrize("backend", [pytest.param("torch"),
                                     pytest.param("dali", marks=needs_dali)])
def test_autotune_and_find_batch_size_on_either_backend(packed, backend):
    res = autotune(packed["lmdb"], 8, backend=backend, budget_cpus=1, trial_batches=3,
                   cache=False, size=32, device="cpu", output=Output(dtype="uint8"))
    assert [t.workers for t in res.trials][:2] == [0, 1]
    assert all(t.samples_per_s and t.samples_per_s > 0 for t in res.trials)
    assert res.num_workers in (0, 1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 4))
    bs = find_batch_size(model, packed["lmdb"], backend=backend, start=4, max_size=16, steps=1,
                         memory_budget=256 << 20, loader_workers=1, loader_prefetch=2, size=32,
                         device="cpu")
    assert bs.largest_fit == 16 and bs.loader_ram_bytes > 0


@needs_dali
def test_make_loader_tunes_the_dali_backend(packed):
    """workers=tuned() with backend="dali": autotune measures DALI's reader processes."""
    opts = dict(backend="dali", size=32, device="cpu", output=Output(dtype="uint8"))
    ld = feedpipe.make_loader(packed["lmdb"], 8, workers=tuned(), **opts)
    res = autotune(packed["lmdb"], 8, **opts)  # the same settings: what make_loader cached
    assert isinstance(ld, DaliLoader) and res.cached
    assert ld.describe().num_workers == res.num_workers
    assert sum(len(b["label"]) for b in ld) == N_PHOTOS


@pytest.mark.parametrize("backend", [pytest.param("torch"),
                                     pytest.param("dali", marks=needs_dali)])
def test_bench_and_monitor_on_either_backend(packed, backend):
    r = run_bench(packed["lmdb"], BenchConfig(backends=(backend,), workers=(0,),
                                              batch_sizes=(16,), size=32, batches=4))
    (row,) = r.trials
    assert (row.backend, row.status, row.samples, row.batches) == (backend, "ok", 64, 4)
    ld = loader(packed["lmdb"], backend, batch_size=16)
    meter = StallMeter()
    assert sum(len(b["label"]) for b in meter.wrap(ld)) == N_PHOTOS
    info = meter.loader_info
    assert info == LoaderInfo.from_loader(ld) and info.backend == backend
    assert (info.codec, info.format, info.batch_size, info.num_workers) == ("jpeg", "lmdb", 16, 0)
    bound = StallSummary(batches=100, samples=1600, wall_s=10.0, first_batch_s=0.5, wait_s=6.0,
                         step_s=3.0, input_bound=0.67, wait_p50_ms=60.0, wait_p95_ms=70.0,
                         wait_p99_ms=70.0, samples_per_s=160.0, verdict="input-bound", advice=())
    advice = " ".join(advise(bound, info))
    if backend == "dali":  # never "use DALI" to a DALI loader; its own threads are the decoders
        assert "backend='dali'" not in advice and "DALI pipeline decodes in its own" in advice
        assert "num_workers=0 decodes in the training process" not in advice
    else:
        assert "num_workers=0 decodes in the training process" in advice
