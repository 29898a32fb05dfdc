"""The peers harness rates the bare kernel and every contender by one rule:
no PSS sampling in a timed epoch (it costs ~9 ms of system time a sample, a fifth of a core at
10 Hz, which the kernel never paid), the peak PSS from untimed epochs, and the kernel's images/s
over its whole span. Runs the real harness on a few generated photos, feedpipe LMDB only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]


def test_timed_epochs_are_not_sampled_and_the_kernel_is_rated_by_its_span(tmp_path):
    out = tmp_path / "peers.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers" / "run.py"), "--images", "128",
         "--large-images", "0", "--rounds", "1", "--only", "lmdb", "--batch", "32",
         "--data", str(tmp_path / "data"), "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())["sets"]["photos"]
    fp = res["contenders"]["feedpipe LMDB"]
    assert fp["valid"] and len(fp["rounds"]) == 1
    timed = fp["rounds"][0]
    assert "peak_pss" not in timed  # a timed epoch runs without the sampler
    assert timed["images_per_s"] > 0 and timed["steady_images_per_s"] > 0
    assert 0 <= timed["main_cpu_s"] <= timed["cpu_s"] > 0  # the main process (10 ms ticks)
    assert fp["warmup"]["peak_pss"] > 0 and fp["memory_epoch"]["peak_pss"] > 0
    assert fp["peak_pss_mib"] * 2 ** 20 == max(fp["warmup"]["peak_pss"],
                                               fp["memory_epoch"]["peak_pss"])
    for k in res["kernel"]["1p"], res["kernel"]["2p"]:
        # every image over the whole span (not a sum of per-process rates)
        assert k["images"] == 128 and k["span_s"] > 0 and k["cpu_ms_per_image"] > 0
        assert k["images_per_s"] == pytest.approx(128 / k["span_s"])
