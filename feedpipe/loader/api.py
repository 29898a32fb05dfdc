"""``make_loader``: the call that replaces ``DataLoader(...)`` in training code."""

from __future__ import annotations

import functools
import inspect
import logging
import os
from dataclasses import replace
from typing import Any, Callable, Mapping, ParamSpec, Protocol, Sequence, TypeVar

import torch

from ..dataset.mixed import MixedReader
from ..dataset.registry import DatasetReader, open_dataset
from ..errors import ConfigError
from ..schema.fields import ImageField
from ..schema.imaging import decoder_info
from .config import Auto, Backend, Crop, LoaderConfig, auto_workers, usable_cores
from .dali.backend import DaliLoader, dali_loader
from .mixing import Sources, open_mix
from .options import (
    Dali,
    Mix,
    Output,
    RandomResizedCrop,
    Remote,
    Sampler,
    Tuned,
    Workers,
    expect,
    flatten,
    unknown,
)
from .passthrough import warn_meta
from .protocol import Loader, LoaderView
from .sampler import World
from .torch.backend import TorchLoader
from .torch.device_decode import choose as choose_decoder

log = logging.getLogger("feedpipe.loader")
P = ParamSpec("P")
R = TypeVar("R")
Source = str | os.PathLike[str] | DatasetReader | Sources | Mix | Remote

#: The flat make_loader keywords of before 0.1 -> where each lives now (README: "Options moved").
MOVED = {
    **{k: f"workers=feedpipe.Workers({k}=...)" for k in (
        "prefetch_factor", "pin_memory", "multiprocessing_context",
        "decode_on", "on_error", "max_pixels")},
    **{k: f"output=feedpipe.Output({k}=...)" for k in (
        "dtype", "mean", "std", "channels_last", "ragged", "min_box_fraction")},
    **{k: f"sampler=feedpipe.Sampler({k}=...)" for k in (
        "world", "uneven", "shuffle_window", "shuffle_buffer")},
    **{k: f"crop=feedpipe.RandomResizedCrop({k}=...)" for k in ("scale", "ratio")},
    "dali_reader": "backend=feedpipe.Dali(reader=...)",
    "dali_hw_decoder_load": "backend=feedpipe.Dali(hw_decoder_load=...)",
    **{k: f"source=feedpipe.Remote(url, {k}=...)" for k in (
        "cache_dir", "cache_limit", "storage_options", "timeout")},
    **{k: f"source=feedpipe.Mix([...], {k}=...)" for k in ("weights", "epoch_size")},
    "mix_classes": "source=feedpipe.Mix([...], classes=...)",
}


class TunedOptions(Protocol):
    """A measurement's result (:class:`feedpipe.tools.tune.TuneResult`): what it chose."""

    num_workers: int
    prefetch_factor: int | None


def _device(spec: str | torch.device) -> torch.device:
    if str(spec) == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    dev = torch.device(spec)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={spec!r} but CUDA is not available; use device='auto' or 'cpu'",
                          option="device")
    return dev


def _keywords_checked(fn: Callable[P, R]) -> Callable[P, R]:
    """Refuse an unknown keyword with a ConfigError naming the closest option (``flp=`` → did
    you mean ``flip``?), or, for an option that moved into a group, its new spelling;
    ``inspect.signature``, ``help()`` and editors still see ``fn``'s own signature."""
    known = tuple(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        for name in kwargs:
            if name in MOVED:
                raise ConfigError(f"{name}= moved: use {MOVED[name]} (README: 'Options "
                                  "moved in 0.1')", option=name)
            if name not in known:
                raise unknown(name, known, f"{fn.__name__}()", known[2:])
        return fn(*args, **kwargs)

    return checked


@_keywords_checked
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

    Every option is checked (a ConfigError names it; a typo gets the closest name, an option
    that moved its new place); "auto" values are resolved for the machine and the data.

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
        ``state_dict``/``load_state_dict``, ``classes`` and ``describe()``.

    Raises:
        ConfigError: An option misspelt, moved, out of range, or that the data cannot serve.
    """
    given = {k: v for k, v in locals().items() if k not in ("source", "batch_size")}
    cfg, tuned = _config(source, batch_size, given)
    world = (sampler.world if sampler else None) or World.detect()
    if isinstance(source, (Mix, list, tuple, Mapping)):
        mix = source if isinstance(source, Mix) else Mix(source)
        if tuned is not None:
            raise ConfigError("workers=feedpipe.tuned() measures one dataset; for a mix, tune "
                              "each dataset alone and pass num_workers=", option="workers")
        reader: DatasetReader = open_mix(mix.opened(), cfg)
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
        res: TunedOptions = tuned.measure(reader, batch_size, **tuned.options, **options)
        cfg = replace(cfg, num_workers=res.num_workers,
                      prefetch_factor=res.prefetch_factor or "auto")
    return _build(reader, cfg, world, _device(cfg.device))


#: make_loader's plain options and their defaults (what the tuner need not be told).
_PLAIN = {k: p.default for k, p in inspect.signature(make_loader).parameters.items()
          if p.default is not inspect.Parameter.empty}


def loader_config(batch_size: int, **options: Any) -> LoaderConfig:
    """The LoaderConfig ``make_loader(source, batch_size, **options)`` builds from a path, for
    code that assembles a backend itself (tests of one stage)."""
    for name in options:
        if name not in _PLAIN or name == "source":
            raise unknown(name, list(_PLAIN), "loader_config()")
    cfg, tuned = _config(None, batch_size, {**_PLAIN, **options})
    if tuned is not None:
        raise ConfigError("loader_config() measures nothing: pass num_workers=", option="workers")
    return cfg


def _config(source: object, batch_size: int,
            given: dict[str, Any]) -> tuple[LoaderConfig, Tuned | None]:
    """make_loader's options as one flat, checked LoaderConfig, and the tuning asked for."""
    flat = dict(given)
    if flat["num_workers"] == "tune":
        raise ConfigError("num_workers='tune' moved: use workers=feedpipe.tuned() (README: "
                          "'Options moved in 0.1')", option="num_workers")
    expect(flat.pop("workers"), (Workers, Tuned), "workers",
           "pass feedpipe.Workers(...) or feedpipe.tuned(...)")
    tuned = given["workers"] if isinstance(given["workers"], Tuned) else None
    if tuned is not None and flat["num_workers"] != "auto":
        raise ConfigError("feedpipe.tuned() chooses num_workers (workers=feedpipe.tuned()): "
                          "leave num_workers out", option="num_workers")
    for name, kind in (("output", Output), ("sampler", Sampler)):
        expect(flat.pop(name), kind, name, f"pass feedpipe.{kind.__name__}(...) or None")
    groups = [tuned.workers if tuned else given["workers"], given["output"], given["sampler"]]
    if isinstance(given["crop"], RandomResizedCrop):
        flat["crop"] = "random_resized_crop"
        groups.append(given["crop"])
    if isinstance(given["backend"], Dali):
        flat["backend"] = "dali"
        groups.append(given["backend"])
    if isinstance(source, Mix):
        groups.append(source)
    for group in groups:
        if group is not None:
            flat.update(flatten(group))
    return LoaderConfig(batch_size=batch_size, **flat), tuned


def _build(reader: DatasetReader, cfg: LoaderConfig, world: World,
           device: torch.device) -> Loader:
    """The backend's loader over ``reader``."""
    fields = cfg.fields_in(reader.schema)
    images = [f for f in (reader.schema[n] for n in fields if n in reader.schema)
              if isinstance(f, ImageField)]
    decodes = any(f.codec != "raw" for f in images)
    warn_meta(reader.root, cfg, reader.schema, fields, images)
    # backend="auto" is the torch backend: DALI has yet to feed a training step faster on a GPU
    # run (benchmarks/RESULTS.md); it is there to be chosen, and measured
    if cfg.backend == "dali":
        return _named(dali_loader(reader, cfg, world, device), reader)  # resolves its "auto"s
    cfg = cfg.resolve(cuda=device.type == "cuda", decodes=decodes)
    log.info("feedpipe loader: %s (%s), %d samples, rank %d/%d, device %s, workers %s, "
             "jpeg decoder %s", reader.root, reader.format_name, len(reader), world.rank,
             world.size, device, cfg.num_workers, decoder_info()["jpeg_decoder"])
    jpeg = any(f.codec == "jpeg" for f in images)
    decode_on = cfg.decode_on
    for name in ("transform", "affine"):  # these need the decoded pixels in the workers
        if getattr(cfg, name) is not None:
            if decode_on == "device":
                raise ConfigError(f"{name}= runs in the workers on decoded images; "
                                  "Workers(decode_on='device') leaves them encoded there: use "
                                  "decode_on='cpu' (or 'auto')", option="decode_on")
            decode_on = "cpu"
    return _named(TorchLoader(reader, cfg, world, device,
                              choose_decoder(decode_on, device, jpeg)), reader)


def _named(loader: Loader, reader: DatasetReader) -> Loader:
    """A mix's loader says which dataset each ``source`` value stands for."""
    if isinstance(reader, MixedReader):
        loader.source_names = reader.names  # type: ignore[attr-defined]
    return loader


__all__ = ["MOVED", "DaliLoader", "Loader", "LoaderConfig", "LoaderView", "TorchLoader",
           "auto_workers", "loader_config", "make_loader", "usable_cores"]
