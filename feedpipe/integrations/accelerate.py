"""accelerate: ``train, val = prepare(accelerator, model, optimizer, train, val)`` makes each
feedpipe loader an :class:`AcceleratedLoader`; other objects go to ``accelerator.prepare``
(docs/trainers.md)."""

from __future__ import annotations

from typing import Any, Iterator

from ..errors import MissingDependencyError
from ..loader.position import EpochPosition
from ..loader.surface import LoaderBatches, LoaderSampler
from ..tools.monitor import StallMeter

try:
    from accelerate.state import GradientState
except ImportError as exc:
    raise MissingDependencyError("feedpipe.integrations.accelerate needs accelerate: pip "
                                 "install 'feedpipe[accelerate]'") from exc


class AcceleratedLoader:
    """A feedpipe loader taking part in accelerate's gradient state, checkpoints and logs.

    It has the loader's ``len()``, ``set_epoch``, ``state_dict``/``load_state_dict`` and
    DataLoader surface (``dataset``, ``batch_sampler``...), so accelerate and the HF Trainer use it
    as they would the loader.
    """

    def __init__(self, loader: EpochPosition, accelerator: Any = None,
                 log_data_wait: bool = True, rename: dict[str, str | None] | None = None) -> None:
        self.loader, self.accelerator, self.rename = loader, accelerator, rename or {}
        self.gradient_state, self.log_data_wait = GradientState(), log_data_wait
        self.meter, self.epochs_logged = StallMeter(cuda_sync=False), 0
        # its own surface: a DataLoader rebuilt around it (skip_first_batches) yields its batches
        self.sampler = self.batch_sampler = LoaderSampler(self)  # type: ignore[arg-type]
        self.dataset = LoaderBatches(self)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.loader, name)  # end_of_dataloader, set_epoch, state_dict, classes...

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.gradient_state._add_dataloader(self)  # what accelerate's own loaders do
        self.meter.reset()
        epoch = self.loader.position()[0]
        try:
            for batch in self.meter.wrap(self.loader):  # a None name drops the field
                yield {self.rename.get(k, k): v for k, v in batch.items()
                       if self.rename.get(k, k) is not None} if self.rename else batch
        finally:
            self.gradient_state._remove_dataloader(self)
        if self.log_data_wait and self.accelerator is not None and len(self.meter.waits) > 1 \
                and getattr(self.accelerator, "trackers", None):
            self.accelerator.log(self.meter.summary().scalars(), step=epoch)
            self.epochs_logged += 1


def prepare(accelerator: Any, *objects: Any, log_data_wait: bool = True) -> Any:
    """``accelerator.prepare`` for everything but feedpipe loaders (all in one call, as
    accelerate wants models and optimizers together), which become :class:`AcceleratedLoader`
    and are registered for ``save_state``/``load_state``. Returns one object for one argument,
    else a tuple, as ``accelerator.prepare`` does."""
    others = [o for o in objects if not isinstance(o, (EpochPosition, AcceleratedLoader))]
    prepared = accelerator.prepare(*others) if others else ()
    prepared = iter(prepared if isinstance(prepared, tuple) else (prepared,))
    out = []
    for obj in objects:
        if isinstance(obj, EpochPosition):
            obj = AcceleratedLoader(obj, accelerator, log_data_wait)
            accelerator.register_for_checkpointing(obj)
        out.append(obj if isinstance(obj, AcceleratedLoader) else next(prepared))
    return out[0] if len(out) == 1 else tuple(out)
