"""PyTorch Lightning: :class:`FeedpipeDataModule`, a ``LightningDataModule`` over feedpipe
datasets, and :class:`FeedpipeCallback`, which keeps resume exact and logs the data-wait share
(docs/trainers.md)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..errors import ConfigError, MissingDependencyError
from ..loader.api import make_loader
from ..loader.config import Sampler, World
from ..loader.position import EpochPosition
from ..tools.monitor import LoaderInfo, StallMeter, batch_rows

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package has the same API
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as exc:
        raise MissingDependencyError("feedpipe.integrations.lightning needs Lightning: pip "
                                     "install 'feedpipe[lightning]'") from exc

EVAL_DEFAULTS: dict[str, Any] = {"shuffle": False, "sampler": Sampler(uneven="mask"),
                                 "crop": "center_crop", "flip": False}
_TRAIN_ONLY = ("crop", "flip", "shuffle", "drop_last")


class FeedpipeCallback(pl.Callback):
    """Exact mid-epoch and elastic resume, and the data-wait share per epoch in the logger
    (added by :class:`FeedpipeDataModule`; add it yourself to a trainer whose loaders are
    feedpipe loaders made elsewhere)."""

    def __init__(self, log_data_wait: bool = True) -> None:
        self.log_data_wait = log_data_wait
        self.meter = StallMeter(cuda_sync=False)
        self._batch_end: float | None = None
        self._batch_start = 0.0
        self._realign = False

    @staticmethod
    def _train_loaders(trainer: "pl.Trainer") -> list[EpochPosition]:
        combined = trainer.fit_loop._combined_loader
        flat = combined.flattened if combined is not None else []
        return [ld for ld in flat if isinstance(ld, EpochPosition)]

    @staticmethod
    def _in_flight(trainer: "pl.Trainer") -> int:
        """Batches Lightning has fetched ahead of the one being trained."""
        fetcher = trainer.fit_loop._data_fetcher
        return len(getattr(fetcher, "batches", ()) or ())

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._realign = True

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        loaders = self._train_loaders(trainer)
        self.meter.reset()  # its workers set the warm-up the summary leaves out
        self.meter.loader_info = LoaderInfo.from_loader(loaders[0]) if len(loaders) == 1 else None
        self._batch_end = None

    def _align(self, trainer: "pl.Trainer") -> None:
        """Set Lightning's batch counters (progress, and the fetcher's count that finds the
        epoch's last batch) to the loader's position in this world's batches: restored ones
        count the saver's. Runs at the first training batch, as Lightning calls no epoch hook
        when it resumes mid-epoch."""
        loaders = self._train_loaders(trainer)
        if len(loaders) != 1:
            return
        _, upcoming = loaders[0].position()  # the next batch the loader will hand out
        index = max(0, upcoming - 1 - self._in_flight(trainer))  # the batch now being trained
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        progress.ready = progress.started = index + 1
        progress.processed = progress.completed = index
        fetcher = trainer.fit_loop._data_fetcher  # counts fetched batches to find the last one
        # (unless a property: a fetcher that derives it from another)
        if fetcher is not None and not isinstance(getattr(type(fetcher), "fetched", None),
                                                  property):
            fetcher.fetched = upcoming

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                             batch: Any, batch_idx: int) -> None:
        if self._realign:
            self._realign = False
            self._align(trainer)
        self._batch_start = time.perf_counter()
        if self._batch_end is None:
            self._batch_end = self._batch_start

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        wait = self._batch_start - (self._batch_end or self._batch_start)
        self.meter.record(wait, now - self._batch_start, batch_rows(batch))
        self._batch_end = now

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.log_data_wait and len(self.meter.waits) > 1:
            for name, value in self.meter.summary().scalars().items():
                pl_module.log(name, value, on_epoch=True, sync_dist=True)

    def on_save_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           checkpoint: dict[str, Any]) -> None:
        """Save the train loaders' positions at the first batch not yet trained."""
        fit = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        combined = trainer.fit_loop._combined_loader
        # (`is None`: a CombinedLoader's truth is its len(), which raises once fit is over)
        if "combined_loader" not in fit or combined is None:
            return
        lag, states = self._in_flight(trainer), list(fit["combined_loader"])
        stateful = [ld for ld in combined.flattened  # what Lightning saved a state of, in order
                    if callable(getattr(ld, "state_dict", None))]
        for k, ld in enumerate(stateful[:len(states)]):
            if isinstance(ld, EpochPosition):
                states[k] = ld.state_dict(in_flight=lag)
        fit["combined_loader"] = states


class FeedpipeDataModule(pl.LightningDataModule):
    """Loaders for ``fit``, ``validate``, ``test`` and ``predict`` from packed datasets.

    ``train``/``val``/``test``/``predict`` are dataset paths or URLs (or mixes, as
    ``make_loader`` takes them); ``options`` go to every ``make_loader`` call, and evaluation
    loaders add :data:`EVAL_DEFAULTS` (``Sampler(uneven="mask")``, no shuffle, centre crop) under
    ``eval_options``. The rank and world size are the trainer's.
    """

    def __init__(self, train: Any = None, val: Any = None, test: Any = None,
                 predict: Any = None, *, batch_size: int, eval_batch_size: int | None = None,
                 eval_options: dict[str, Any] | None = None, log_data_wait: bool = True,
                 **options: Any) -> None:
        super().__init__()
        if train is None and val is None and test is None and predict is None:
            raise ConfigError("FeedpipeDataModule needs at least one dataset: train=, val=, "
                              "test= or predict=")
        self.sources = {"train": train, "val": val, "test": test, "predict": predict}
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.options = options
        sampler = options.get("sampler")  # its shuffle window, with the evaluation's uneven
        self.eval_options = {**EVAL_DEFAULTS, **{k: v for k, v in options.items()
                                                 if k not in _TRAIN_ONLY},
                             **({"sampler": replace(sampler, uneven="mask")} if sampler else {}),
                             **(eval_options or {})}
        self.log_data_wait = log_data_wait
        self.loaders: dict[str, Any] = {}

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        world = World(trainer.global_rank, trainer.world_size) if trainer else None
        if trainer is not None and not any(isinstance(c, FeedpipeCallback)
                                           for c in trainer.callbacks):
            trainer.callbacks.append(FeedpipeCallback(self.log_data_wait))
        for split, source in self.sources.items():
            if source is None or split in self.loaders:
                continue
            train = split == "train"
            options = self.options if train else self.eval_options
            sampler = options.get("sampler") or Sampler()
            sampler = replace(sampler, world=world or sampler.world)  # the trainer's ranks
            self.loaders[split] = make_loader(
                source, self.batch_size if train else self.eval_batch_size,
                **{**options, "sampler": sampler})

    def _loader(self, split: str) -> Any:
        """The split's loader; [] (Lightning's "no loader") for a split without a dataset."""
        return self.loaders[split] if self.sources[split] is not None else []

    def train_dataloader(self) -> Any:
        return self._loader("train")

    def val_dataloader(self) -> Any:
        return self._loader("val")

    def test_dataloader(self) -> Any:
        return self._loader("test")

    def predict_dataloader(self) -> Any:
        return self._loader("predict")
