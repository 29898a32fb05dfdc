"""What ``feedpipe doctor`` reports: a :class:`Finding` per observation, ranked by severity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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

