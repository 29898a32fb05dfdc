"""``make_loader``: the call that replaces ``DataLoader(...)`` in training code."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any, Callable, Protocol

import torch

from ..dataset.registry import DatasetReader, open_dataset
from ..errors import ConfigError
from ..schema.fields import ImageField
from ..schema.imaging import decoder_info
from .config import LoaderConfig, auto_workers, usable_cores
from .dali.backend import DaliLoader, choose_backend, dali_loader
from .protocol import Loader, LoaderView
from .sampler import World
from .torch.backend import TorchLoader
from .torch.device_decode import choose as choose_decoder

log = logging.getLogger("feedpipe.loader")


class TunedOptions(Protocol):
    """A measurement's result: the ``make_loader`` options it stands for."""

    def loader_options(self) -> dict[str, Any]: ...


# What num_workers="tune" runs: (reader, batch_size, world=..., **options) -> TunedOptions
Tuner = Callable[..., TunedOptions]


_tuner: Tuner | None = None


def set_tuner(tuner: Tuner) -> None:
    """Install the ``num_workers="tune"`` measurement. ``feedpipe.tools.tune`` installs its
    ``autotune`` when imported: the loader layer never imports the tools above it."""
    global _tuner
    _tuner = tuner


def _device(spec: str | torch.device) -> torch.device:
    if str(spec) == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    dev = torch.device(spec)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={spec!r} but CUDA is not available; use device='auto' or 'cpu'")
    return dev


def make_loader(source: str | os.PathLike[str] | DatasetReader, batch_size: int,
                **options: Any) -> Loader:
    """Open ``source`` (a packed dataset path or an opened dataset) and return a batch loader.

    Yields dicts of tensors on the target device — ``image`` as N×C×H×W (normalized ``dtype``,
    channels_last by default), ``label`` as N int64 — plus any other requested ``fields``. Every
    option is a :class:`~feedpipe.loader.config.LoaderConfig` field; "auto" values are tuned to the
    machine. Either backend returns a :class:`Loader`: ``len()``, ``set_epoch``,
    ``state_dict``/``load_state_dict``, ``classes`` (the manifest's class names) and
    ``describe()``. Every new ``iter()`` starts its epoch at the first batch; only
    ``load_state_dict`` resumes mid-epoch.
    """
    world = options.pop("world", None) or World.detect()
    cfg = LoaderConfig(batch_size=batch_size, **options)
    reader = source if isinstance(source, DatasetReader) else open_dataset(source)
    reader.require_samples("make_loader")
    device = _device(cfg.device)
    fields = cfg.fields or tuple(n for n in ("image", "label") if n in reader.schema)
    images = [f for f in (reader.schema[n] for n in fields if n in reader.schema)
              if isinstance(f, ImageField)]
    decodes = any(f.codec != "raw" for f in images)
    if cfg.num_workers == "tune":  # either backend: autotune measures the one chosen here
        if _tuner is None:
            raise ConfigError("num_workers='tune' is measured by feedpipe.tools.tune.autotune: "
                              "call feedpipe.make_loader (it loads the tuner), or import "
                              "feedpipe.tools.tune first")
        tuned = _tuner(reader, batch_size, world=world,
                       **{k: v for k, v in options.items() if k != "num_workers"})
        cfg = replace(cfg, **tuned.loader_options())
    if choose_backend(reader, cfg, device) == "dali":
        return dali_loader(reader, cfg, world, device)  # resolves its own "auto" values
    cfg = cfg.resolve(cuda=device.type == "cuda", decodes=decodes)
    log.info("feedpipe loader: %s (%s), %d samples, rank %d/%d, device %s, workers %s, "
             "jpeg decoder %s", reader.root, reader.format_name, len(reader), world.rank,
             world.size, device, cfg.num_workers, decoder_info()["jpeg_decoder"])
    jpeg = any(f.codec == "jpeg" for f in images)
    return TorchLoader(reader, cfg, world, device, choose_decoder(cfg.decode_on, device, jpeg))


__all__ = ["DaliLoader", "Loader", "LoaderConfig", "LoaderView", "TorchLoader", "auto_workers",
           "make_loader", "set_tuner", "usable_cores"]
