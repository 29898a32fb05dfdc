"""feedpipe.loader.augment: batch operations with per-sample random parameters, vectorized.

Each photometric operation is checked against a per-sample reference written here in float64
numpy from torchvision.transforms.v2's formulas (hue through ``colorsys``), and the single factors
against Pillow's ImageEnhance where its formulas agree; MixUp/CutMix against their definitions.
Everything runs on one CPU thread, as the main process does when the workers own the cores.
"""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance

from feedpipe.errors import ConfigError, TransformError
from feedpipe.loader import augment, photometric
from feedpipe.loader.augment import (
    BatchOps,
    ColorJitter,
    CutMix,
    MixUp,
    RandomErasing,
    RandomGrayscale,
)

LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(n=16, h=7, w=6, dtype=torch.float32, classes=5, seed=1):
    x = torch.rand(n, 3, h, w, generator=gen(seed), dtype=torch.float64)
    image = (x * 255).round().to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)
    return {"image": image, "label": torch.arange(n) % classes, "key": [f"k{i}" for i in range(n)]}


def ref_gray(img):
    return LUMA[0] * img[0] + LUMA[1] * img[1] + LUMA[2] * img[2]


def ref_adjust(name, img, f, bound):
    """One factor on one C×H×W float64 image, torchvision.v2's formula; hue through colorsys."""
    if name == "brightness":
        return np.clip(img * f, 0, bound)
    if name == "contrast":
        return np.clip(f * img + (1 - f) * ref_gray(img).mean(), 0, bound)
    if name == "saturation":
        return np.clip(f * img + (1 - f) * ref_gray(img), 0, bound)
    out = np.empty_like(img)
    for y, x in np.ndindex(img.shape[1:]):
        h, s, v = colorsys.rgb_to_hsv(*(img[:, y, x] / bound))
        out[:, y, x] = np.array(colorsys.hsv_to_rgb((h + f) % 1.0, s, v)) * bound
    return out


def ref_jitter(image, params):
    """The per-sample loop: each sample's factors, in that sample's order."""
    names = [k for k in params if k != "order"]
    bound = 255.0 if image.dtype == torch.uint8 else 1.0
    out = []
    for i, img in enumerate(image.double().numpy()):
        for j in params["order"][i].tolist():
            img = ref_adjust(names[j], img, float(params[names[j]][i]), bound)
        out.append(img)
    return np.stack(out)


@pytest.mark.parametrize("way", ["by order", "by order, one sample a block", "whole batch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_color_jitter_equals_the_per_sample_reference(dtype, way, monkeypatch):
    """Both ways of applying per-sample orders: by groups sharing an order (the CPU's; one sample
    a block as 224² images are) and the whole batch of mixed orders at once (a GPU's, run here
    on the CPU)."""
    if way == "whole batch":
        monkeypatch.setattr(photometric, "BY_ORDER", set())
    elif way.endswith("block"):
        monkeypatch.setattr(photometric, "CPU_BLOCK", 1)
    op = ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.2)
    b = batch(dtype=dtype)
    p = op.params(b, gen())
    assert list(p) == ["brightness", "contrast", "saturation", "hue", "order"]
    for name in ("brightness", "contrast", "saturation"):
        assert len(set(p[name].tolist())) == 16 and 0.6 <= p[name].min() <= p[name].max() <= 1.4
    assert len(set(p["hue"].tolist())) == 16 and p["hue"].abs().max() <= 0.2
    assert len({tuple(r) for r in p["order"].tolist()}) > 4  # orders differ within the batch
    out = op.apply(b, p)["image"]
    assert out.dtype == dtype and out.shape == b["image"].shape
    ref = ref_jitter(b["image"], p)
    if dtype == torch.float32:
        np.testing.assert_allclose(out.numpy(), ref, atol=2e-5)
    else:  # rounded once: float32 vs float64 can land on either side of .5
        diff = np.abs(out.numpy().astype(int) - np.round(ref))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    assert torch.equal(op(b, gen())["image"], out)  # __call__ = apply(params) from the same state


def test_jitter_factors_alone_agree_with_pillow():
    """Brightness, contrast and saturation as PIL.ImageEnhance computes them (its uint8 steps and
    its luma weights allow a level or two)."""
    b = batch(n=6, h=16, w=16, dtype=torch.uint8)
    enhancers = {"brightness": ImageEnhance.Brightness, "contrast": ImageEnhance.Contrast,
                 "saturation": ImageEnhance.Color}
    for name, enhancer in enhancers.items():
        op = ColorJitter(**{name: 0.5})
        p = op.params(b, gen(3))
        assert list(p) == [name, "order"]
        out = op.apply(b, p)["image"]
        for i in range(len(out)):
            pil = Image.fromarray(b["image"][i].permute(1, 2, 0).numpy())
            want = np.asarray(enhancer(pil).enhance(float(p[name][i]))).transpose(2, 0, 1)
            assert np.abs(out[i].numpy().astype(int) - want).max() <= 2, (name, i)


def test_jitter_hue_extremes_and_grays():
    b = batch(n=4)
    b["image"][0] = 0.5  # a gray image has no hue: unchanged by any shift
    op = ColorJitter(hue=(0.5, 0.5))  # a half turn: red ↔ cyan
    b["image"][1, :, 0, 0] = torch.tensor([1.0, 0.0, 0.0])
    out = op(b, gen())["image"]
    assert torch.equal(out[0], b["image"][0])
    assert torch.allclose(out[1, :, 0, 0], torch.tensor([0.0, 1.0, 1.0]))


def test_grayscale_per_sample():
    op = RandomGrayscale(p=0.5)
    for dtype in (torch.float32, torch.uint8):
        b = batch(n=32, dtype=dtype)
        p = op.params(b, gen())
        assert 0 < int(p["gray"].sum()) < 32  # some gray, some not, in the same batch
        out = op.apply(b, p)["image"]
        x = b["image"].double().numpy()
        for i in range(32):
            if p["gray"][i]:
                want = np.broadcast_to(ref_gray(x[i]), x[i].shape)
                if dtype == torch.uint8:
                    want = np.round(want)
                np.testing.assert_allclose(out[i].double().numpy(), want, atol=1e-5)
            else:
                assert torch.equal(out[i], b["image"][i])


def erase_batch(n=64, dtype=torch.float32):
    b = batch(n=n, h=32, w=32)
    b["image"] = 0.1 + 0.9 * b["image"]  # never 0: the erased pixels are exactly the zeros
    if dtype == torch.uint8:
        b["image"] = (b["image"] * 255).round().to(torch.uint8)
    return b


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_random_erasing_boxes_within_scale_and_ratio(dtype):
    scale, ratio = (0.05, 0.3), (0.5, 2.0)
    op = RandomErasing(p=1.0, scale=scale, ratio=ratio)
    b = erase_batch(dtype=dtype)
    p = op.params(b, gen())
    out = op.apply(b, p)["image"]
    area = 32 * 32
    assert len({tuple(r) for r in p["box"].tolist()}) == 64  # a box of its own per sample
    for i, (top, left, h, w) in enumerate(p["box"].tolist()):
        assert h > 0 and w > 0 and top + h <= 32 and left + w <= 32
        # h, w are rounded from sqrt(A·r), sqrt(A/r) with A/area in scale and r in ratio
        assert (h - 0.5) * (w - 0.5) <= scale[1] * area and (h + 0.5) * (w + 0.5) >= scale[0] * area
        assert (h - 0.5) / (w + 0.5) <= ratio[1] and (h + 0.5) / (w - 0.5) >= ratio[0]
        zeros = out[i] == 0
        assert zeros.all(0).sum() == h * w and zeros[:, top:top + h, left:left + w].all()
        keep = torch.ones(32, 32, dtype=torch.bool)
        keep[top:top + h, left:left + w] = False
        assert torch.equal(out[i][:, keep], b["image"][i][:, keep])


def test_random_erasing_probability_value_and_no_fit():
    b = erase_batch()
    p = RandomErasing(p=0.5).params(b, gen())
    erased = p["box"][:, 2] > 0
    assert 0 < int(erased.sum()) < 64
    out = RandomErasing(p=0.5, value=(0.0, 0.5, 1.0)).apply(b, p)["image"]
    for i in range(64):
        top, left, h, w = p["box"][i].tolist()
        if erased[i]:
            assert out[i, :, top, left].tolist() == [0.0, 0.5, 1.0]
        else:
            assert torch.equal(out[i], b["image"][i])
    # a box fits only strictly inside (torchvision: h < H and w < W); none of 10 tries fits the
    # whole image or a near-full tall box, so nothing is erased
    for scale, ratio in (((1.0, 1.0), (1.0, 1.0)), ((0.99, 1.0), (3.0, 3.3))):
        never = RandomErasing(p=1.0, scale=scale, ratio=ratio)
        assert torch.equal(never(b, gen())["image"], b["image"])
    with pytest.raises(ConfigError, match="value="):
        RandomErasing(p=1.0, value=(1.0, 2.0))(b, gen())


@pytest.mark.parametrize("per_sample", [False, True])
def test_mixup_mixes_images_and_labels_by_lambda(per_sample):
    op = MixUp(alpha=1.0, num_classes=5, per_sample=per_sample)
    b = batch()
    p = op.params(b, gen())
    lam = p["lam"]
    assert lam.shape == ((16,) if per_sample else (1,)) and ((0 <= lam) & (lam <= 1)).all()
    if per_sample:
        assert len(set(lam.tolist())) == 16
    out = op.apply(b, p)
    x, y = b["image"].double(), b["label"]
    for i in range(16):
        li = float(lam[i if per_sample else 0])
        assert torch.allclose(out["image"][i].double(), li * x[i] + (1 - li) * x[i - 1],
                              atol=1e-6)
        want = torch.zeros(5, dtype=torch.float64)
        want[y[i]] += li
        want[y[i - 1]] += 1 - li
        assert torch.allclose(out["label"][i].double(), want, atol=1e-6)
    assert out["label"].dtype == torch.float32 and out["label"].shape == (16, 5)
    assert torch.allclose(out["label"].sum(1), torch.ones(16))
    assert out["key"] is b["key"]  # the other fields pass through
    u8 = batch(dtype=torch.uint8)
    mixed = op.apply(u8, p)["image"]
    x8 = u8["image"].double()
    l4 = (lam if per_sample else lam.expand(16)).view(-1, 1, 1, 1)
    assert mixed.dtype == torch.uint8
    assert ((mixed.double() - (l4 * x8 + (1 - l4) * x8.roll(1, 0))).abs() <= 0.5 + 1e-6).all()


@pytest.mark.parametrize("per_sample", [False, True])
def test_cutmix_lambda_is_the_kept_area(per_sample):
    op = CutMix(alpha=1.0, num_classes=5, per_sample=per_sample)
    b = batch(n=16, h=20, w=24, dtype=torch.uint8)
    b["image"] = torch.arange(1, 17, dtype=torch.uint8).view(16, 1, 1, 1).expand(16, 3, 20, 24)
    p = op.params(b, gen())
    out = op.apply(b, p)
    img, y = out["image"], b["label"]
    for i in range(16):
        row = i if per_sample else 0
        kept = (img[i] == i + 1).all(0).double().mean()
        pasted = (img[i] == (i - 1) % 16 + 1).all(0)
        lam = float(p["lam"][row])
        assert abs(kept - lam) < 1e-9 and abs(pasted.double().mean() - (1 - lam)) < 1e-9
        top, left, h, w = p["box"][row].tolist()
        assert pasted.sum() == h * w and pasted[top:top + h, left:left + w].all()
        want = torch.zeros(5, dtype=torch.float64)
        want[y[i]] += lam
        want[y[i - 1]] += 1 - lam
        assert torch.allclose(out["label"][i].double(), want, atol=1e-6)
    assert torch.allclose(out["label"].sum(1), torch.ones(16))
    if per_sample:
        assert len({tuple(r) for r in p["box"].tolist()}) > 8
    # lam ~ Beta(1, 1) = U: a centred box of side s = sqrt(1 - U) keeps s - s²/4 of each side
    # inside on average (centre uniform), so E[pasted] = 1/2 - E[U^1.5]/2 + E[U²]/16 = 0.3208
    shape_only = {"image": torch.zeros(1, 1, 1, 1).expand(2000, 3, 64, 64)}
    many = CutMix(1.0, 5, per_sample=True).params(shape_only, gen(9))["lam"]
    assert many.min() < 0.2 and many.max() > 0.99 and abs(many.mean() - (1 - 0.3208)) < 0.03


def test_mixes_chain_and_a_user_function_chooses_between_them():
    b = batch()
    chained = BatchOps([MixUp(0.4, 5), CutMix(1.0, 5, per_sample=True)])(b, gen())
    assert torch.allclose(chained["label"].sum(1), torch.ones(16))
    assert (chained["label"] > 0).sum(1).max() > 2  # CutMix mixed MixUp's soft rows again
    mixup, cutmix = MixUp(0.4, 5), CutMix(1.0, 5)
    either = BatchOps([lambda b, g: (mixup if torch.rand(1, generator=g) < 0.5 else cutmix)(b, g)])
    # CutMix keeps some pixels as they were, MixUp none: both are picked over 20 batches
    picked = {bool((either(b, gen(s))["image"] == b["image"]).any()) for s in range(20)}
    assert picked == {True, False}


def all_ops():
    return [ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.5), RandomErasing(0.5),
            MixUp(0.2, 5), CutMix(1.0, 5, per_sample=True)]


@pytest.mark.parametrize("op", all_ops(), ids=lambda op: type(op).__name__)
def test_same_generator_state_same_batch_and_input_untouched(op):
    for dtype in (torch.float32, torch.uint8):
        b = batch(dtype=dtype)
        before = b["image"].clone()
        a, again, other = op(b, gen(5)), op(b, gen(5)), op(b, gen(6))
        assert torch.equal(a["image"], again["image"]) and torch.equal(a["label"], again["label"])
        assert not torch.equal(a["image"], other["image"])
        assert torch.equal(b["image"], before)  # the input batch is never modified
        cl = {**b, "image": b["image"].contiguous(memory_format=torch.channels_last)}
        assert torch.equal(op(cl, gen(5))["image"], a["image"])  # the loader's layout


@pytest.mark.parametrize("op", all_ops()[:3], ids=lambda op: type(op).__name__)
def test_in_place_apply_adjusts_the_image_given_with_the_same_result(op):
    for dtype in (torch.float32, torch.uint8):
        b = batch(dtype=dtype)
        b["image"] = b["image"].contiguous(memory_format=torch.channels_last)
        p = op.params(b, gen(5))
        want = op.apply(b, p)["image"]
        got = op.apply(b, p, inplace=True)["image"]
        assert got is b["image"] and torch.equal(got, want)


def test_a_chain_makes_one_new_image_and_matches_its_steps_one_by_one(monkeypatch):
    """After a built-in step, the next built-ins adjust the image it made (nobody else holds it):
    one new batch per chain, where each step's copy cost more than its work."""
    steps = [ColorJitter(0.4, 0.4, 0.4), RandomGrayscale(0.5), RandomErasing(1.0)]
    b = batch()
    before = b["image"].clone()
    g, want = gen(3), b
    for step in steps:
        want = step(want, g)
    made = []
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: made.append(1) or empty_like(*a, **k))
    clones = []
    clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: clones.append(1) or clone(t, *a, **k))
    got = BatchOps(steps)(b, gen(3))
    assert torch.equal(got["image"], want["image"]) and torch.equal(b["image"], before)
    assert len(made) == 1 and not clones  # ColorJitter's output, adjusted in place after it
    user = BatchOps([steps[0], lambda bb, _: dict(bb), steps[2]])  # a user step ends the chain
    clones.clear()
    user(b, gen(3))
    assert len(clones) == 1


def test_the_loaders_pipeline_adjusts_the_image_it_is_handed():
    """batch_ops (make_loader's pipeline) owns its input: the loader makes a new image per
    batch, so even the first step allocates nothing; a BatchOps by default leaves it alone."""
    steps = [ColorJitter(0.4, 0.4, 0.4), RandomErasing(1.0)]
    b = batch()
    want = BatchOps(steps)(b, gen(3))["image"]
    assert not torch.equal(want, b["image"])
    pipeline = augment.batch_ops(steps)
    assert pipeline.owns_input and augment.batch_ops(BatchOps(steps)).owns_input
    got = pipeline(b, gen(3))["image"]
    assert got is b["image"] and torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", all_ops(), ids=lambda op: type(op).__name__)
def test_cuda_matches_cpu(op):
    b = batch(dtype=torch.uint8)
    cpu = op(b, gen(5))
    gpu = op({k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in b.items()}, gen(5))
    assert gpu["image"].is_cuda
    assert (gpu["image"].cpu().int() - cpu["image"].int()).abs().max() <= 1
    assert torch.allclose(gpu["label"].cpu().float(), cpu["label"].float(), atol=1e-6)


def test_user_function_as_a_step():
    def noise(b, g):  # the user's own torch op, drawing from the generator it is given
        n = torch.rand(b["image"].shape, generator=g) * 0.01
        return {**b, "image": (b["image"] + n.to(b["image"].device)).clamp(0, 1)}

    ops = BatchOps((ColorJitter(0.4), noise, RandomErasing(0.5)))
    b = batch()
    one, two = ops(b, gen(2)), ops(b, gen(2))
    assert torch.equal(one["image"], two["image"]) and not torch.equal(one["image"], b["image"])

    def broken(b, g):
        raise KeyError("boxes")

    with pytest.raises(TransformError, match=r"steps\[1\] \(.*broken\) raised KeyError") as err:
        BatchOps([ColorJitter(0.4), broken])(b, gen())
    assert isinstance(err.value.__cause__, KeyError)
    with pytest.raises(TransformError, match="returned tuple"):
        BatchOps([lambda b, g: (b, g)])(b, gen())


@pytest.mark.parametrize("make, option", [
    (lambda: ColorJitter(brightness=-0.1), "brightness"),
    (lambda: ColorJitter(contrast=(1.2, 0.8)), "contrast"),
    (lambda: ColorJitter(saturation="0.4"), "saturation"),
    (lambda: ColorJitter(hue=0.6), "hue"),
    (lambda: RandomGrayscale(p=1.5), "p"),
    (lambda: RandomErasing(scale=(0.5, 0.1)), "scale"),
    (lambda: RandomErasing(ratio=(0, 3)), "ratio"),
    (lambda: RandomErasing(value="random"), "value"),
    (lambda: MixUp(alpha=0, num_classes=5), "alpha"),
    (lambda: CutMix(alpha=1.0, num_classes=True), "num_classes"),
    (lambda: BatchOps([]), "steps"),
    (lambda: BatchOps([ColorJitter(0.4), "flip"]), "steps[1]"),
])
def test_bad_arguments_are_named(make, option):
    with pytest.raises(ConfigError) as err:
        make()
    assert str(err.value).startswith(f"{option}=") and "use " in str(err.value)


def test_bad_batches_are_named():
    b = batch()
    with pytest.raises(ConfigError, match="num_classes=3: MixUp got label [34]"):
        MixUp(1.0, 3)(b, gen())
    with pytest.raises(ConfigError, match=r"ColorJitter needs RGB images .*\(16, 1, 7, 6\)"):
        ColorJitter(0.4)({**b, "image": b["image"][:, :1]}, gen())
    with pytest.raises(ConfigError, match=r"CutMix: batch\['image'\] must be .*int64"):
        CutMix(1.0, 5)({**b, "image": b["image"].long()}, gen())
    with pytest.raises(ConfigError, match=r"batch\['label'\] must be"):
        CutMix(1.0, 5)({"image": b["image"]}, gen())


def test_benchmark_runs_every_operation_on_the_cpu():
    """benchmarks/bench_augment.py kept working here (tiny batches; the GPU rows need CUDA)."""
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_augment

    results = bench_augment.bench(torch.device("cpu"),
                                  argparse.Namespace(batch=4, size=32, batches=1))
    assert len(results) == 2 * len(bench_augment.operations())
    assert all(r.items == 4 and r.rate > 0 for r in results)
