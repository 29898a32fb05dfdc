"""``feedpipe.tuned()``: a loader's workers chosen by measurement, asked for explicitly
(``make_loader(..., workers=feedpipe.tuned())``): the option carries :func:`autotune` itself,
so the loader layer runs it without importing the tools above it."""

from __future__ import annotations

from ..loader.config import Tuned, Workers
from .tune import autotune


def tuned(*, budget_cpus: int | None = None, budget_ram: int | None = None,
          trial_batches: int = 24, tolerance: float = 0.05, repeats: int = 1,
          cache: bool = True, workers: Workers | None = None) -> Tuned:
    """``workers=feedpipe.tuned()``: ``num_workers`` and ``prefetch_factor`` measured by
    :func:`autotune` on the loader's own data before it starts, its arguments as there (cached
    per dataset and machine: the next run starts tuned); ``workers``: the other worker settings
    (a ``prefetch_factor`` there is kept fixed)."""
    return Tuned(autotune, {"budget_cpus": budget_cpus, "budget_ram": budget_ram,
                            "trial_batches": trial_batches, "tolerance": tolerance,
                            "repeats": repeats, "cache": cache}, workers or Workers())


__all__ = ["tuned"]
