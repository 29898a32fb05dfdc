"""benchmarks/bench_gpu.py kept working on a machine without a GPU: its
ResNet-50 is torchvision's, and a tiny CPU run goes through every part, saying what it skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_resnet50_has_torchvisions_layout():
    sys.path.insert(0, str(BENCH))
    import bench_gpu

    model = bench_gpu.resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's resnet50
    assert model(torch.zeros(1, 3, 64, 64)).shape == (1, 1000)


@pytest.mark.heavy  # a full run of the tool on CPU (10-17 s): the heavy tier
def test_cpu_run_measures_what_it_can_and_names_what_it_skipped(tmp_path):
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, str(BENCH / "bench_gpu.py"), "--device", "cpu",
                    "--images", "24", "--batch", "4", "--size", "64", "--steps", "8",
                    "--warmup", "2", "--loader-batches", "3", "--workers", "1",
                    "--scale-workers", "1,2", "--data", str(tmp_path), "--json", str(out)],
                   check=True, timeout=300)
    res = json.loads(out.read_text())
    assert res["device"] == "no GPU (CPU run)" and res["images"] == 24
    assert res["copy"]["skipped"].startswith("device is cpu")
    assert res["decode"]["cpu 1 core"] > 0 and res["decode"]["nvjpeg"].startswith("skipped")
    loader = res["loader"]
    assert loader["cpu decode, 1 workers"] > 0 and loader["cpu decode, 2 workers"] > 0
    assert loader["nvjpeg, 1 workers"].startswith("skipped")
    t = res["training"]
    assert t["compute ceiling images/s"] > 0 and t["nvjpeg, 1 workers"].startswith("skipped")
    fed = t["cpu decode, 1 workers"]
    assert fed["fed_images_per_s"] > 0 and 0 <= fed["wait_share"] <= 1
    assert 0 < fed["fed_over_ceiling"] and fed["whole_pass_over_ceiling"] < fed["fed_over_ceiling"]
    assert len(fed["epoch_first_wait_ms"]) >= 1  # 8 steps of 4 over 24 images: boundaries
    assert "gpu_idle_gap_ms_p50" not in fed  # CUDA events only on CUDA
    # DALI (CPU mode here) is the peer fed in the same run, where it imports
    dali = t["dali, 1 workers"]
    assert dali.startswith("skipped") if isinstance(dali, str) else dali["fed_images_per_s"] > 0


@pytest.mark.heavy  # a full run of the tool on CPU (10-17 s): the heavy tier
def test_batch_size_bench_runs_both_modes_on_cpu(tmp_path):
    """benchmarks/bench_batch_size.py, which a lent GPU runs (benchmarks/device_check.sh)."""
    out = tmp_path / "bs.json"
    subprocess.run([sys.executable, str(BENCH / "bench_batch_size.py"), "--device", "cpu",
                    "--max-size", "16", "--size", "64", "--json", str(out)], check=True,
                   timeout=300)
    runs = json.loads(out.read_text())["runs"]
    assert runs["largest"]["largest_fit"] == 16 and runs["largest"]["batch_size"] == 14
    assert runs["fastest"]["batch_size"] in (8, 14)
    assert all(t["ok"] and t["peak_bytes"] > 0 for t in runs["largest"]["trials"])
