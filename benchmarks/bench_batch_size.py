"""``find_batch_size`` on a GPU: the batch size a ResNet-50 (bench_gpu's, AMP) trains at.

Runs the finder twice, ``mode="largest"`` then ``"fastest"``, on random 224² batches, and
records each search's trials, its wall time, and the device's total memory. Every trial is a
real forward + backward + SGD step; a size that raises CUDA's out-of-memory error counts as not
fitting. Without CUDA it runs on the CPU with a small ``--max-size`` (tests/test_bench_gpu.py).

    python benchmarks/bench_batch_size.py [--max-size 4096] [--size 224] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import resnet50  # noqa: E402
from harness import machine  # noqa: E402

from feedpipe.paths import write_atomic  # noqa: E402
from feedpipe.tools.tune import find_batch_size  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-size", type=int, default=4096)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/batch_size.json"))
    args = ap.parse_args()
    device = torch.device(args.device)
    model = resnet50().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def batch(n: int) -> dict[str, torch.Tensor]:
        image = torch.randn(n, 3, args.size, args.size, device=device)
        return {"image": image.contiguous(memory_format=torch.channels_last),
                "label": torch.randint(0, 1000, (n,), device=device)}

    runs = {}
    for mode in ("largest", "fastest"):
        t0 = time.perf_counter()
        res = find_batch_size(model, batch, optimizer=opt, amp=True, mode=mode,
                              max_size=args.max_size, device=device, progress=False,
                              start=min(8, args.max_size))
        runs[mode] = {**res.to_dict(), "search_s": time.perf_counter() - t0}
        print(f"mode={mode}: {res.batch_size} (largest fit {res.largest_fit}), "
              f"{len(res.trials)} trials in {runs[mode]['search_s']:.1f} s")
        print(res.report())
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" \
        else None
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.json, json.dumps({"machine": machine(), "device_total_bytes": total,
                                        "size": args.size, "runs": runs}, indent=1, default=str))


if __name__ == "__main__":
    main()
