"""The part of ``DataLoader``'s surface a feedpipe loader offers: Lightning's ``set_epoch`` on
``loader.sampler``, and the batch sampler's tokens (a ``SkipBatchSampler`` skips them, reading
nothing) that ``loader.dataset`` answers with the loader's own batches.
"""

from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Protocol

from torch.utils.data import Dataset

from ..dataset.formats.base import DatasetReader
from .config import LoaderConfig
from .sampler import PlanSampler


class Positioned(Protocol):
    """What the surface uses of a loader (:class:`~feedpipe.loader.position.EpochPosition`)."""

    config: LoaderConfig
    reader: DatasetReader
    planner: PlanSampler
    _epoch: int

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def _seek(self, epoch: int, number: int) -> None: ...


class BatchToken(NamedTuple):
    """Batch ``number`` of ``epoch``'s plan on this rank: what the batch sampler yields."""

    epoch: int
    number: int


def batch_as_is(batch: Any) -> Any:
    """``loader.collate_fn``: batches come out of the loader already collated."""
    return batch


class LoaderSampler:
    """``loader.sampler`` and ``loader.batch_sampler`` (one object): a token per batch."""

    def __init__(self, loader: Positioned) -> None:
        self._loader = weakref.proxy(loader)  # no cycle: a dropped loader is freed at once

    @property
    def sampler(self) -> "LoaderSampler":  # where Lightning also looks for set_epoch
        return self

    @property
    def batch_size(self) -> int:
        return self._loader.config.batch_size

    @property
    def drop_last(self) -> bool:
        return self._loader.config.drop_last

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[BatchToken]:
        """Tokens for every batch of the epoch's plan, numbered from its first."""
        loader = self._loader
        epoch = loader._epoch
        return (BatchToken(epoch, n) for n in range(len(loader.planner.plan(epoch))))


class LoaderBatches(Dataset[Any]):
    """``loader.dataset``: tokens answered with the loader's batches from one iteration, which a
    token out of order (after a skip) restarts there. ``len()`` counts samples."""

    def __init__(self, loader: Positioned) -> None:
        self._loader = weakref.proxy(loader)
        self._it: Iterator[dict[str, Any]] | None = None
        self._next: BatchToken | None = None

    def __len__(self) -> int:
        return len(self._loader.reader)

    def __getitems__(self, token: BatchToken) -> dict[str, Any]:
        if not isinstance(token, BatchToken):
            raise TypeError(f"loader.dataset serves the batches of loader.batch_sampler, not "
                            f"{token!r}: iterate the loader itself")
        if self._it is None or token != self._next:
            self._loader._seek(token.epoch, token.number)
            self._it = iter(self._loader)
        self._next = BatchToken(token.epoch, token.number + 1)
        batch = next(self._it)
        if self._loader._epoch != token.epoch:  # that was the epoch's last batch
            self._it = self._next = None  # (the suspended iteration refers to the loader)
        return batch

    def __getitem__(self, index: Any) -> Any:
        raise TypeError("a feedpipe loader yields whole batches made in its workers, not single "
                        "samples: iterate the loader (for one sample's stored fields, use "
                        "feedpipe.open_dataset(path)[index])")


@contextmanager
def in_gradient_state(loader: Any) -> Iterator[None]:
    """While an epoch is handed out, ``loader`` is accelerate's active dataloader when an
    ``Accelerator`` exists (``gather_for_metrics`` drops the padding, ``accumulate`` steps on
    the last batch); accelerate is never imported here."""
    module = sys.modules.get("accelerate.state")
    cls = getattr(module, "GradientState", None)
    if cls is None or not getattr(cls, "_shared_state", None):
        yield
        return
    state = cls()
    state._add_dataloader(loader)
    try:
        yield
    finally:
        state._remove_dataloader(loader)
