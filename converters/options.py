"""Conversion options: each one's accepted values as a ``Literal`` (spelled once, for the API,
its checks and the CLI's ``choices``; no Pillow here), and :class:`PackOptions`, checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import fields as dc_fields
from typing import Any, Literal, Mapping, Sequence, get_type_hints

import numpy as np

from feedpipe.checks import conforms, describe
from feedpipe.errors import ConfigError
from feedpipe.schema.imaging import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_PIXELS_PER_BYTE,
    DEFAULT_MAX_SCANS,
)

from .targets import BUILTINS, StoreDtype, Target, user_target

Format = Literal["lmdb", "hdf5", "wds"]
Store = Literal["passthrough", "reencode", "raw"]
Codec = Literal["auto", "jpeg", "png", "webp"]
Check = Literal["header", "decode"]
ExtraChannels = Literal["refuse", "drop"]
MaskStore = Literal["png", "raw"]
MaskDtype = Literal["uint8", "uint16"]
Layout = Literal["auto", "imagefolder", "flat"]
TargetDtype = StoreDtype  # a stored target's dtype (spelled in converters.targets)
LabelsAs = Literal["auto", "ints", "names"]  # how a manifest's label column is read
Unlabeled = Literal["refuse", "keep"]  # a labelled manifest's rows with an empty label
JpegStore = Literal["baseline", "keep"]  # progressive JPEGs: baseline, losslessly, or as they are

RESIZE_HELP = ("an int (the shorter side, e.g. 256) or (height, width) like make_loader's size=, "
               "e.g. (240, 320) for 320 wide and 240 high")


@dataclass(frozen=True)
class PackOptions:
    """How each image is stored; every option checked by type and value on creation."""

    store: Store = "passthrough"
    resize: int | tuple[int, int] | None = None
    codec: Codec = "auto"  # auto: JPEG and lossy WebP as they are, every lossless format as PNG
    quality: int = 90  # for lossy (re-)encoding only
    check: Check = "decode"  # JPEGs read whole (every scan); "header": markers only
    masks: bool = False
    mask_store: MaskStore = "raw"
    mask_dtype: MaskDtype = "uint8"
    num_classes: int | None = None
    ignore_index: int | None = None  # a mask value that is no class (VOC's 255 "void" band)
    targets: tuple[Target, ...] = ()
    extra_channels: ExtraChannels = "refuse"  # alpha, channels beyond RGB, 16-bit RGB
    max_pixels: int | None = DEFAULT_MAX_PIXELS  # decompression-bomb limit (width × height)
    max_scans: int | None = DEFAULT_MAX_SCANS  # a JPEG's scans (scan bombs)
    max_pixels_per_byte: int | None = DEFAULT_MAX_PIXELS_PER_BYTE  # a JPEG cut short or hostile
    # colour masks: (r, g, b, class index) per colour (converters.palette); None: index masks only
    mask_palette: tuple[tuple[int, int, int, int], ...] | None = None
    jpeg: JpegStore = "baseline"  # progressive JPEGs: losslessly as baseline (converters.progressive)

    def __post_init__(self) -> None:
        if isinstance(self.resize, list):
            object.__setattr__(self, "resize", tuple(self.resize))
        if not all(isinstance(t, Target) for t in self.targets):
            object.__setattr__(self, "targets", resolve_targets(self.targets))
        hints = get_type_hints(PackOptions)
        for f in dc_fields(self):
            value = getattr(self, f.name)
            if not conforms(value, hints[f.name]):
                how = _HOW.get(f.name) or f"use {describe(hints[f.name])}"
                raise ConfigError(f"{f.name}={value!r}: {how}", option=f.name)
        for limit in ("max_pixels", "max_scans", "max_pixels_per_byte"):
            if getattr(self, limit) is not None and getattr(self, limit) <= 0:
                raise ConfigError(f"{limit}={getattr(self, limit)}: use a positive count, or "
                                  "None for no limit", option=limit)
        if self.ignore_index is not None and \
                not 0 <= self.ignore_index <= np.iinfo(self.mask_dtype).max:
            raise ConfigError(f"ignore_index={self.ignore_index}: a {self.mask_dtype} mask value "
                              f"(0..{np.iinfo(self.mask_dtype).max}), e.g. 255", option="ignore_index")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality={self.quality}: use an integer in 1..100", option="quality")
        if self.store == "raw" and self.resize is None:
            raise ConfigError("store='raw' needs a fixed size: pass resize=224 (shorter side then "
                              "center crop) or resize=(H, W) (height, width)", option="store")
        sizes = [self.resize] if isinstance(self.resize, int) else list(self.resize or [])
        if any(s <= 0 for s in sizes):
            raise ConfigError(f"resize={self.resize!r}: sizes must be positive; {RESIZE_HELP}",
                              option="resize")
        names = [t.name for t in self.targets]
        clash = set(names) & {"image", "label", "path", "meta", "mask"}
        if clash or len(set(names)) != len(names):
            raise ConfigError(f"target names {names} must be unique and not image/label/path/"
                              "meta/mask")

    @property
    def raw_shape(self) -> tuple[int, int, int] | None:
        if self.store != "raw" or self.resize is None:
            return None
        h, w = (self.resize, self.resize) if isinstance(self.resize, int) else self.resize
        return (int(h), int(w), 3)


_HOW = {
    "resize": f"use {RESIZE_HELP}",
    "codec": "use 'auto' (lossless stays lossless), 'jpeg', 'png' or 'webp'",
    "mask_store": "masks are stored lossless, use 'png' or 'raw'",
    "jpeg": "use 'baseline' (progressive JPEGs transcoded losslessly) or 'keep' (byte for byte)",
}


def parse_resize(text: str | None) -> tuple[int, int] | int | None:
    """``--resize``: '256' → 256 (shorter side); '240x320' → (240, 320), height × width, as
    ``--size HxW`` of the other commands."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX×]\s*(\d+))?\s*", text)
    if not m:
        raise ConfigError(f"--resize {text!r}: use a shorter-side length like 256 or HxW "
                          "(height x width, as --size) like 240x320 for 320 wide, 240 high")
    return (int(m[1]), int(m[2])) if m[2] else int(m[1])


def resolve_targets(targets: Sequence[str | Target] | Mapping[str, Any] | None
                    ) -> tuple[Target, ...]:
    """Built-in names, :class:`Target` objects or {name: function | Target | "module:function"}
    → the targets to compute."""
    if not targets:
        return ()
    if isinstance(targets, Mapping):
        return tuple(BUILTINS[v]() if isinstance(v, str) and v in BUILTINS and k == v
                     else user_target(k, v) for k, v in targets.items())
    out = []
    for t in targets:
        if isinstance(t, Target):
            out.append(t)
        elif t in BUILTINS:
            out.append(BUILTINS[t]())
        else:
            raise ConfigError(f"target {t!r}: built-ins are {sorted(BUILTINS)}; pass your own as "
                              "{name: function} or name=package.module:function")
    return tuple(out)
