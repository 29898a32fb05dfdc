"""The batch-size search's parts that need no model: its trials and result, the doubling then
bisecting search, the final pick, and the progress line (:mod:`.batch_size` runs the trials)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Literal

import torch

Mode = Literal["largest", "fastest"]


@dataclass(frozen=True)
class BatchTrial:
    """One trial at ``size``: its peak memory (bytes; None when not run) and training speed."""

    size: int
    ok: bool
    peak_bytes: int | None
    samples_per_s: float | None
    note: str = ""
    seconds: float | None = None  # the trial's wall time (None: not run)


@dataclass(frozen=True)
class BatchSizeResult:
    """The chosen batch size, the largest that fitted, and every trial that led there."""

    batch_size: int
    largest_fit: int
    mode: Mode
    device: str
    budget_bytes: int | None
    loader_ram_bytes: int
    trials: tuple[BatchTrial, ...]
    reason: str
    time_budget_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)

    def report(self) -> str:
        """The trials as a table, then the choice and why."""
        rows = [f"{'size':>6} {'peak MiB':>9} {'samples/s':>10}  result"]
        for t in self.trials:
            peak = "-" if t.peak_bytes is None else f"{t.peak_bytes / 2**20:.1f}"
            sps = "-" if t.samples_per_s is None else f"{t.samples_per_s:.0f}"
            rows.append(f"{t.size:>6} {peak:>9} {sps:>10}  {'ok' if t.ok else 'oom'}"
                        + (f" ({t.note})" if t.note else ""))
        return "\n".join(rows + [self.reason])


def search_batch_size(fits: Callable[[int], bool], *, max_size: int, start: int = 1,
                      resolution: float = 1 / 32) -> int:
    """Largest size in [1, max_size] for which ``fits`` holds (0 if none), assuming it is monotone.

    Doubles from ``start`` until a size fails, then bisects between the last fit and the first
    failure until the gap is within ``resolution`` of the fitting size. Never tries a size above
    a known failure.
    """
    lo, hi, size = 0, None, start
    while hi is None:
        if not fits(size):
            hi = size
        elif size >= max_size:
            return size
        else:
            lo, size = size, min(2 * size, max_size)
    while hi - lo > max(1, int(lo * resolution)):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def pick_size(trials: list[BatchTrial], largest: int, mode: Mode,
              margin: float) -> tuple[int, str]:
    """(size, why): ``largest`` less ``margin``, or with ``mode="fastest"`` the trial with the best
    samples/s among those that fitted at or below that cap."""
    cap = max(1, math.floor(largest * (1 - margin)))
    if mode == "fastest":
        ok = [t for t in trials if t.ok and t.size <= cap and t.samples_per_s]
        if ok:
            best = max(ok, key=lambda t: t.samples_per_s or 0.0)
            return best.size, (f"fastest fitting size within the {margin:.0%} margin (cap {cap}):"
                               f" {best.size} at {best.samples_per_s:.0f} samples/s")
    return cap, f"largest fit {largest} less {margin:.0%} margin: {cap}"


def progress_bar(device: torch.device, budget: int | None, seconds: float | None) -> Any:
    """The progress line (stderr): a trial per tick, the last trial's verdict beside it."""
    from tqdm import tqdm

    caps = [f"{budget / 2**20:,.0f} MiB" if budget else "", f"{seconds:.0f} s" if seconds else ""]
    caps = [c for c in caps if c]
    return tqdm(total=None, unit="trial", dynamic_ncols=True, desc=f"find_batch_size on "
                f"{device.type}" + (f" (within {', '.join(caps)})" if caps else ""))


def trial_text(t: BatchTrial) -> str:
    """One trial for the progress line."""
    if t.ok:
        return f"batch {t.size}: ok, {t.samples_per_s:,.0f} samples/s, peak " \
               f"{(t.peak_bytes or 0) / 2**20:,.0f} MiB"
    return f"batch {t.size}: does not fit ({t.note or 'out of memory'})"
