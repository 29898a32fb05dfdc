"""albumentations, torchvision ``transforms.v2`` and Kornia augmentations passed as they are, as
``transform=`` (per sample) or ``batch_transforms=``, with the fields that follow the image. The
draws come from feedpipe's generators (:class:`Seeded`), so a resume repeats them; the libraries
put pixel centres at integers (feedpipe's pixel ``i`` covers ``[i, i+1)``): a half-pixel shift.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError
from ..schema.fields import Field
from .labels import PAD_LABEL, batch_keys

LIBRARIES = ("albumentations", "torchvision", "kornia")
Batch = dict[str, Any]

#: torch's random functions: each takes ``generator=``
_RANDOM = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like,
           torch.randn_like, torch.randint_like, torch.bernoulli, torch.multinomial, torch.normal,
           torch.poisson, torch.binomial, torch._standard_gamma, torch._sample_dirichlet,
           torch.Tensor.bernoulli, torch.Tensor.multinomial,
           *(getattr(torch.Tensor, f"{n}_") for n in ("bernoulli", "cauchy", "exponential",
                                                      "geometric", "log_normal", "normal",
                                                      "random", "uniform"))}


class Seeded(TorchFunctionMode):
    """Within it (this thread only), torch's random draws without a generator draw from this
    mode's, one per device, seeded from ``seed``; the global generators are left alone."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self._gens: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: Any) -> torch.Generator:
        d = torch.device("cpu") if device is None else torch.device(device)
        if d.type == "cuda" and d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
        gen = self._gens.get(d)
        if gen is None:
            gen = self._gens[d] = torch.Generator(d).manual_seed(self.seed)
        return gen

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _RANDOM and kwargs.get("generator") is None:
            t = next((a for a in args if isinstance(a, torch.Tensor)), None)
            kwargs["generator"] = self._generator(t.device if t is not None
                                                  else kwargs.get("device"))
        return func(*args, **kwargs)


def library_of(obj: object) -> str | None:
    """The one of :data:`LIBRARIES` whose class (or a base) ``obj`` is an instance of, if any."""
    for cls in type(obj).__mro__:
        top = (getattr(cls, "__module__", None) or "").partition(".")[0]
        if top in LIBRARIES:
            return top
    return None


@dataclass(frozen=True)
class Fields:
    """The names of a sample's fields by what the library does with them."""

    images: tuple[str, ...]
    masks: tuple[str, ...]     # integer masks (nearest)
    targets: tuple[str, ...]   # dense targets (H×W or H×W×C): resampled as masks
    points: tuple[str, ...]    # keypoints: ``name`` K×2, ``name_visible`` K
    boxes: tuple[tuple[str, tuple[str, ...]], ...]  # (name, its label and attribute keys)

    @classmethod
    def of(cls, fields: Sequence[Field]) -> Fields:
        by = {k: tuple(f.name for f in fields if f.kind == k)
              for k in ("image", "mask", "target", "keypoints")}
        boxes = tuple((f.name, tuple(batch_keys(f, "pad")[1:-1])) for f in fields
                      if f.kind == "boxes")
        return cls(by["image"], by["mask"], by["target"], by["keypoints"], boxes)

    @property
    def spatial(self) -> tuple[str, ...]:
        return self.masks + self.targets


def _refuse(option: str, obj: object, how: str) -> ConfigError:
    return ConfigError(f"{option}={type(obj).__module__}.{type(obj).__qualname__}: {how}",
                       option=option)


def sample_transform(fn: Callable[..., Any], fields: Sequence[Field]) -> Callable[..., Any]:
    """``transform=`` as the loader runs it, ``fn(sample, rng) -> values``: the user's own
    function as it is, another library's adapted (a ConfigError where it cannot be)."""
    lib = library_of(fn)
    spec = Fields.of(fields)
    if lib is None:
        return fn
    if not spec.images:
        raise _refuse("transform", fn, "an image augmentation needs an image field among "
                      "fields=")
    if lib == "albumentations":
        return _Albumentations(fn, spec)
    if lib == "torchvision":
        return _Torchvision(fn, spec, "transform", batched=False)
    return _OneSample(_Kornia(fn, spec, "transform"))


def batch_step(step: Any, fields: Sequence[Field] | None) -> Any:
    """A ``batch_transforms=`` step as the loader runs it, ``step(batch, generator) -> batch``:
    Kornia and torchvision augmentations adapted (a ConfigError for what cannot be)."""
    lib = library_of(step)
    if lib is None:
        return step
    if lib == "albumentations":
        raise _refuse("batch_transforms", step, "albumentations transforms one H×W×C image at "
                      "a time: pass it as transform= (per sample, in the workers)")
    spec = Fields.of(fields or ())
    if not spec.images:
        raise _refuse("batch_transforms", step, "an image augmentation needs an image field "
                      "among fields=")
    if lib == "torchvision":
        return _Torchvision(step, spec, "batch_transforms", batched=True)
    return _Kornia(step, spec, "batch_transforms")


def _tensor(value: Any) -> torch.Tensor:
    """A returned array or tensor (a ``tv_tensors`` subclass too) as a plain tensor."""
    return torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) \
        else value.as_subclass(torch.Tensor)


def _image_back(value: Any, hwc: bool) -> torch.Tensor:
    """A returned image as C×H×W uint8 (a float one in [0, 1] rounded to levels)."""
    t = _tensor(value)
    if hwc and isinstance(value, np.ndarray) and t.ndim == 3:
        t = t.permute(2, 0, 1)
    elif t.ndim == 2:
        t = t[None]
    if t.is_floating_point():  # (in numpy: one thread, as the rest of a sample's work)
        a = t.numpy()
        lo, hi = float(a.min()), float(a.max())
        if lo < 0 or hi > 1:
            raise ValueError(f"returned a float image with values in [{lo:.3g}, {hi:.3g}], not "
                             "[0, 1]: leave normalization out (the loader's Output(mean=, std=) "
                             "normalizes after the transform)")
        t = torch.from_numpy(np.rint(a * 255).astype(np.uint8))
    return t


def _like(value: Any, view: torch.Tensor) -> torch.Tensor:
    """A returned mask or target in the row's dtype (float results of integer masks rounded)."""
    t = _tensor(value)
    if t.dtype != view.dtype and t.is_floating_point() and not view.is_floating_point():
        t = t.round()
    return t.to(view.dtype).reshape(view.shape) if t.numel() == view.numel() else t


def _visible(xy: torch.Tensor, before: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Visible after the library: visible before and on the canvas (edges included)."""
    x, y = xy[..., 0], xy[..., 1]
    return before & (x >= 0) & (x <= w) & (y >= 0) & (y <= h)


@dataclass
class _Gathered:
    """A sample's keypoints as one K×2 array, its boxes as one M×4 with each box's owner."""

    points: np.ndarray
    boxes: np.ndarray
    owner: np.ndarray  # M×2: (boxes field, row in it)

    @classmethod
    def of(cls, sample: Batch, spec: Fields) -> _Gathered:
        pts = [np.asarray(sample[n], np.float32).reshape(-1, 2) for n in spec.points]
        bxs = [np.asarray(sample[n], np.float32).reshape(-1, 4) for n, _ in spec.boxes]
        owner = np.concatenate([np.zeros((0, 2), np.int64)]
                               + [np.stack([np.full(len(b), j), np.arange(len(b))], 1)
                                  for j, b in enumerate(bxs)])
        return cls(np.concatenate([np.zeros((0, 2), np.float32), *pts]),
                   np.concatenate([np.zeros((0, 4), np.float32), *bxs]), owner)

    def back(self, sample: Batch, spec: Fields, points: np.ndarray, boxes: np.ndarray,
             kept: np.ndarray, hw: tuple[int, int]) -> Batch:
        """The fields' new values from ``points`` and the ``kept`` boxes (with their labels)."""
        out: Batch = {}
        at = 0
        for n in spec.points:
            k = len(sample[n])
            xy = torch.from_numpy(np.ascontiguousarray(points[at: at + k], np.float32))
            at += k
            out[n] = xy
            out[f"{n}_visible"] = _visible(xy, sample[f"{n}_visible"], *hw)
        owner = self.owner[kept]
        for j, (n, keys) in enumerate(spec.boxes):
            mine = owner[:, 0] == j
            out[n] = torch.from_numpy(np.ascontiguousarray(boxes[mine], np.float32)
                                      .reshape(-1, 4))
            rows = owner[mine, 1]
            for key in keys:
                out[key] = sample[key][torch.from_numpy(rows)]
        return out


class _Albumentations:
    """An albumentations transform on each sample, through an outer Compose."""

    def __init__(self, obj: Any, spec: Fields) -> None:
        import albumentations as A

        if not hasattr(obj, "set_random_state"):
            raise _refuse("transform", obj, f"albumentations {A.__version__} draws from the "
                          "global random generators, which differ per worker: use "
                          "albumentations>=2")
        self.spec = spec
        self.keys = {spec.images[0]: "image"}
        self.keys.update({n: f"feedpipe_image_{i}" for i, n in enumerate(spec.images[1:])})
        if spec.masks:
            self.keys[spec.masks[0]] = "mask"
        self.keys.update({n: f"feedpipe_mask_{i}" for i, n in
                          enumerate(spec.masks[1:] + spec.targets)})
        extra = {k: ("image" if n in spec.images else "mask") for n, k in self.keys.items()
                 if k.startswith("feedpipe_")}
        self.geometric = bool(spec.points or spec.boxes)
        call = copy.deepcopy(obj)  # the caller's object keeps its own generators
        if self.geometric or extra:
            call = A.Compose(
                [call], additional_targets=extra,
                keypoint_params=A.KeypointParams(format="xy", remove_invisible=False)
                if spec.points else None,
                bbox_params=A.BboxParams(format="pascal_voc", label_fields=["feedpipe_box"],
                                         clip=True) if spec.boxes else None)
        self.call = call
        self.np_rng = np.random.Generator(np.random.Philox(0))
        self.py_rng = random.Random(0)
        call.set_random_state(self.np_rng, self.py_rng)

    def __call__(self, sample: Batch, rng: np.random.Generator) -> Batch:
        self.py_rng.seed(int(rng.integers(1 << 63)))
        self.np_rng.bit_generator.state = rng.bit_generator.state
        spec, keys = self.spec, self.keys
        args = {k: sample[n].permute(1, 2, 0).numpy() if n in spec.images else sample[n].numpy()
                for n, k in keys.items()}
        if self.geometric:
            g = _Gathered.of(sample, spec)
            if spec.points:
                args["keypoints"] = g.points - 0.5
            if spec.boxes:
                args["bboxes"] = g.boxes
                args["feedpipe_box"] = np.arange(len(g.boxes))
        res = self.call(**args)
        out = {n: _image_back(res[k], True) if n in spec.images else _like(res[k], sample[n])
               for n, k in keys.items()}
        if self.geometric:
            h, w = res["image"].shape[:2]
            points = np.asarray(res["keypoints"], np.float32)[:, :2] + 0.5 if spec.points \
                else g.points
            kept = np.asarray(res["feedpipe_box"], np.int64) if spec.boxes \
                else np.zeros(0, np.int64)
            boxes = np.asarray(res["bboxes"], np.float32)[:, :4] if spec.boxes else g.boxes
            out.update(g.back(sample, spec, points, boxes, kept, (h, w)))
        return out


class _Torchvision:
    """A torchvision ``transforms.v2`` transform on each sample (or the batch: one draw),
    boxes with their index as ``labels`` (so SanitizeBoundingBoxes drops their labels too)."""

    def __init__(self, obj: Any, spec: Fields, option: str, batched: bool) -> None:
        from torchvision import tv_tensors

        if not any(c.__module__.startswith("torchvision.transforms.v2")
                   for c in type(obj).__mro__):
            raise _refuse(option, obj, "feedpipe adapts torchvision.transforms.v2 (the v1 "
                          "transforms move the image alone and draw from Python's random): "
                          "use its v2 counterpart")
        if spec.points and not hasattr(tv_tensors, "KeyPoints"):
            raise _refuse(option, obj, "this torchvision has no tv_tensors.KeyPoints (0.23+), so "
                          f"keypoints {list(spec.points)} would not follow: upgrade torchvision")
        if batched and spec.boxes:
            raise _refuse(option, obj, "torchvision takes one sample's boxes at a time: pass it "
                          "as transform= (per sample, in the workers)")
        self.obj, self.spec, self.option, self.batched = obj, spec, option, batched
        self.tv = tv_tensors

    def __call__(self, data: Batch, rng: Any) -> Batch:
        tv, spec, lead = self.tv, self.spec, 1 if self.batched else 0
        seed = int(torch.randint(0, 1 << 62, (1,), generator=rng)) if self.batched \
            else int(rng.integers(1 << 62))  # the batch's or the sample's generator
        hw = tuple(data[spec.images[0]].shape[-2:])
        inputs: Batch = {n: tv.Image(data[n]) for n in spec.images}
        for n in spec.spatial:
            m = data[n]
            inputs[n] = tv.Mask(m if m.ndim == 2 + lead else m.movedim(-1, lead))
        if not self.batched and (spec.points or spec.boxes):
            g = _Gathered.of(data, spec)
            if spec.points:
                inputs["keypoints"] = tv.KeyPoints(torch.from_numpy(g.points - 0.5),
                                                   canvas_size=hw)
            if spec.boxes:
                inputs["boxes"] = tv.BoundingBoxes(torch.from_numpy(g.boxes), format="XYXY",
                                                   canvas_size=hw)
                inputs["labels"] = torch.arange(len(g.boxes))
        elif spec.points:  # a batch: N×K×2 points, one canvas
            for n in spec.points:
                inputs[n] = tv.KeyPoints(data[n] - 0.5, canvas_size=hw)
        with Seeded(seed):
            res = self.obj(inputs)
        out = dict(data) if self.batched else {}
        for n in spec.images:
            out[n] = self._image(res[n], data[n])
        for n in spec.spatial:
            m = _tensor(res[n])
            out[n] = _like(m if data[n].ndim == 2 + lead else m.movedim(lead, -1), data[n])
        new_hw = tuple(res[spec.images[0]].shape[-2:])
        if self.batched:
            for n in spec.points:
                xy = _tensor(res[n]) + 0.5
                out[n] = xy
                out[f"{n}_visible"] = _visible(xy, data[f"{n}_visible"], *new_hw)
        elif spec.points or spec.boxes:
            points = (_tensor(res["keypoints"]) + 0.5).numpy() if spec.points else g.points
            kept = res["labels"].numpy() if spec.boxes else np.zeros(0, np.int64)
            boxes = _tensor(res["boxes"]).numpy() if spec.boxes else g.boxes
            out.update(g.back(data, spec, points, boxes, kept, new_hw))
        return out

    def _image(self, value: Any, given: torch.Tensor) -> torch.Tensor:
        if not self.batched:
            return _image_back(value, False)
        t = _tensor(value)  # the batch's dtype: uint8 or float in [0, 1]
        if given.dtype == torch.uint8 and t.is_floating_point():
            t = t.mul(255).round_().clamp_(0, 255)
        return t.to(given.dtype)


class _Kornia:
    """A Kornia augmentation on the batch (float images in [0, 1], the rest as data keys);
    boxes off the canvas dropped, the image written back in place."""

    def __init__(self, obj: Any, spec: Fields, option: str) -> None:
        import kornia.augmentation as K

        if not isinstance(obj, torch.nn.Module):
            raise _refuse(option, obj, "feedpipe adapts Kornia's augmentation modules "
                          "(kornia.augmentation.*)")
        self.spec, self.option = spec, option
        keys = ["input"] * len(spec.images) + ["mask"] * len(spec.spatial) \
            + ["keypoints"] * len(spec.points) + ["bbox_xyxy"] * len(spec.boxes)
        self.seq = obj
        if len(keys) > 1:  # (a module: an augmentation or a sequence of them)
            self.seq = K.AugmentationSequential(cast(Any, obj), data_keys=keys)

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        spec = self.spec
        seed = int(torch.randint(0, 1 << 62, (1,), generator=generator))
        if any(isinstance(batch[n], list) for n, _ in spec.boxes):
            raise ConfigError(f"{self.option}: Kornia takes boxes as one padded N×M×4 tensor; "
                              "pass Output(ragged='pad')", option="ragged")
        args = [batch[n].float().div(255) if batch[n].dtype == torch.uint8 else batch[n]
                for n in spec.images]
        for n in spec.spatial:
            m = batch[n]
            args.append((m[:, None] if m.ndim == 3 else m.movedim(-1, 1)).float())
        args += [batch[n] - 0.5 for n in spec.points]
        args += [batch[n] - 0.5 for n, _ in spec.boxes]
        with Seeded(seed):
            res = self.seq(*args)
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        out, at = dict(batch), 0
        for n in spec.images:
            out[n] = self._into(batch[n], res[at])
            at += 1
        for n in spec.spatial:
            m = res[at]
            at += 1
            out[n] = _like(m[:, 0] if batch[n].ndim == 3 else m.movedim(1, -1), batch[n])
        hw = tuple(res[0].shape[-2:])
        for n in spec.points:
            xy = res[at] + 0.5
            at += 1
            out[n], out[f"{n}_visible"] = xy, _visible(xy, batch[f"{n}_visible"], *hw)
        for n, keys in spec.boxes:
            out.update(_kept_boxes(batch, n, keys, res[at] + 0.5, hw))
            at += 1
        return out

    @staticmethod
    def _into(given: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The result in the batch's dtype, over the given image when the size is kept."""
        if given.dtype == torch.uint8:
            x = x.mul(255).round_().clamp_(0, 255)
        if x.shape == given.shape:
            return given.copy_(x)
        return x.to(given.dtype)


def _kept_boxes(batch: Batch, name: str, int_keys: tuple[str, ...], boxes: torch.Tensor,
                hw: tuple[int, ...]) -> Batch:
    """Padded boxes clipped to the canvas; those with no area dropped, the rest moved up."""
    h, w = hw
    count = batch[f"{name}_count"]
    box = torch.stack([boxes[..., 0].clamp(0, w), boxes[..., 1].clamp(0, h),
                       boxes[..., 2].clamp(0, w), boxes[..., 3].clamp(0, h)], -1)
    rank = torch.arange(box.shape[1], device=box.device)
    keep = (rank < count.to(box.device)[:, None]) & (box[..., 2] > box[..., 0]) \
        & (box[..., 3] > box[..., 1])
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    kept = keep.gather(1, order)
    out = {name: box.gather(1, order[..., None].expand(-1, -1, 4)) * kept[..., None],
           f"{name}_count": keep.sum(1).to(count.dtype)}
    for key in int_keys:
        v = batch[key].gather(1, order.to(batch[key].device))
        out[key] = torch.where(kept, v, torch.full_like(v, PAD_LABEL))
    return out


class _OneSample:
    """A batch adapter as ``transform=``: the sample as a batch of one."""

    def __init__(self, step: _Kornia) -> None:
        self.step = step

    def __call__(self, sample: Batch, rng: np.random.Generator) -> Batch:
        spec = self.step.spec
        keys = (*spec.images, *spec.spatial, *spec.points, *(f"{n}_visible" for n in spec.points))
        batch = {n: sample[n][None] for n in keys}
        for n, ints in spec.boxes:
            for key in (n, *ints):
                batch[key] = sample[key][None]
            batch[f"{n}_count"] = torch.tensor([len(sample[n])])
        gen = torch.Generator().manual_seed(int(rng.integers(1 << 62)))
        res = self.step(batch, gen)
        out = {n: res[n][0] for n in keys}
        for n, ints in spec.boxes:
            k = int(res[f"{n}_count"][0])
            for key in (n, *ints):
                out[key] = res[key][0, :k]
        return out
