"""What the diagnosis tells the user, decided once: a :class:`Finding` per observation (ranked by
severity), the DALI hint and the line comparing feedpipe with the DataLoader baselines. ``doctor``,
``StallMeter``'s advice and ``feedpipe bench`` print these; none words them itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "high", "medium", "low", "info", "ok"]
RANK = {"error": 0, "high": 1, "medium": 2, "low": 3, "info": 4, "ok": 5}


@dataclass(frozen=True)
class Finding:
    """One observation: what was checked, how much it matters, how to fix it, what it gains."""

    check: str
    severity: Severity
    title: str
    fix: str = ""
    gain: str = ""

    def __str__(self) -> str:
        out = f"[{self.severity.upper()}] {self.check}: {self.title}"
        out += f"\n    fix: {self.fix}" if self.fix else ""
        return out + (f"\n    expected gain: {self.gain}" if self.gain else "")


def dali_hint(cuda_version: str | None, installed: bool) -> str:
    """How to decode JPEG on the GPU with DALI: the option, and the wheel for ``cuda_version``
    (torch's CUDA build; None: the driver's) unless DALI is ``installed``."""
    from ..loader.dali.pipeline import dali_package

    pkg, how = dali_package(cuda_version)
    return ("decode JPEG on the GPU with NVIDIA DALI: `make_loader(..., backend='dali')` ("
            + ("nvidia-dali is installed here)" if installed
               else f"pip install {pkg} first, the wheel for {how})"))


def versus_baselines(report: Any) -> str:
    """How a :class:`~feedpipe.tools.benchreport.BenchReport`'s best trial compares with the
    default DataLoader (workers=0) and the tuned one (workers, persistent, prefetch) in the same
    run, naming both, so the ratio against workers=0 is not read as the gain over a tuned
    DataLoader; empty without a baseline."""
    base, tuned = report.baseline, report.tuned
    if not report.speedup:
        return ""
    line = f"{report.speedup:.1f}x a default DataLoader (workers=0, PIL)"
    if tuned is not None and report.speedup_vs_tuned:
        line += (f" and {report.speedup_vs_tuned:.2f}x a tuned one ({tuned.workers} workers, "
                 "persistent, prefetch 4)")
    return line + f" on the {base.source}, in this run"
