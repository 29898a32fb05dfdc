"""The DALI half of the DALI backend: the lazy import with an install hint, the one pipeline graph
(CPU and GPU: ``GraphSpec.device`` only moves the decoder to ``"mixed"`` and the rest onto the
GPU), and the ``external_source`` callback that feeds it feedpipe's own batch plan, crops and
flips (:meth:`Framing.plan`, as the torch backend's).
"""

from __future__ import annotations

import importlib
import importlib.util
import io
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Literal

import numpy as np
import torch

from ...dataset.registry import DatasetReader
from ...errors import ConfigError, CorruptRecordError, MissingDependencyError
from ...schema.codecs import jpeg_info
from ...schema.fields import ImageField
from ...schema.geometric import BoxesField, KeypointsField
from ...schema.masks import MaskField, TargetField
from ..config import Crop, LoaderConfig
from ..dataset import check_fields
from ..geometry import CROP_ATTEMPTS, Framing
from ..gpu import driver_cuda
from ..sampler import PlanSampler, Segment, World, rng_for

#: the module ``backend="dali"`` imports; a seam for tests, which point it at a missing module
DALI_MODULE = "nvidia.dali"


def dali_package(torch_cuda: str | None,
                 driver: Callable[[], str | None] | None = None) -> tuple[str, str]:
    """(pip package, how the CUDA major was found): torch's CUDA build, else the driver's
    (``driver``, default :func:`.gpu.driver_cuda`), else CUDA 13 (DALI has wheels for 12 and 13)."""
    found, how = torch_cuda, "torch.version.cuda"
    if found is None:
        found, how = (driver or driver_cuda)(), "the driver"
    if found is None:
        return "nvidia-dali-cuda130", "no CUDA found; default"
    pkg = "nvidia-dali-cuda120" if int(found.split(".")[0]) <= 12 else "nvidia-dali-cuda130"
    return pkg, f"CUDA {found} ({how})"


def dali_installed() -> bool:
    """Whether DALI can be found, without importing it (importing costs ~0.5 s)."""
    try:
        return importlib.util.find_spec(DALI_MODULE) is not None
    except ImportError:  # a missing parent package
        return False


def import_dali() -> ModuleType:
    """``nvidia.dali`` and its PyTorch plugin; else an error naming this machine's wheel."""
    try:
        dali = importlib.import_module(DALI_MODULE)
        for sub in ("fn", "types", "plugin.pytorch"):
            importlib.import_module(f"{DALI_MODULE}.{sub}")
    except ImportError as exc:
        pkg, how = dali_package(torch.version.cuda)
        extra = pkg.replace("nvidia-dali-", "dali-")
        raise MissingDependencyError(
            f"backend='dali' needs NVIDIA DALI ({exc}): pip install 'feedpipe[{extra}]' (the "
            f"{pkg} wheel, for {how}); or use backend='torch'") from exc
    return dali


@dataclass(frozen=True)
class GraphSpec:
    """Everything the pipeline graph depends on; two equal specs build the same graph."""

    device: Literal["cpu", "gpu"]
    source: Literal["plan", "webdataset"]   # our external_source, or DALI's own tar reader
    encoded: bool                           # False: raw H×W×3 arrays, no decode
    size: tuple[int, int]                   # output H, W
    crop: Crop
    resize: bool                            # False: windows already have the output size
    dtype: str                              # output dtype: float32, float16 or uint8
    layout: Literal["HWC", "CHW"]
    mean: tuple[float, ...]                 # in 0..255 units
    std: tuple[float, ...]
    flip: bool
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hw_decoder_load: float = 0.65
    depth: int = 2                          # batches each reader worker prepares ahead


def define_graph(dali: ModuleType, spec: GraphSpec, source: Any) -> tuple[Any, ...]:
    """The pipeline body: source → decode (+window) → resize → flip + normalize + layout, from a
    :class:`PlanSource` or (``spec.source == "webdataset"``) ``readers.webdataset``'s arguments
    (DALI's order and random windows). Returns (images, extra outputs...)."""
    fn, types = dali.fn, dali.types
    gpu = spec.device == "gpu"
    decode_args = dict(device="mixed" if gpu else "cpu", output_type=types.RGB,
                       adjust_orientation=False,  # as the torch backend (EXIF applied at packing)
                       hw_decoder_load=spec.hw_decoder_load)
    extra: tuple[Any, ...] = ()
    crop_args: dict[str, Any] = {}
    if spec.source == "plan":
        parallel = dict(parallel=True, prefetch_queue_depth=spec.depth) if source.parallel else {}
        if source.windows:
            data, mirror, anchor, shape = fn.external_source(
                source, num_outputs=4, batch=True, batch_info=True, **parallel,
                dtype=[types.UINT8, types.INT32, types.INT32, types.INT32],
                ndim=[1 if spec.encoded else 3, 0, 1, 1])
        else:  # fixed-size raw images: nothing to cut
            data, mirror = fn.external_source(
                source, num_outputs=2, batch=True, batch_info=True, **parallel,
                dtype=[types.UINT8, types.INT32], ndim=[3, 0])
        if spec.encoded:
            x = fn.decoders.image_slice(data, anchor, shape, axis_names="HW", **decode_args)
        else:
            x = data.gpu() if gpu else data
            x = fn.slice(x, anchor, shape, axis_names="HW") if source.windows else x
    else:
        data = fn.readers.webdataset(**source, name="reader")
        extra = (fn.pad(fn.get_property(data, key="source_info"), fill_value=0),)
        mirror = fn.random.coin_flip(probability=0.5, dtype=types.INT32) if spec.flip else 0
        if spec.crop == "random_resized_crop":
            x = fn.decoders.image_random_crop(data, random_area=list(spec.scale),
                                              random_aspect_ratio=list(spec.ratio),
                                              num_attempts=CROP_ATTEMPTS, **decode_args)
        else:
            x = fn.decoders.image(data, **decode_args)
        if spec.crop == "center_crop":  # cover the output, then crop its centre
            x = fn.resize(x, size=list(spec.size), mode="not_smaller", antialias=True,
                          interp_type=types.INTERP_LINEAR)
            crop_args = dict(crop=list(spec.size), crop_pos_x=0.5, crop_pos_y=0.5)
    if spec.resize and not crop_args:
        x = fn.resize(x, resize_y=spec.size[0], resize_x=spec.size[1], antialias=True,
                      interp_type=types.INTERP_LINEAR)
    dtype = {"float32": types.FLOAT, "float16": types.FLOAT16, "uint8": types.UINT8}[spec.dtype]
    x = fn.crop_mirror_normalize(x, dtype=dtype, output_layout=spec.layout, mean=list(spec.mean),
                                 std=list(spec.std), mirror=mirror, **crop_args)
    return (x, *extra)


def dali_fields(reader: DatasetReader, cfg: LoaderConfig) -> tuple[str, tuple[str, ...]]:
    """(the image field DALI decodes, host fields), or a ConfigError saying why not."""
    fields = cfg.fields_in(reader.schema)
    check_fields(reader, fields)
    images = [n for n in fields if isinstance(reader.schema[n], ImageField)]
    spatial = [n for n in fields if isinstance(reader.schema[n], (MaskField, TargetField))]
    if len(images) != 1:
        raise ConfigError(f"backend='dali' decodes exactly one image field; fields={fields} has "
                          f"{len(images)}: request one, or use backend='torch'", option="backend")
    if spatial:
        raise ConfigError(f"backend='dali' does not load masks or targets ({spatial}); use "
                          "backend='torch', which applies the image's geometry to them",
                          option="backend")
    geometric = [n for n in fields if isinstance(reader.schema[n], (KeypointsField, BoxesField))]
    if geometric:
        raise ConfigError(f"backend='dali' does not load keypoints or boxes ({geometric}): it "
                          "cannot apply the image's crop and flip to them; use backend='torch'",
                          option="backend")
    if cfg.workers.on_error != "raise":
        raise ConfigError("on_error='skip' needs backend='torch': a DALI pipeline cannot replace "
                          "a sample that fails to decode", option="on_error")
    return images[0], tuple(n for n in fields if n != images[0])


def graph_spec(reader: DatasetReader, cfg: LoaderConfig, image: str,
               device: torch.device) -> GraphSpec:
    """The pipeline graph for this dataset and configuration (see :func:`define_graph`)."""
    f = reader.schema[image]
    assert isinstance(f, ImageField)
    size = cfg.size or (f.shape[:2] if f.shape else None)
    if size is None:
        raise ConfigError(f"field {image!r} holds images of varying size: pass size=(H, W) "
                          "(or an int) to batch them", option="size")
    encoded = f.codec != "raw"
    fixed = not encoded and f.shape is not None and tuple(f.shape[:2]) == tuple(size)
    if cfg.crop == "none" and not encoded and f.shape and not fixed:
        raise ConfigError(f"crop='none' but stored images are {f.shape[:2]}, not size={size}; "
                          "choose crop='resize' or 'center_crop'", option="crop")
    resize = cfg.crop != "none" and not (fixed and cfg.crop != "random_resized_crop")
    float_out = cfg.output.dtype != "uint8"
    mean = tuple(255 * m for m in cfg.output.mean) if float_out and cfg.output.mean else (0.0,) * 3
    std = tuple(255 * s for s in cfg.output.std) if float_out and cfg.output.std else \
        ((255.0,) * 3 if float_out else (1.0,) * 3)
    return GraphSpec(
        device="gpu" if device.type == "cuda" else "cpu", source=(
            "webdataset" if cfg.dali.reader == "webdataset" else "plan"),
        encoded=encoded, size=tuple(size), crop=cfg.crop, resize=resize,  # type: ignore[arg-type]
        dtype="float32" if cfg.output.dtype == "bfloat16" else cfg.output.dtype,
        layout="HWC" if cfg.output.channels_last else "CHW", mean=mean, std=std, flip=cfg.flip,
        scale=cfg.random_resized_crop.scale, ratio=cfg.random_resized_crop.ratio,
        hw_decoder_load=cfg.dali.hw_decoder_load,
        depth=int(cfg.workers.prefetch_factor))


class PlanSource:
    """``external_source`` callback: DALI's ``info.iteration`` → the stored images, windows and
    flips of the torch backend's plan, across epochs (the pipeline never drains), stateless."""

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World, field: str,
                 op: Framing, epoch: int, start: int, *, windows: bool,
                 parallel: bool = False, segment: Segment | None = None) -> None:
        self.reader, self.cfg, self.world, self.field, self.op = reader, cfg, world, field, op
        self.epoch, self.start, self.windows, self.parallel = epoch, start, windows, parallel
        self.codec = reader.schema[field].codec  # type: ignore[attr-defined]
        self.sampler = PlanSampler(reader, cfg, world)
        self.sampler.resumed = segment  # the plan of a resumed first epoch
        self._lengths: dict[int, int] = {}  # batches of each epoch's plan (computed once)

    def batch(self, iteration: int) -> tuple[int, int]:
        """(feedpipe epoch, batch number) of DALI's ``iteration``."""
        epoch, number = self.epoch, self.start + iteration
        while True:
            n = self._lengths.get(epoch)
            if n is None:
                n = self._lengths[epoch] = len(self.sampler.plan(epoch))
            if number < n or not n:
                return epoch, number
            epoch, number = epoch + 1, number - n

    def __call__(self, info: Any) -> tuple[list[np.ndarray] | np.ndarray, ...]:
        epoch, number = self.batch(info.iteration)
        plan = self.sampler.plan(epoch)
        if number >= len(plan):  # an epoch with nothing for this rank
            raise StopIteration
        indices = plan[number]
        rng = rng_for(self.cfg.seed, epoch, self.world.rank, number) if self.op.random else None
        n = len(indices)
        data: list[np.ndarray] = [np.empty(0, np.uint8)] * n
        anchors = np.zeros((n, 2), np.int32)
        shapes = np.zeros((n, 2), np.int32)
        flips = np.zeros(n, np.int32)

        def keep(pos: int, stored: dict[str, Any]) -> None:
            value = stored[self.field]
            try:
                if self.codec == "raw":
                    arr = np.array(value)  # the stored view is valid only inside this call
                    h, w = arr.shape[:2]
                else:
                    raw = bytes(value)
                    arr = np.frombuffer(raw, np.uint8)
                    h, w = self._dims(raw)
                self.op.check_fits(h, w, "image")
                geo = self.op.plan(h, w, rng)
            except Exception as exc:
                raise CorruptRecordError(f"{self.reader.describe(int(indices[pos]))}: cannot "
                                         f"read {self.field}: {exc}") from exc
            data[pos] = arr
            anchors[pos] = geo.top, geo.left
            shapes[pos] = geo.height, geo.width
            flips[pos] = geo.flip

        self.reader.visit(indices, keep, [self.field])
        return (data, flips, anchors, shapes) if self.windows else (data, flips)

    def _dims(self, data: bytes) -> tuple[int, int]:
        """(height, width) from the image header, without decoding."""
        if self.codec == "jpeg":
            info = jpeg_info(data)
            if info is None:
                raise ValueError("damaged JPEG header")
            return info[1], info[0]
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return im.height, im.width
