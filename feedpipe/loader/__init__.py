"""``make_loader``: the call that replaces ``DataLoader(...)`` in training code."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

import torch

from ..errors import ConfigError
from ..formats import DatasetReader, open_dataset
from ..imaging import decoder_info
from ..schema import ImageField
from ..sharding import World
from .config import LoaderConfig, auto_workers, usable_cores
from .dali_backend import DaliLoader, choose_backend, dali_loader
from .device_decode import choose as choose_decoder
from .protocol import Loader, LoaderView
from .torch_backend import TorchLoader

log = logging.getLogger("feedpipe.loader")


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
    decodes = any(isinstance(reader.schema[n], ImageField) and reader.schema[n].codec != "raw"
                  for n in fields if n in reader.schema)
    if cfg.num_workers == "tune":  # either backend: autotune measures the one chosen here
        from ..tune import autotune  # a measurement leaf, imported only when asked for

        tuned = autotune(reader, batch_size, world=world,
                         **{k: v for k, v in options.items() if k != "num_workers"})
        cfg = replace(cfg, **tuned.loader_options())
    if choose_backend(reader, cfg, device) == "dali":
        return dali_loader(reader, cfg, world, device)  # resolves its own "auto" values
    cfg = cfg.resolve(cuda=device.type == "cuda", decodes=decodes)
    log.info("feedpipe loader: %s (%s), %d samples, rank %d/%d, device %s, workers %s, "
             "jpeg decoder %s", reader.root, reader.format_name, len(reader), world.rank,
             world.size, device, cfg.num_workers, decoder_info()["jpeg_decoder"])
    jpeg = any(isinstance(reader.schema[n], ImageField) and reader.schema[n].codec == "jpeg"
               for n in fields if n in reader.schema)
    return TorchLoader(reader, cfg, world, device, choose_decoder(cfg.decode_on, device, jpeg))


__all__ = ["DaliLoader", "Loader", "LoaderConfig", "LoaderView", "TorchLoader", "auto_workers",
           "make_loader", "usable_cores"]
