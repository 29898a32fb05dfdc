"""``make_loader``: the call that replaces ``DataLoader(...)`` in training code, and
:func:`resolve`, where every "auto" of its configuration is decided."""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import torch

from ..dataset.mixed import MixedReader
from ..dataset.registry import DatasetReader, open_dataset
from ..errors import ConfigError
from ..schema.fields import ImageField, JsonField
from ..schema.imaging import decoder_info
from .config import (
    PREFETCH_DECODE,
    Auto,
    Backend,
    Crop,
    Dali,
    LoaderConfig,
    Mix,
    Output,
    RandomResizedCrop,
    Remote,
    Sampler,
    Tuned,
    Workers,
    auto_workers,
    checked,
)
from .dali.backend import DaliLoader, dali_loader
from .mixing import Sources, open_mix
from .protocol import Loader, LoaderView
from .sampler import World
from .torch.backend import TorchLoader
from .torch.device_decode import choose as choose_decoder

log = logging.getLogger("feedpipe.loader")
Source = str | os.PathLike[str] | DatasetReader | Sources | Mix | Remote


@checked
def make_loader(source: Source, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                drop_last: bool = False, fields: Sequence[str] | None = None,
                size: int | tuple[int, int] | None = None,
                crop: Crop | RandomResizedCrop = "center_crop", flip: bool = False,
                affine: Any = None, transform: Callable[..., Any] | None = None,
                batch_transforms: Sequence[Callable[..., Any]] | None = None,
                device: str | torch.device = "auto", num_workers: int | Auto = "auto",
                workers: Workers | Tuned | None = None, output: Output | None = None,
                sampler: Sampler | None = None, backend: Backend | Dali = "auto") -> Loader:
    """Batches of ``source`` as dicts of tensors on ``device``: ``image`` N×C×H×W, ``label``
    N int64, and any other ``fields``. The call that replaces ``DataLoader(...)``.

    Every option is checked (a ConfigError names it); "auto" values are resolved for the machine
    and the data (:func:`resolve`).

    Args:
        source: A packed dataset's path or URL, an opened dataset (``open_dataset``,
            ``Windows``), ``Remote(url, cache_dir=...)``, or ``Mix([a, b], weights=...)`` (a
            list or ``{name: dataset}`` is an unweighted Mix).
        batch_size: Samples per batch on this rank.
        shuffle: A new order each epoch (as DataLoader's), seeded by (seed, epoch, rank).
        seed: The seed of the order and of every random draw (crops, flips, ``transform``'s
            ``rng``): the batches are the same for any ``num_workers`` and on resume.
        drop_last: Leave out the last, smaller batch (as DataLoader's).
        fields: The fields to yield (default: ``image`` and ``label`` where the dataset has
            them; for data without images, every field).
        size: Output (height, width); an int is a square; None keeps the stored size.
        crop: "resize", "center_crop", "random_resized_crop", "none", or
            ``RandomResizedCrop(scale, ratio)``.
        flip: Flip each sample horizontally with probability 1/2 (its labels follow).
        affine: ``RandomAffine(degrees, translate, scale, shear)``, resampled with the crop.
        transform: Your ``fn(sample, rng)``, in the workers after the crop (docs/transforms.md).
        batch_transforms: Operations on whole batches on the device
            (``feedpipe.loader.augment``: ColorJitter, RandomErasing, MixUp, ...; or your own
            ``fn(batch, generator) -> batch``).
        device: "auto" (CUDA when available), "cpu", "cuda[:N]" or a ``torch.device``.
        num_workers: Loader processes: an int (0: the main process) or "auto".
        workers: ``Workers(prefetch_factor, pin_memory, ...)``, or ``feedpipe.tuned()``
            (``num_workers`` and ``prefetch_factor`` measured).
        output: ``Output(dtype, mean, std, channels_last, ragged, min_box_fraction)``.
        sampler: ``Sampler(world, uneven, shuffle_window, shuffle_buffer)``.
        backend: "auto", "torch", "dali" or ``Dali(reader, hw_decoder_load)``.

    Returns:
        The loader: iterate it once per epoch; it has ``len``, ``set_epoch``,
        ``state_dict``/``load_state_dict``, ``classes``, ``config`` (every choice made) and
        ``describe()``.

    Raises:
        ConfigError: An option misspelt, out of range, or that the data cannot serve.
    """
    tuned = workers if isinstance(workers, Tuned) else None
    if tuned is not None and num_workers != "auto":
        raise ConfigError("feedpipe.tuned() chooses num_workers (workers=feedpipe.tuned()): "
                          "leave num_workers out", option="num_workers")
    given = {k: v for k, v in locals().items() if k not in ("source", "batch_size", "tuned")}
    mix = Mix(source) if isinstance(source, (list, tuple, Mapping)) else source
    cfg = LoaderConfig(batch_size, **{**given, "workers": tuned.workers if tuned else workers},
                       mix=mix if isinstance(mix, Mix) else None)
    if cfg.mix is not None:
        if tuned is not None:
            raise ConfigError("workers=feedpipe.tuned() measures one dataset; for a mix, tune "
                              "each dataset alone and pass num_workers=", option="workers")
        reader: DatasetReader = open_mix(cfg.mix.opened(), cfg)
    elif isinstance(source, Remote):
        reader = source.open()
    elif isinstance(source, DatasetReader):
        reader = source
    elif isinstance(source, (str, os.PathLike)):
        reader = open_dataset(source)
    else:
        raise ConfigError(f"source={source!r}: pass a dataset path or URL, an opened dataset, "
                          "feedpipe.Remote(url, ...) or feedpipe.Mix([...])", option="source")
    reader.require_samples("make_loader")
    if tuned is not None:  # either backend: the measurement runs the one chosen below
        options = {k: v for k, v in given.items() if v is not None
                   and k not in ("num_workers", "workers") and not _PLAIN.get(k) == v}
        if tuned.workers != Workers():  # what the caller fixed: the same key as autotune's own
            options["workers"] = tuned.workers
        res = tuned.measure(reader, batch_size, **tuned.options, **options)  # a TuneResult
        cfg = replace(cfg, num_workers=res.num_workers, workers=replace(
            cfg.workers, prefetch_factor=res.prefetch_factor or "auto"))
    return _build(reader, resolve(cfg, reader), cfg.sampler.world or World.detect())


#: make_loader's plain options and their defaults (what the tuner need not be told).
_PLAIN = {k: p.default for k, p in inspect.signature(make_loader).parameters.items()
          if p.default is not inspect.Parameter.empty}


def resolve(cfg: LoaderConfig, reader: DatasetReader) -> LoaderConfig:
    """``cfg`` with every "auto" replaced, from the machine and ``reader``: the one place they
    are decided, and what ``loader.config`` shows. The backend is torch: DALI has yet to feed a
    training step faster on a GPU run (benchmarks/RESULTS.md); it decodes on its device."""
    if str(cfg.device) == "auto":
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    else:
        device = torch.device(cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device={cfg.device!r} but CUDA is not available; use "
                              "device='auto' or 'cpu'", option="device")
    dali = cfg.backend == "dali"
    decodes = any(f.codec != "raw" for f in _images(reader, cfg))
    w = cfg.workers
    decode_on = w.decode_on if w.decode_on != "auto" else \
        "device" if dali and device.type == "cuda" else "cpu"
    for name in ("transform", "affine"):  # these need the decoded pixels in the workers
        if getattr(cfg, name) is not None and decode_on == "device" and not dali:
            raise ConfigError(f"{name}= runs in the workers on decoded images; "
                              "Workers(decode_on='device') leaves them encoded there: use "
                              "decode_on='cpu' (or 'auto')", option="decode_on")
    return replace(
        cfg, fields=cfg.fields_in(reader.schema), device=device,
        backend="dali" if dali else "torch",
        num_workers=(0 if dali else auto_workers(decodes)) if cfg.num_workers == "auto"
        else cfg.num_workers,
        workers=replace(
            w, decode_on=decode_on, pin_memory=device.type == "cuda" if w.pin_memory == "auto"
            else w.pin_memory, prefetch_factor=(PREFETCH_DECODE if decodes and not dali else 2)
            if w.prefetch_factor == "auto" else w.prefetch_factor))


def _images(reader: DatasetReader, cfg: LoaderConfig) -> list[ImageField]:
    """The image fields of ``reader`` that ``cfg`` reads."""
    return [f for f in (reader.schema[n] for n in cfg.fields_in(reader.schema)
                        if n in reader.schema) if isinstance(f, ImageField)]


def _build(reader: DatasetReader, cfg: LoaderConfig, world: World) -> Loader:
    """The backend's loader over ``reader``, for the resolved ``cfg``."""
    images, device = _images(reader, cfg), torch.device(cfg.device)
    _warn_meta(reader, cfg, images)
    if cfg.backend == "dali":
        loader: Loader = dali_loader(reader, cfg, world, device)
    else:
        log.info("feedpipe loader: %s (%s), %d samples, rank %d/%d, device %s, workers %s, "
                 "jpeg decoder %s", reader.root, reader.format_name, len(reader), world.rank,
                 world.size, device, cfg.num_workers, decoder_info()["jpeg_decoder"])
        loader = TorchLoader(reader, cfg, world, device, choose_decoder(
            cfg.workers.decode_on, device, any(f.codec == "jpeg" for f in images)))
    if isinstance(reader, MixedReader):  # which dataset each ``source`` value stands for
        loader.source_names = reader.names  # type: ignore[attr-defined]
    return loader


def _warn_meta(reader: DatasetReader, cfg: LoaderConfig, images: Sequence[ImageField]) -> None:
    """Warn when the ``meta`` passthrough (undeclared manifest columns, in stored-image pixels) is
    read beside images that a flip, crop or resize moves: its coordinates no longer match."""
    meta = reader.schema["meta"] if "meta" in reader.schema else None
    if not (images and isinstance(meta, JsonField) and "meta" in cfg.fields_in(reader.schema)):
        return
    if cfg.flip or cfg.size is not None and cfg.crop != "none" and not (
            cfg.crop == "resize" and {f.shape[:2] if f.shape else None for f in images}
            == {tuple(cfg.size)}):
        warnings.warn(f"{reader.root}: the 'meta' field is passed through unchanged, in "
                      "stored-image pixels, but this loader crops, resizes or flips the image, "
                      "so coordinates in meta no longer match it. Store them as typed fields "
                      "instead (--keypoints-column, --boxes-column; see docs/fields.md), which "
                      "follow the image", UserWarning, stacklevel=4)


__all__ = ["DaliLoader", "Loader", "LoaderConfig", "LoaderView", "TorchLoader", "auto_workers",
           "make_loader", "resolve"]
