"""The GPU side of the input pipeline, in one run on one device.

1. **Copy**: host → device GB/s of a uint8 batch from pinned memory on a side stream (what
   ``make_loader(device="cuda")`` does), and from pageable memory, against the link's peak
   (PCIe generation × width from NVML when ``nvidia-ml-py`` is installed).
2. **Decode**: nvJPEG (``torchvision.io.decode_jpeg(device="cuda")``, feedpipe's
   ``Workers(decode_on="device")``) images/s against simplejpeg on one CPU core, on the same files.
3. **Loader**: ``make_loader`` epochs onto the device, decoding on the CPU workers and on the
   device.
4. **Training**: a ResNet-50 (torchvision's layout, written here: no torchvision needed) AMP step
   fed by feedpipe (decoding as ``decode_on="auto"`` picks, on the CPU workers, and on the
   device), with the stall meter's share of time spent waiting for data, against the same step
   on a batch already on the device (the compute ceiling).

Without CUDA it runs on the CPU with whatever is asked of it, and says which parts it skipped:
that is how the test suite keeps it working (tests/test_bench_gpu.py).

    python benchmarks/bench_gpu.py [--images 2048] [--batch 256] [--steps 50] [--workers N]
                                   [--device cuda] [--data bench-data] [--json FILE]
                                   [--parts copy,decode,loader,training]

With few batches an epoch, each epoch's start (the workers decoding its first batches while the
step waits) weighs on the training figure: give it ``--images`` for many batches an epoch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

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
from feedpipe.loader.torch.device_decode import nvjpeg  # noqa: E402
from feedpipe.tools.monitor import StallMeter  # noqa: E402

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
    """GB/s of one uint8 batch copied host → device: pinned on a side stream, and pageable."""
    if device.type != "cuda":
        return {"skipped": f"device is {device.type}: no host-to-device link to measure"}
    nbytes = batch * 3 * size * size
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    out: dict[str, Any] = {"bytes": nbytes}
    for name, src, on in (("pinned, side stream", pinned, stream),
                          ("pageable, default stream", pageable, None)):
        with torch.cuda.stream(on) if on is not None else torch.cuda.device(device):
            dst.copy_(src, non_blocking=True)  # warm-up
            sync(device)
            t = time.perf_counter()
            for _ in range(repeats):
                dst.copy_(src, non_blocking=True)
            sync(device)
        out[name] = nbytes * repeats / (time.perf_counter() - t) / 1e9
    peak, how = link_peak(device)
    out.update(peak_gbps=peak, peak_from=how,
               pinned_share_of_peak=out["pinned, side stream"] / peak if peak else None)
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
           decode_on: str, dtype: str = "uint8") -> Any:
    return feedpipe.make_loader(path, batch, size=size, crop="random_resized_crop", flip=True,
                                device=device, num_workers=workers, seed=0,
                                output=Output(dtype=dtype, channels_last=dtype != "uint8"),
                                workers=Workers(decode_on=decode_on))


def loader_rates(path: Path, device: torch.device, batch: int, size: int, workers: int,
                 epochs: int) -> dict[str, Any]:
    """Images/s of loader epochs onto the device, decoding on CPU workers and on the device."""
    out: dict[str, Any] = {}
    missing = nvjpeg(device)
    for decode_on in ("cpu", "device"):
        if decode_on == "device" and isinstance(missing, str):
            out[f"decode_on={decode_on}"] = f"skipped: {missing}"
            continue
        ld = loader(path, device, batch, size, workers, decode_on)
        for _ in ld:  # warm-up epoch: workers up, nvJPEG initialized
            pass
        n, t = 0, time.perf_counter()
        for _ in range(epochs):
            for b in ld:
                n += len(b["label"])
        sync(device)
        out[f"decode_on={decode_on}"] = n / (time.perf_counter() - t)
    return out


def training(path: Path, device: torch.device, batch: int, size: int, workers: int,
             steps: int, classes: int) -> dict[str, Any]:
    """The stall share of a ResNet-50 AMP step fed by feedpipe, decoding on the CPU workers, on
    the device and as ``decode_on="auto"`` picks; and the step alone on data already on the
    device (the images/s the loader has to keep up with)."""
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
    missing = nvjpeg(device)
    for decode_on in ("auto", "cpu", "device"):
        if decode_on == "device" and isinstance(missing, str):
            out[f"decode_on={decode_on}"] = f"skipped: {missing}"
            continue
        ld = loader(path, device, batch, size, workers, decode_on,
                    dtype="float16" if device.type == "cuda" else "float32")
        meter = StallMeter()
        done = 0
        with meter:
            while done < steps:
                for b in meter.wrap(ld):
                    step(b["image"], b["label"])
                    done += 1
                    if done == steps:
                        break
        s = meter.summary()
        out[f"decode_on={decode_on}"] = {
            "fed_images_per_s": s.samples_per_s, "stall_share": s.input_bound,
            "fed_over_ceiling": s.samples_per_s / ceiling, "wait_p95_ms": s.wait_p95_ms,
            "verdict": s.verdict}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=2048, help="~500x375 photos")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=50, help="training steps timed")
    ap.add_argument("--epochs", type=int, default=2, help="loader epochs timed")
    ap.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/gpu.json"))
    ap.add_argument("--parts", default="copy,decode,loader,training",
                    help="which parts to run (comma-separated)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
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
        "decode": lambda: decode_rates(files, device, repeats=2),
        "loader": lambda: loader_rates(packed, device, a.batch, a.size, a.workers, a.epochs),
        "training": lambda: training(packed, device, a.batch, a.size, a.workers, a.steps,
                                     classes=10)}
    for part, run in runs.items():
        if part in parts:
            res[part] = run()
            print(f"{part}:", res[part], flush=True)
    save(a.json, [], {**res, "args": {k: str(v) for k, v in vars(a).items()},
                      "images": len(files), "mean_bytes": float(np.mean([len(f) for f in files]))})
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
