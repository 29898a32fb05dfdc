"""What the training thread pays per batch, measured without a GPU.

The training step of a real job ends in a CUDA sync, which releases the GIL; here a fake step
sleeps for as long (``time.sleep`` releases it too). For each case (JPEG or raw data, 1-2
workers, batch 64 or 256, normalized float32 output on the CPU device, and the nvJPEG path driven
by a CPU decoder in nvJPEG's place) it measures, per ``next()`` in the training thread:

- **cpu**: the training thread's CPU time (``time.thread_time``), median and p95;
- **wait**: the wall time ``next()`` took, median and p95, and each epoch's first batch's wait
  against the median (the epoch boundary);
- **calls**: Python function calls per batch (a ``sys.setprofile`` hook on the training thread
  only), and C calls beside them;
- **bytes**: bytes the training thread allocated inside ``next()`` (every copy needs a
  destination): numpy and Python buffers traced by ``tracemalloc`` whose stack runs through the
  training loop, and torch CPU allocations of ops run on the training thread
  (``torch.profiler``, ``profile_memory``);
- **fed**: the fed rate with a fake step of 1.2x the loader's own batch time (the loader alone,
  measured first in the same run) over the step's own rate.

    python benchmarks/bench_feed.py [--images 1024] [--batches 300] [--json FILE]
                                    [--cases jpeg-w2-b64,...]

Everything a case needs is generated in ``--data`` once (seeded photos, their LMDB packings).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import simplejpeg
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe import Output, Workers  # noqa: E402

SIZE = 128
STEP_OVER_LOADER = 1.2  # the fake step's length over the loader's own batch time


def cpu_decode(files: list[torch.Tensor]) -> list[torch.Tensor]:
    """Stands in for batched nvJPEG: 3xHxW uint8 per file (as tests/test_device_decode.py)."""
    return [torch.from_numpy(simplejpeg.decode_jpeg(f.numpy(), colorspace="RGB")).permute(2, 0, 1)
            for f in files]


def make_data(root: Path, images: int) -> dict[str, Path]:
    """Photos ~200x150 packed as LMDB twice: JPEG bytes as they are, and raw pixels at SIZE."""
    photos = root / f"feed-photos-{images}"
    if not photos.exists():
        make_photos(photos, images, size=(200, 150), classes=8, seed=5)
    out = {"jpeg": root / f"feed-jpeg-{images}", "raw": root / f"feed-raw-{images}"}
    if not out["jpeg"].exists():
        convert(photos, out["jpeg"], to="lmdb", workers=2)
    if not out["raw"].exists():
        convert(photos, out["raw"], to="lmdb", workers=2, store="raw", resize=(SIZE, SIZE))
    return out


def build(path: Path, kind: str, batch: int, workers: int) -> Any:
    """The loader of one case: float32 normalized, on the CPU device."""
    kw: dict[str, Any] = dict(size=SIZE, seed=0, num_workers=workers, device="cpu",
                              output=Output(dtype="float32"))
    if kind == "raw":
        return feedpipe.make_loader(path, batch, crop="none", flip=True, **kw)
    kw.update(crop="random_resized_crop", flip=True)
    if kind == "jpeg":
        return feedpipe.make_loader(path, batch, **kw)
    # nvJPEG's path with a CPU decoder in its place: workers ship encoded bytes and boxes
    from feedpipe.loader.api import LoaderConfig, TorchLoader, resolve
    from feedpipe.loader.sampler import World
    from feedpipe.loader.torch.device_decode import DeviceDecoder

    reader = feedpipe.open_dataset(path)
    cfg = resolve(LoaderConfig(batch, workers=Workers(decode_on="device"), **kw), reader)
    cpu = torch.device("cpu")
    return TorchLoader(reader, cfg, World(0, 1), cpu,
                       DeviceDecoder(cpu, cpu_decode))


def batches(loader: Any) -> Iterator[tuple[bool, Any]]:
    """The loader's batches across epochs, endlessly: (first batch of its epoch, batch). It keeps
    no reference to a batch it handed out, so a batch is freed where the caller lets go of it
    (after its step), not inside the next ``next()``."""
    while True:
        first, it = True, iter(loader)
        while True:
            try:
                held = [next(it)]
            except StopIteration:
                break
            yield first, held.pop()
            first = False


def loader_batch_time(stream: Iterator[tuple[bool, Any]], skip: int, n: int) -> float:
    """Seconds per batch of the loader alone (no step), over ``n`` batches, after ``skip`` (the
    batches it holds ready when the clock would start, which would come at once)."""
    for _ in range(skip):
        next(stream)
    t = time.perf_counter()
    for _ in range(n):
        next(stream)
    return (time.perf_counter() - t) / n


def fed(stream: Iterator[tuple[bool, Any]], n: int, step: float) -> dict[str, Any]:
    """``n`` batches each followed by a fake step of ``step`` seconds; per ``next()`` wait and
    training-thread CPU time, each epoch's first wait, and the fed rate over the step's own
    (the steps as they took, timed: a sleep overshoots on a busy machine, and that is the
    step's, not the loader's)."""
    waits, cpus, firsts, steps = [], [], [], []
    t0 = time.perf_counter()
    for _ in range(n):
        w, c = time.perf_counter(), time.thread_time()
        first, b = next(stream)
        cpus.append(time.thread_time() - c)
        waits.append(time.perf_counter() - w)
        if first:
            firsts.append(waits[-1])
        del b
        s = time.perf_counter()
        time.sleep(step)
        steps.append(time.perf_counter() - s)
    total = time.perf_counter() - t0
    med = statistics.median(waits)
    return {"cpu_ms_median": 1e3 * statistics.median(cpus), "cpu_ms_p95": 1e3 * p95(cpus),
            "wait_ms_median": 1e3 * med, "wait_ms_p95": 1e3 * p95(waits),
            "wait_ms_mean": 1e3 * statistics.fmean(waits),
            "first_wait_ms_median": 1e3 * statistics.median(firsts) if firsts else None,
            "first_wait_ms": [1e3 * f for f in firsts],
            "first_over_median_max": max(firsts) / med if firsts and med else None,
            "first_median_over_median": statistics.median(firsts) / med if firsts and med
            else None,
            "fed_over_step": sum(steps) / total, "step_ms": 1e3 * step,
            "step_ms_taken": 1e3 * statistics.fmean(steps)}


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


def calls(stream: Iterator[tuple[bool, Any]], n: int, step: float) -> dict[str, Any]:
    """Python and C function calls the training thread makes inside ``next()``, per batch."""
    counts = {"call": 0, "c_call": 0}
    names: dict[str, int] = {}

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event in counts:
            counts[event] += 1
            if event == "c_call":
                key = getattr(arg, "__qualname__", repr(arg))
            else:
                key = f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_code.co_name}"
            names[key] = names.get(key, 0) + 1

    for _ in range(n):
        sys.setprofile(hook)
        _, b = next(stream)
        sys.setprofile(None)
        del b
        time.sleep(step)
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    return {"python_calls_per_batch": counts["call"] / n, "c_calls_per_batch": counts["c_call"] / n,
            "most_called": [(k, v / n) for k, v in top]}


def torch_alloc_bytes(stream: Iterator[tuple[bool, Any]], n: int, step: float) -> float:
    """Bytes torch allocated on the CPU for top-level ops the profiler saw on the training
    thread inside ``next()``, per batch (the thread is found by a marker recorded on it)."""
    marker = "bench_feed.training_thread"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        with torch.profiler.record_function(marker):
            pass
        for _ in range(n):
            b = _one(stream)
            del b
            time.sleep(step)
    events = prof.events()
    me = next(e.thread for e in events if e.name == marker)
    return sum(max(0, e.cpu_memory_usage) for e in events
               if e.thread == me and e.cpu_parent is None and e.name != marker) / n


def _one(stream: Iterator[tuple[bool, Any]]) -> Any:
    return next(stream)[1]


_ONE_LINE = _one.__code__.co_firstlineno + 1


def numpy_alloc_bytes(stream: Iterator[tuple[bool, Any]], n: int, step: float) -> float:
    """Bytes numpy and Python allocated under :func:`_one` over ``n`` batches, counted as they
    are allocated (a domain filter: numpy registers its data buffers with tracemalloc)."""
    total = 0
    tracemalloc.start(64)
    for _ in range(n):
        tracemalloc.clear_traces()
        b = _one(stream)
        snap = tracemalloc.take_snapshot()
        total += sum(t.size for t in snap.traces
                     if any(f.filename == __file__ and f.lineno == _ONE_LINE
                            for f in t.traceback))
        del b
        time.sleep(step)
    tracemalloc.stop()
    return total / n


def run_case(name: str, path: Path, n: int) -> dict[str, Any]:
    kind, w, b = name.split("-")
    loader = build(path, kind, int(b[1:]), int(w[1:]))
    stream = batches(loader)
    for _ in range(3 * max(1, len(loader))):  # warm-up: workers up, caches and pages touched
        next(stream)
    ready = 2 * 4 + 4  # at most what workers and engine hold made: workers × prefetch + 4
    t_loader = loader_batch_time(stream, ready, max(60, 3 * len(loader)))
    step = STEP_OVER_LOADER * t_loader
    res: dict[str, Any] = {"loader_batch_ms": 1e3 * t_loader, "batches_per_epoch": len(loader)}
    res.update(fed(stream, n, step))
    res.update(calls(stream, 40, step))
    res["numpy_bytes_per_batch"] = numpy_alloc_bytes(stream, 20, step)
    res["torch_bytes_per_batch"] = torch_alloc_bytes(stream, 20, step)
    del stream, loader
    print(f"{name:<18} cpu {res['cpu_ms_median']:7.3f} ms (p95 {res['cpu_ms_p95']:7.3f})  wait "
          f"{res['wait_ms_median']:7.3f} ms (p95 {res['wait_ms_p95']:7.3f}, mean "
          f"{res['wait_ms_mean']:6.2f})  epoch's first "
          f"{res['first_wait_ms_median'] or 0:6.2f} ms (max/median "
          f"{res['first_over_median_max'] or 0:6.1f})  calls {res['python_calls_per_batch']:6.1f} "
          f"py {res['c_calls_per_batch']:6.1f} C  bytes {res['numpy_bytes_per_batch']:>12,.0f} np "
          f"{res['torch_bytes_per_batch']:>12,.0f} torch  fed/step "
          f"{res['fed_over_step']:.3f}", flush=True)
    return res


CASES = ["jpeg-w1-b64", "jpeg-w2-b64", "jpeg-w2-b256", "raw-w1-b64", "raw-w2-b64",
         "raw-w2-b256", "nvjpeg-w2-b64", "nvjpeg-w2-b256"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=300, help="fed batches timed per case")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/feed.json"))
    a = ap.parse_args(argv)
    data = make_data(a.data, a.images)
    out: dict[str, Any] = {}
    for name in a.cases.split(","):
        out[name] = run_case(name, data["raw" if name.startswith("raw") else "jpeg"], a.batches)
    save(a.json, [], {"cases": out, "args": {k: str(v) for k, v in vars(a).items()}})
    print(f"wrote {a.json}")
    return out


if __name__ == "__main__":
    main()
