"""The GPU side of the input pipeline, in one run on one device.

1. **Copy**: host → device GB/s of a uint8 batch from memory ``cudaHostAlloc`` pinned, from a
   shared-memory slot page-locked in place with ``cudaHostRegister`` (the loader's ring), and
   from pageable memory, against the link's peak (PCIe generation × width from NVML when
   ``nvidia-ml-py`` is installed); and what ``cudaHostRegister`` costs per GB.
2. **Decode**: nvJPEG (``torchvision.io.decode_jpeg(device="cuda")``) images/s against
   simplejpeg on one CPU core, on the same files.
3. **Loader**: ``make_loader`` epochs onto the device alone, at each ``--scale-workers`` count,
   decoding on the CPU workers (and with nvJPEG, and DALI, at ``--workers``).
4. **Training**: a ResNet-50 (torchvision's layout, written here: no torchvision needed) AMP
   step, channels-last fp16, fed by feedpipe: decoding on the CPU workers, with nvJPEG, and
   DALI's own pipeline (``backend="dali"``), at each ``--train-workers`` count; against the same
   step on a batch already on the device (the compute ceiling). Each fed run first takes
   ``--warmup`` batches (workers started, caches warm), then times ``--steps`` steps across
   epoch boundaries: the fed rate over the whole timed run and over its steady windows (no
   epoch boundary inside), the share of time spent waiting for data, and the GPU's idle gap
   before each step from CUDA events (the end of one step's work to the start of the next's).

Without CUDA it runs on the CPU with whatever is asked of it, and says which parts it skipped:
that is how the test suite keeps it working (tests/test_bench_gpu.py).

    python benchmarks/bench_gpu.py [--images 8192] [--batch 256] [--steps 100] [--warmup 12]
                                   [--train-workers 8,15] [--scale-workers 1,2,4,8,12,15]
                                   [--device cuda] [--data bench-data] [--json FILE]
                                   [--parts copy,decode,loader,training]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import simplejpeg
import torch
from torch import nn

from feedpipe import Output, Workers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.loader.dali.pipeline import import_dali  # noqa: E402
from feedpipe.loader.torch.device_decode import nvjpeg  # noqa: E402

#: PCIe GB/s per lane and direction after line encoding, by generation
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def link_peak(device: torch.device) -> tuple[float | None, str]:
    """The host link's peak GB/s and how it was found (NVML's current PCIe gen and width)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        gen, width = (pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                      pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))
        return PCIE_LANE_GBPS[gen] * width, f"PCIe gen {gen} x{width} (NVML)"
    except Exception as exc:  # noqa: BLE001 - no NVML: the measured copies stand alone
        return None, f"unknown ({exc.__class__.__name__}: {exc})"


def copy_rates(device: torch.device, batch: int, size: int, repeats: int) -> dict[str, Any]:
    """GB/s of one uint8 batch copied host → device on a side stream: from cudaHostAlloc'd
    pinned memory, from a shared-memory buffer page-locked in place (cudaHostRegister, as the
    loader's ring), from pageable memory; and cudaHostRegister's seconds per GB."""
    if device.type != "cuda":
        return {"skipped": f"device is {device.type}: no host-to-device link to measure"}
    nbytes = batch * 3 * size * size
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    shm = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
    shm.zero_()  # faulted in first, as the ring does
    cudart = torch.cuda.cudart()
    t = time.perf_counter()
    err = cudart.cudaHostRegister(shm.data_ptr(), nbytes, 0)
    register_s = time.perf_counter() - t
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    out: dict[str, Any] = {"bytes": nbytes, "cudaHostRegister_error": int(err),
                           "cudaHostRegister_s_per_GB": register_s / (nbytes / 1e9)}
    sources = [("cudaHostAlloc pinned, side stream", pinned, stream),
               ("pageable, side stream", pageable, stream)]
    if int(err) == 0:
        sources.insert(1, ("/dev/shm registered in place, side stream", shm, stream))
    for name, src, on in sources:
        with torch.cuda.stream(on):
            dst.copy_(src, non_blocking=True)  # warm-up
            sync(device)
            t = time.perf_counter()
            for _ in range(repeats):
                dst.copy_(src, non_blocking=True)
            sync(device)
        out[name] = nbytes * repeats / (time.perf_counter() - t) / 1e9
    if int(err) == 0:
        cudart.cudaHostUnregister(shm.data_ptr())
    peak, how = link_peak(device)
    out.update(peak_gbps=peak, peak_from=how,
               pinned_share_of_peak=out["cudaHostAlloc pinned, side stream"] / peak if peak
               else None)
    return out


def decode_rates(files: list[bytes], device: torch.device, repeats: int) -> dict[str, Any]:
    """Images/s of nvJPEG (batched, on ``device``) against simplejpeg on one CPU core."""
    t = time.perf_counter()
    for _ in range(repeats):
        for f in files:
            simplejpeg.decode_jpeg(f, colorspace="RGB")
    out: dict[str, Any] = {"cpu 1 core": len(files) * repeats / (time.perf_counter() - t)}
    found = nvjpeg(device)
    if isinstance(found, str):
        out["nvjpeg"] = f"skipped: {found}"
        return out
    tensors = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    found.decode(tensors)  # warm-up: nvJPEG's handles and buffers
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        found.decode(tensors)
    sync(device)
    out["nvjpeg"] = len(files) * repeats / (time.perf_counter() - t)
    out["nvjpeg over cpu 1 core"] = out["nvjpeg"] / out["cpu 1 core"]
    return out


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (the stride on the 3×3 convolution), as torchvision's."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(classes: int = 1000) -> nn.Module:
    """ResNet-50: stages of 3, 4, 6 and 3 bottlenecks, 25.6 M parameters at 1000 classes."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def train_step(device: torch.device, classes: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One SGD step of ResNet-50 under autocast (bf16 on CPU, fp16 with a grad scaler on CUDA),
    channels-last, on normalized float input."""
    model = resnet50(classes).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    loss_fn = nn.CrossEntropyLoss()

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=half):
            loss = loss_fn(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def loader(path: Path, device: torch.device, batch: int, size: int, workers: int,
           decode_on: str, dtype: str = "uint8", backend: str = "torch") -> Any:
    return feedpipe.make_loader(path, batch, size=size, crop="random_resized_crop", flip=True,
                                device=device, num_workers=workers, seed=0, backend=backend,
                                output=Output(dtype=dtype, channels_last=dtype != "uint8"),
                                workers=Workers(decode_on=decode_on))


def feeds(device: torch.device) -> list[tuple[str, str, str]]:
    """(name, decode_on, backend) of each way to feed the step, and why one is left out."""
    out = [("cpu decode", "cpu", "torch")]
    missing = nvjpeg(device)
    out.append(("nvjpeg", "device", "torch") if not isinstance(missing, str)
               else ("nvjpeg", f"skipped: {missing}", ""))
    try:
        import_dali()
        out.append(("dali", "auto", "dali"))
    except Exception as exc:  # noqa: BLE001 - a missing or broken DALI is reported, not fatal
        out.append(("dali", f"skipped: {exc.__class__.__name__}: {exc}", ""))
    return out


def endless(ld: Any) -> Iterator[tuple[bool, Any]]:
    """The loader's batches across epochs: (first of its epoch, batch)."""
    while True:
        first = True
        for b in ld:
            yield first, b
            first = False


def loader_rates(path: Path, device: torch.device, batch: int, size: int, workers: list[int],
                 at: int, batches: int) -> dict[str, Any]:
    """Images/s of the loader alone onto the device (nothing else in the loop), over
    ``batches`` batches after a warm-up: decoding on the CPU workers at each count in
    ``workers``, and nvJPEG and DALI at ``at`` workers."""
    out: dict[str, Any] = {}
    runs = [(f"cpu decode, {w} workers", w, "cpu", "torch") for w in workers]
    runs += [(f"{name}, {at} workers", at, decode_on, backend)
             for name, decode_on, backend in feeds(device)[1:]]
    for name, w, decode_on, backend in runs:
        if decode_on.startswith("skipped"):
            out[name] = decode_on
            continue
        ld = loader(path, device, batch, size, w, decode_on, backend=backend)
        stream = endless(ld)
        for _ in range(max(4, 2 * w)):  # warm-up: workers up, first batches made
            next(stream)
        n, t = 0, time.perf_counter()
        for _ in range(batches):
            n += len(next(stream)[1]["label"])
        sync(device)
        out[name] = n / (time.perf_counter() - t)
        ld.close()
    return out


def training(path: Path, device: torch.device, batch: int, size: int, workers: list[int],
             steps: int, warmup: int, classes: int) -> dict[str, Any]:
    """A ResNet-50 AMP step fed by feedpipe, per way of feeding it and worker count, against the
    same step on data already on the device (the images/s the loader has to keep up with)."""
    step = train_step(device, classes)
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (batch,), device=device)
    for _ in range(3):  # warm-up: cuDNN autotune, allocator
        step(x, y)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    sync(device)
    ceiling = batch * steps / (time.perf_counter() - t)
    out: dict[str, Any] = {"compute ceiling images/s": ceiling}
    dtype = "float16" if device.type == "cuda" else "float32"
    for name, decode_on, backend in feeds(device):
        for w in workers:
            key = f"{name}, {w} workers"
            if decode_on.startswith("skipped"):
                out[key] = decode_on
                continue
            t0 = time.perf_counter()
            ld = loader(path, device, batch, size, w, decode_on, dtype, backend)
            out[key] = fed_run(ld, step, device, steps, warmup, ceiling, t0)
            ld.close()
            print(f"  {key}: {out[key]}", flush=True)
    return out


def fed_run(ld: Any, step: Callable[[torch.Tensor, torch.Tensor], None], device: torch.device,
            steps: int, warmup: int, ceiling: float, t0: float) -> dict[str, Any]:
    """``warmup`` fed steps (not timed: start-up), then ``steps`` timed ones across epoch
    boundaries; the rates, the wait share, and the GPU's idle gaps between steps."""
    stream = endless(ld)
    for _ in range(warmup):
        _, b = next(stream)
        step(b["image"], b["label"])
    sync(device)
    whole_start = time.perf_counter() - t0  # start-up and warm-up: the whole pass's extra
    cuda = device.type == "cuda"
    marks: list[tuple[Any, Any]] = []
    waits, firsts, times, n = [], [], [], 0
    t = time.perf_counter()
    for _ in range(steps):
        w = time.perf_counter()
        first, b = next(stream)
        waits.append(time.perf_counter() - w)
        firsts.append(first)
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        step(b["image"], b["label"])
        if cuda:
            end.record()
            marks.append((begin, end))
        n += len(b["label"])
        times.append(time.perf_counter())
    sync(device)
    timed = time.perf_counter() - t
    ends = np.array(times)
    rate = n / timed
    # steady windows: from one epoch's second batch to its last (no boundary, no start-up)
    steady = []
    starts = [i for i, f in enumerate(firsts) if f] + [len(firsts)]
    for a, z in pairwise(starts):
        if z - a > 3:
            steady.append((z - a - 2) * len(b["label"]) / (ends[z - 1] - ends[a]))
    res: dict[str, Any] = {
        "fed_images_per_s": rate, "fed_over_ceiling": rate / ceiling,
        "steady_over_ceiling": float(np.median(steady)) / ceiling if steady else None,
        "whole_pass_over_ceiling": n / (timed + whole_start) / ceiling,
        "wait_share": sum(waits) / timed, "wait_p50_ms": 1e3 * float(np.median(waits)),
        "wait_p95_ms": 1e3 * float(np.percentile(waits, 95)),
        "epoch_first_wait_ms": [1e3 * w for w, f in zip(waits, firsts, strict=True) if f],
        "startup_and_warmup_s": whole_start}
    if marks:  # idle: from one step's end on the GPU to the next step's start
        gaps = [prev[1].elapsed_time(cur[0]) for prev, cur in pairwise(marks)]
        res.update(gpu_idle_gap_ms_p50=float(np.median(gaps)),
                   gpu_idle_gap_ms_p95=float(np.percentile(gaps, 95)))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=8192, help="~500x375 photos")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=100, help="training steps timed")
    ap.add_argument("--warmup", type=int, default=12, help="fed steps before the timing")
    ap.add_argument("--loader-batches", type=int, default=60, help="loader-alone batches timed")
    ap.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)),
                    help="workers of the nvJPEG and DALI loader-alone runs")
    ap.add_argument("--train-workers", default=None,
                    help="worker counts of the fed runs (default: --workers)")
    ap.add_argument("--scale-workers", default=None,
                    help="worker counts of the loader-alone runs (default: --workers)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/gpu.json"))
    ap.add_argument("--parts", default="copy,decode,loader,training",
                    help="which parts to run (comma-separated)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))

    def counts(spec: str | None) -> list[int]:
        return [int(w) for w in spec.split(",")] if spec else [a.workers]

    device = torch.device(a.device)
    m = machine()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU (CPU run)"
    print(f"device: {name}; host: {m['cpu']}, {m['usable_cores']} usable cores, torch "
          f"{m['torch']}", flush=True)
    photos = a.data / f"gpu-photos-{a.images}"
    if not photos.exists():
        make_photos(photos, a.images, size=(500, 375), classes=10, seed=3)
    packed = a.data / f"gpu-lmdb-{a.images}"
    if not packed.exists():
        convert(photos, packed, to="lmdb", workers=0)
    files = [p.read_bytes() for p in sorted(photos.rglob("*.jpg"))]
    res: dict[str, Any] = {"device": name}
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "copy": lambda: copy_rates(device, a.batch, a.size, repeats=20),
        "decode": lambda: decode_rates(files[:2048], device, repeats=2),
        "loader": lambda: loader_rates(packed, device, a.batch, a.size,
                                       counts(a.scale_workers), a.workers, a.loader_batches),
        "training": lambda: training(packed, device, a.batch, a.size, counts(a.train_workers),
                                     a.steps, a.warmup, classes=10)}
    for part, run in runs.items():
        if part in parts:
            res[part] = run()
            print(f"{part}:", res[part], flush=True)
    save(a.json, [], {**res, "args": {k: str(v) for k, v in vars(a).items()},
                      "images": len(files), "mean_bytes": float(np.mean([len(f) for f in files]))})
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
