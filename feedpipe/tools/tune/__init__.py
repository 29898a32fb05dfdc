"""Tuning by measurement: loader workers/prefetch (:func:`autotune`) and batch size
(:func:`find_batch_size`). ``make_loader(..., workers=feedpipe.tuned())`` runs
:func:`autotune` (``feedpipe/tools/tuned.py``)."""

from __future__ import annotations

from ..throughput import steady_rate
from .autotune import Trial, TuneResult, autotune, choose, measure
from .batch_size import BatchSizeResult, BatchTrial, find_batch_size, pick_size, search_batch_size
from .batches import default_step

__all__ = ["BatchSizeResult", "BatchTrial", "Trial", "TuneResult", "autotune", "choose",
           "default_step", "find_batch_size", "measure", "pick_size",
           "search_batch_size", "steady_rate"]
