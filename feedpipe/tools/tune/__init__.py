"""Tuning by measurement: loader workers/prefetch (:func:`autotune`) and batch size
(:func:`find_batch_size`). A leaf: the core imports it only for ``num_workers="tune"``."""

from __future__ import annotations

from .autotune import Trial, TuneResult, autotune, choose, measure, steady_rate
from .batch_size import BatchSizeResult, BatchTrial, find_batch_size, pick_size, \
    search_batch_size
from .batches import default_step

__all__ = ["BatchSizeResult", "BatchTrial", "Trial", "TuneResult", "autotune", "choose",
           "default_step", "find_batch_size", "measure", "pick_size",
           "search_batch_size", "steady_rate"]
