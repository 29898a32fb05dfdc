"""Tuning by measurement: loader workers/prefetch (:func:`autotune`) and batch size
(:func:`find_batch_size`). ``make_loader(..., workers=feedpipe.tuned())`` runs
:func:`autotune` (``feedpipe/tools/tuned.py``)."""

from __future__ import annotations

from .autotune import TuneResult, autotune, measure
from .batch_size import BatchSizeResult, find_batch_size

__all__ = ["BatchSizeResult", "TuneResult", "autotune", "find_batch_size", "measure"]
