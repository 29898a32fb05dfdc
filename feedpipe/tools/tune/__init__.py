"""Tuning by measurement: loader workers/prefetch (:func:`autotune`) and batch size
(:func:`find_batch_size`). Importing it installs :func:`autotune` as what
``make_loader(num_workers="tune")`` runs (:func:`feedpipe.loader.api.set_tuner`)."""

from __future__ import annotations

from ...loader.api import set_tuner
from ..throughput import steady_rate
from .autotune import Trial, TuneResult, autotune, choose, measure
from .batch_size import BatchSizeResult, BatchTrial, find_batch_size, pick_size, search_batch_size
from .batches import default_step

set_tuner(autotune)

__all__ = ["BatchSizeResult", "BatchTrial", "Trial", "TuneResult", "autotune", "choose",
           "default_step", "find_batch_size", "measure", "pick_size",
           "search_batch_size", "steady_rate"]
