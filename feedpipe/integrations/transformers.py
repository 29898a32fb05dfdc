"""The Hugging Face ``Trainer`` on feedpipe loaders: :class:`FeedpipeTrainer`
(docs/trainers.md)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, MissingDependencyError
from ..loader.position import EpochPosition
from .accelerate import AcceleratedLoader

try:
    from transformers import Trainer
except ImportError as exc:
    raise MissingDependencyError("feedpipe.integrations.transformers needs transformers: pip "
                                 "install 'feedpipe[transformers]'") from exc

HF_NAMES: dict[str, str | None] = {"image": "pixel_values", "label": "labels", "valid": None,
                                   "index": None}


class FeedpipeTrainer(Trainer):
    """``transformers.Trainer`` whose train, eval and test data are feedpipe loaders; batches
    reach ``model(**batch)`` with HF's names (``image`` as ``pixel_values``, ``label`` as
    ``labels``; ``valid`` and ``index`` dropped): ``rename=`` changes them."""

    def __init__(self, *args: Any, train_loader: EpochPosition | None = None,
                 eval_loader: EpochPosition | None = None,
                 rename: dict[str, str | None] | None = None, log_data_wait: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = {**HF_NAMES, **(rename or {})}
        self.feedpipe_loaders = {
            split: AcceleratedLoader(ld, self.accelerator, log_data_wait=False, rename=names)
            for split, ld in (("train", train_loader), ("eval", eval_loader)) if ld is not None}
        self.rename, self.log_data_wait = names, log_data_wait

    def _feedpipe(self, split: str) -> AcceleratedLoader:
        if split not in self.feedpipe_loaders:
            raise ConfigError(f"FeedpipeTrainer has no {split} loader: pass {split}_loader="
                              "feedpipe.make_loader(...)")
        return self.feedpipe_loaders[split]

    def get_train_dataloader(self) -> Any:
        return self._feedpipe("train")

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        if isinstance(eval_dataset, EpochPosition):
            return AcceleratedLoader(eval_dataset, self.accelerator, False, self.rename)
        return self._feedpipe("eval")

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        if not isinstance(test_dataset, EpochPosition):
            raise ConfigError("FeedpipeTrainer.predict/evaluate takes a feedpipe loader "
                              "(feedpipe.make_loader(..., sampler=feedpipe.Sampler(uneven='mask'))) "
                              "as its dataset")
        return AcceleratedLoader(test_dataset, self.accelerator, False, self.rename)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's logs, plus the data-wait share of the epoch just trained (once)."""
        train = self.feedpipe_loaders.get("train")
        if self.log_data_wait and train is not None and len(train.meter.waits) > 1 \
                and train.meter.waits is not getattr(self, "_feedpipe_logged", None) \
                and train.loader.end_of_dataloader:
            logs = {**logs, **train.meter.summary().scalars()}
            self._feedpipe_logged = train.meter.waits
        super().log(logs, *args, **kwargs)
