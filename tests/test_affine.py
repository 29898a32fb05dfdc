"""Rotation / scale / translation / shear (``RandomAffine``) in the crop's one resampling step.

The reference is written here, independently: crop → resize → flip as 3×3 matrices (the label
tests' ``matrix``), then torchvision's affine T·C·R·S·SHy·SHx·C⁻¹ built factor by factor, and
the draws restated with numpy's ``uniform`` in torchvision's order. Checked: keypoints and boxes
(hypothesis-drawn geometry), the image following its keypoints (a dot's centroid lands on the
transformed point), masks aligned with the image (colours that encode the class), targets
following the same map, the identity equal to today's crop path, and the same batches for 0 and
2 workers and after a resume.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import feedpipe
from feedpipe import Output
from feedpipe.errors import ConfigError
from feedpipe.loader.affine_params import affine_matrix
from feedpipe.loader.config import LoaderConfig
from feedpipe.loader.dali.backend import dali_loader
from feedpipe.loader.dataset import BatchDataset
from feedpipe.loader.geometry import Framing, Geometry
from feedpipe.loader.labels import Collector
from feedpipe.loader.sampler import World, rng_for
from feedpipe.loader.torch.backend import TorchLoader
from feedpipe.loader.transforms import ImageOp, RandomAffine
from feedpipe.schema import BoxesField, ImageField, KeypointsField, Schema
from feedpipe.schema.masks import MaskField, TargetField

sys.path.insert(0, str(Path(__file__).parent))
from fp_helpers import jpeg_bytes  # noqa: E402
from seg_helpers import PALETTE  # noqa: E402
from test_label_geometry import matrix  # noqa: E402
from test_writers import write_dataset  # noqa: E402

AFFINE = RandomAffine(degrees=40, translate=(0.1, 0.1), scale=(0.8, 1.25), shear=(-10, 10, -5, 5))


def tv_affine(angle: float, tx: float, ty: float, s: float, shx: float, shy: float, oh: float,
              ow: float) -> np.ndarray:
    """torchvision's forward affine on an oh×ow canvas, factor by factor (angle clockwise on
    screen, shears in degrees): T · C · R · S · SHy · SHx · C⁻¹."""
    a, sx, sy = np.radians([angle, shx, shy])
    t = np.array([[1, 0, tx], [0, 1, ty], [0, 0, 1]], float)
    c = np.array([[1, 0, ow / 2], [0, 1, oh / 2], [0, 0, 1]], float)
    r = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    sc = np.diag([s, s, 1.0])
    shear_y = np.array([[1, 0, 0], [-np.tan(sy), 1, 0], [0, 0, 1]])
    shear_x = np.array([[1, -np.tan(sx), 0], [0, 1, 0], [0, 0, 1]])
    return t @ c @ r @ sc @ shear_y @ shear_x @ np.linalg.inv(c)


def ref_draw(rng: np.random.Generator, aff: RandomAffine, oh: int, ow: int) -> tuple:
    """torchvision's ``RandomAffine.get_params`` with numpy's ``uniform`` (ranges all non-fixed)."""
    angle = rng.uniform(*aff.degrees)
    tx = ty = 0
    if aff.translate is not None:
        tx = int(round(rng.uniform(-aff.translate[0] * ow, aff.translate[0] * ow)))
        ty = int(round(rng.uniform(-aff.translate[1] * oh, aff.translate[1] * oh)))
    s = rng.uniform(*aff.scale) if aff.scale is not None else 1.0
    shear = aff.shear or (0, 0, 0, 0)
    shx = rng.uniform(*shear[:2]) if aff.shear is not None else 0.0
    shy = rng.uniform(*shear[2:]) if aff.shear is not None else 0.0
    return angle, tx, ty, s, shx, shy


def apply(m: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """N×2 points through a 3×3 matrix, one by one."""
    return np.array([(m @ [p[0], p[1], 1.0])[:2] for p in pts]).reshape(-1, 2)


@st.composite
def geometries(draw: st.DrawFn, max_side: int = 400
               ) -> tuple[Geometry, np.ndarray, int, int, np.ndarray]:
    """A crop box, output size, flip and affine parameters; the Geometry the loader carries, the
    reference source → output matrix, and the source → canvas matrix before the affine."""
    h, w = draw(st.integers(2, max_side)), draw(st.integers(2, max_side))
    ch, cw = draw(st.integers(1, h)), draw(st.integers(1, w))
    top, left = draw(st.integers(0, h - ch)), draw(st.integers(0, w - cw))
    oh, ow, flip = draw(st.integers(1, 300)), draw(st.integers(1, 300)), draw(st.booleans())
    angle = draw(st.floats(-180, 180))
    tx, ty = draw(st.integers(-ow, ow)), draw(st.integers(-oh, oh))
    s = draw(st.floats(0.25, 4))
    shx, shy = draw(st.floats(-45, 45)), draw(st.floats(-45, 45))
    m = affine_matrix(angle, (tx, ty), s, (shx, shy), (ow / 2, oh / 2))
    crop = matrix(top, left, ch, cw, flip, oh, ow)
    ref = tv_affine(angle, tx, ty, s, shx, shy, oh, ow) @ crop
    return Geometry(top, left, ch, cw, flip, affine=m), ref, oh, ow, crop


@settings(max_examples=300, deadline=None)
@given(geo=geometries(), seed=st.integers(0, 2**32 - 1))
def test_keypoints_match_reference(geo: tuple, seed: int) -> None:
    g, ref, oh, ow, crop = geo
    rng = np.random.default_rng(seed)
    pts = np.stack([rng.uniform(-20, 420, 6), rng.uniform(-20, 420, 6)], 1).astype(np.float32)
    c = Collector(KeypointsField("kp", shape=pts.shape), 1, (oh, ow), "pad", 0.0)
    c.put(0, pts, g, "kp")
    got = c.finish()
    want = apply(ref, pts.astype(np.float64))
    tol = 1e-4 + 2e-6 * np.abs(want).max()  # float32 results
    np.testing.assert_allclose(got["kp"][0].numpy(), want, rtol=0, atol=tol)
    # visible: in the crop (the canvas before the affine) and in the output after it
    vis, edge = np.ones(len(pts), bool), np.zeros(len(pts), bool)
    for q, t in ((apply(crop, pts.astype(np.float64)), 1e-6 * max(oh, ow, 400)), (want, tol)):
        x, y = q[:, 0], q[:, 1]
        vis &= (x >= 0) & (x <= ow) & (y >= 0) & (y <= oh)
        edge |= np.minimum.reduce([abs(x), abs(x - ow), abs(y), abs(y - oh)]) < 10 * t
    assert (got["kp_visible"][0].numpy() == vis)[~edge].all()


def test_a_sample_without_affine_keeps_its_points_beside_one_with() -> None:
    """Rows without an affine are left as crops leave them: a missing (NaN) y stays out of x."""
    c = Collector(KeypointsField("kp", shape=(1, 2)), 2, (10, 10), "pad", 0.0)
    c.put(0, np.array([[3.0, 4.0]], np.float32),
          Geometry(0, 0, 10, 10, False, affine=affine_matrix(90, (0, 0), 1, (0, 0), (5, 5))), "kp")
    c.put(1, np.array([[3.0, np.nan]], np.float32), Geometry(0, 0, 10, 10, False), "kp")
    kp = c.finish()["kp"].numpy()
    np.testing.assert_allclose(kp[0, 0], [6.0, 3.0], atol=1e-5)  # clockwise: (3, 4) → (6, 3)
    assert kp[1, 0, 0] == 3.0 and np.isnan(kp[1, 0, 1])


@settings(max_examples=300, deadline=None)
@given(geo=geometries(), seed=st.integers(0, 2**32 - 1), thr=st.sampled_from([0.0, 0.3, 0.7]),
       n=st.integers(0, 10))
def test_boxes_match_reference(geo: tuple, seed: int, thr: float, n: int) -> None:
    """Each box's four corners through the map, their enclosing box, clipped; dropped when less
    than ``min_box_fraction`` of that box stays in the output."""
    g, ref, oh, ow, _ = geo
    rng = np.random.default_rng(seed)
    xy = rng.uniform(-10, 410, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(0, 200, (n, 2))], 1).astype(np.float32)
    labels = rng.integers(0, 5, n)
    f = BoxesField("boxes")
    c = Collector(f, 1, (oh, ow), "pad", thr)
    c.put(0, f.validate({"boxes": boxes, "labels": labels}), g, "boxes")
    got = c.finish()
    kept, kept_labels = [], []
    for b, lab in zip(boxes.astype(np.float64), labels, strict=True):
        corners = apply(ref, np.array([[b[0], b[1]], [b[2], b[1]], [b[0], b[3]], [b[2], b[3]]]))
        (x1, y1), (x2, y2) = corners.min(0), corners.max(0)
        clip = [min(max(x1, 0), ow), min(max(y1, 0), oh), min(max(x2, 0), ow), min(max(y2, 0), oh)]
        area = (x2 - x1) * (y2 - y1)
        frac = (clip[2] - clip[0]) * (clip[3] - clip[1]) / area if area > 0 else float(
            clip == [x1, y1, x2, y2])
        assume(abs(frac - thr) > 1e-4 and not 0 < frac < 1e-4)  # no float32 ties
        if frac > 0 and frac >= thr:
            kept.append(clip)
            kept_labels.append(int(lab))
    k = int(got["boxes_count"][0])
    assert k == len(kept)
    want = np.array(kept).reshape(-1, 4)
    np.testing.assert_allclose(got["boxes"][0, :k].numpy(), want, rtol=0,
                               atol=1e-4 + 2e-6 * (np.abs(want).max() if k else 0))
    assert got["boxes_labels"][0, :k].tolist() == kept_labels


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), jpeg=st.booleans(), fx=st.floats(0.3, 0.7),
       fy=st.floats(0.3, 0.7))
def test_the_image_follows_its_keypoint(seed: int, jpeg: bool, fx: float, fy: float) -> None:
    """A bright dot at the keypoint: after crop, flip and affine in one resampling, the dot's
    centroid in the output is the keypoint the labels report, within 0.5 px (an affine map keeps
    centroids). JPEGs are large enough that the plan decodes them DCT-downscaled. The dot must lie
    wholly inside the crop: outside it the map samples ``fill``, which cuts a dot on the edge."""
    h, w, sigma = (768, 1024, 18.0) if jpeg else (96, 128, 2.5)
    x0, y0 = fx * w, fy * h
    yy, xx = np.mgrid[0:h, 0:w] + 0.5
    dot = 250 * np.exp(-((xx - x0) ** 2 + (yy - y0) ** 2) / (2 * sigma ** 2))
    img = np.repeat(dot[..., None], 3, 2).round().astype(np.uint8)
    size = (56, 64)
    op = ImageOp(size, "random_resized_crop", scale=(0.5, 1.0), flip=True,
                 affine=RandomAffine(180, (0.1, 0.1), (0.8, 1.5), (-15, 15, -15, 15)))
    out = np.empty((*size, 3), np.uint8)
    geo = op.apply(jpeg_bytes(img, quality=95) if jpeg else img, "jpeg" if jpeg else "raw", out,
                   np.random.default_rng(seed), "image")
    assert geo.affine is not None and (geo.dct > 1) == jpeg
    assume(geo.left + 4 * sigma < x0 < geo.left + geo.width - 4 * sigma
           and geo.top + 4 * sigma < y0 < geo.top + geo.height - 4 * sigma)
    c = Collector(KeypointsField("kp", shape=(1, 2)), 1, size, "pad", 0.0)
    c.put(0, np.array([[x0, y0]], np.float32), geo, "kp")
    kx, ky = c.finish()["kp"][0, 0].tolist()
    # the dot's spread in output pixels: keep samples where it lies wholly inside
    spread = 4 * sigma * math.sqrt(abs(geo.affine[0] * geo.affine[4] - geo.affine[1]
                                       * geo.affine[3])) * size[1] / geo.width
    assume(spread < kx < size[1] - spread and spread < ky < size[0] - spread)
    wgt = out[..., 0].astype(np.float64)
    wgt[wgt < 3] = 0  # JPEG ringing in the background
    oy, ox = np.mgrid[0:size[0], 0:size[1]] + 0.5
    cx, cy = (wgt * ox).sum() / wgt.sum(), (wgt * oy).sum() / wgt.sum()
    assert abs(cx - kx) < 0.5 and abs(cy - ky) < 0.5, (cx, cy, kx, ky, geo)


@settings(max_examples=60, deadline=None)
@given(h=st.integers(4, 60), w=st.integers(4, 60), seed=st.integers(0, 2**32 - 1),
       flip=st.booleans(), grow=st.floats(1.0, 3.0))
def test_identity_equals_the_crop_path(h: int, w: int, seed: int, flip: bool,
                                       grow: float) -> None:
    """The composed resampler with an identity affine (degrees=0, scale=1) against today's crop
    path, on noise (any half-pixel slip shows): within 1 level wherever the crop is enlarged or
    kept (where it is reduced, today's path antialiases and the affine path's filter differs)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, (h + 7, w + 5, 3), dtype=np.uint8)
    size = (max(1, round(h * grow)), max(1, round(w * grow * rng.uniform(1, 1.3))))
    op = ImageOp(size, "resize")
    geo = Geometry(3, 2, h, w, flip)
    today, composed = np.empty((*size, 3), np.uint8), np.empty((*size, 3), np.uint8)
    op._cut(src, today, geo, 1, "x")
    op._cut(src, composed, geo._replace(affine=affine_matrix(0, (0, 0), 1.0, (0, 0),
                                                             (size[1] / 2, size[0] / 2))), 1, "x")
    assert np.abs(today.astype(int) - composed).max() <= 1


@pytest.mark.parametrize("fill", [0, (10, 20, 30)])
def test_fill_where_the_map_leaves_the_crop(fill) -> None:
    """A flat image shifted right by a quarter of the output: the left quarter is ``fill``, the
    rest the image, with one fading column between."""
    op = ImageOp((20, 40), "resize", affine=RandomAffine(0, fill=fill))
    out = np.empty((20, 40, 3), np.uint8)
    op._cut(np.full((30, 50, 3), 100, np.uint8), out, Geometry(0, 0, 30, 50, False, affine=(
        affine_matrix(0, (10, 0), 1.0, (0, 0), (20, 10)))), 1, "x")
    assert (out[:, :9] == np.broadcast_to(fill, 3)).all() and (out[:, 11:] == 100).all()


def test_targets_follow_the_same_map() -> None:
    """A target holding each source pixel's x (linear) and a label-like one holding its column
    (nearest): after the affine they hold the reference map's source point of each output pixel;
    outside the crop 0 and ``mask_fill``; distances scale by the map's geometric scale."""
    h, w, size = 70, 90, (40, 48)
    yy, xx = np.mgrid[0:h, 0:w]
    xs = (xx + 0.5).astype(np.float32)
    aff = RandomAffine(0, mask_fill=99)
    op = ImageOp(size, "random_resized_crop", flip=True, affine=aff)
    angle, tx, ty, s, shx, shy = 25.0, 3, -2, 1.2, 8.0, -4.0
    geo = Geometry(5, 7, 60, 70, True, affine=affine_matrix(angle, (tx, ty), s, (shx, shy),
                                                             (size[1] / 2, size[0] / 2)))
    inv = np.linalg.inv(tv_affine(angle, tx, ty, s, shx, shy, *size)
                        @ matrix(5, 7, 60, 70, True, *size))
    oy, ox = np.mgrid[0:size[0], 0:size[1]] + 0.5
    src = apply(inv, np.stack([ox.ravel(), oy.ravel()], 1)).reshape(*size, 2)
    inside = (src[..., 0] > 7) & (src[..., 0] < 77) & (src[..., 1] > 5) & (src[..., 1] < 65)
    lin = np.empty(size, np.float32)
    op.apply_target(xs, TargetField("x", shape=(None, None)), geo, lin, "x")
    away = inside & (src[..., 0] > 8) & (src[..., 0] < 76) & (src[..., 1] > 6) & (src[..., 1] < 64)
    assert away.sum() > 0.3 * away.size
    np.testing.assert_allclose(lin[away], src[..., 0][away], atol=1e-3)
    assert (lin[~inside] == 0).all()
    col = np.empty(size, np.uint8)
    op.apply_target(xx.astype(np.uint8), TargetField("c", dtype="uint8", shape=(None, None),
                                                      interp="nearest"), geo, col, "c")
    assert (col[inside] == np.floor(src[..., 0][inside])).mean() > 0.99  # ties at pixel edges
    assert (col[~inside] == 99).all()
    dist = np.empty(size, np.float32)
    op.apply_target(np.ones((h, w), np.float32), TargetField("d", shape=(None, None),
                                                              rescale="distance"), geo, dist, "d")
    assert np.allclose(dist[inside], s * math.sqrt(size[0] / 60 * size[1] / 70))


def _dataset(root: Path) -> Path:
    """Raw images whose colours encode their mask's class (PALETTE), blocks of 8 px, with
    keypoints and boxes."""
    rng = np.random.default_rng(3)
    schema = Schema((ImageField("image", "raw", (64, 80, 3)),
                     MaskField("mask", codec="raw", shape=(64, 80), num_classes=5),
                     KeypointsField("kp", shape=(3, 2)), BoxesField("boxes")))
    samples = []
    for _ in range(24):
        mask = np.kron(rng.integers(1, 5, (8, 10)), np.ones((8, 8), np.int64)).astype(np.uint8)
        xy = rng.uniform(0, 60, (4, 2))
        samples.append({"image": PALETTE[mask], "mask": mask,
                        "kp": rng.uniform(0, 64, (3, 2)).astype(np.float32),
                        "boxes": {"boxes": np.concatenate([xy, xy + 12], 1), "labels": [1] * 4}})
    return write_dataset("lmdb", root, samples, schema)


def affine_loader(path: Path, aff: RandomAffine | None, **kw) -> TorchLoader:
    """The torch loader with ``affine=aff``, from make_loader."""
    opts = {**dict(size=(48, 56), crop="random_resized_crop", flip=True, seed=5, shuffle=False,
                   output=Output(dtype="uint8", mean=None, std=None), num_workers=0,
                   device="cpu", fields=["image", "mask", "kp", "boxes"]), **kw}
    ld = feedpipe.make_loader(path, 8, affine=aff, **opts)
    assert isinstance(ld, TorchLoader)
    return ld


def epoch(loader) -> list[dict]:
    return [{k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)} for b in loader]


@pytest.fixture(scope="module")
def seg(tmp_path_factory) -> Path:
    return _dataset(tmp_path_factory.mktemp("affine") / "ds")


def test_masks_aligned_with_the_image_and_labels_with_the_plan(seg: Path) -> None:
    """End to end: each pixel's class read from the image's colour equals the mask's away from
    class edges; keypoints are the reference's under the draws restated independently."""
    batches = epoch(affine_loader(seg, AFFINE))
    framing, compared, rotated = Framing((48, 56), "random_resized_crop", flip=True), 0, 0
    reader = feedpipe.open_dataset(seg)
    for number, b in enumerate(batches):
        rng = rng_for(5, 0, 0, number)
        for pos in range(len(b["image"])):
            img, mask = b["image"][pos].permute(1, 2, 0).numpy(), b["mask"][pos].numpy()
            cls = np.abs(img[:, :, None].astype(int) - PALETTE[None, None]).sum(-1).argmin(-1)
            pad = np.pad(mask, 2, mode="edge")
            flat = np.all([pad[2 + dy: 2 + dy + 48, 2 + dx: 2 + dx + 56] == mask
                           for dy in range(-2, 3) for dx in range(-2, 3)], axis=0)
            assert (cls == mask)[flat].all()
            compared += int(flat.sum())
            rotated += int((mask == 0).any())  # fill (class 0) came in: the map moved the crop
            top, left, ch, cw = framing.box(64, 80, rng)
            flip = rng.random() < 0.5
            ref = tv_affine(*ref_draw(rng, AFFINE, 48, 56), 48, 56) @ matrix(
                top, left, ch, cw, flip, 48, 56)
            kp = reader.get_batch([number * 8 + pos])[0]["kp"]
            np.testing.assert_allclose(b["kp"][pos].numpy(), apply(ref, kp), atol=1e-3)
    assert compared > 0.3 * 24 * 48 * 56 and rotated > 12


def test_landmarks_the_crop_left_out_stay_invisible_under_a_rotation(tmp_path: Path) -> None:
    """random-resized crops rotated by 30 degrees: a landmark outside the crop that the rotation
    brings back onto the output lands on fill, and is marked invisible; every visible one lies
    on the image (grey pixels; the fill is magenta: its share of a pixel is (R - G) / 255)."""
    rng = np.random.default_rng(7)
    schema = Schema((ImageField("image", "raw", (60, 80, 3)), KeypointsField("kp", shape=(40, 2))))
    samples = [{"image": np.repeat(rng.integers(40, 200, (60, 80, 1), np.uint8), 3, axis=2),
                "kp": np.stack([rng.uniform(0, 80, 40), rng.uniform(0, 60, 40)], 1).astype(
                    np.float32)} for _ in range(32)]
    path = write_dataset("lmdb", tmp_path / "kp", samples, schema)
    ld = affine_loader(path, RandomAffine(degrees=(30, 30), fill=(255, 0, 255)), size=(32, 32),
                       crop=feedpipe.RandomResizedCrop(scale=(0.1, 0.4)), fields=["image", "kp"])
    onto, visible = 0, 0
    for b in epoch(ld):
        img = b["image"].permute(0, 2, 3, 1).numpy().astype(int)
        kp, vis = b["kp"].numpy(), b["kp_visible"].numpy()
        inside = (kp[..., 0] >= 0) & (kp[..., 0] < 32) & (kp[..., 1] >= 0) & (kp[..., 1] < 32)
        n, k = np.nonzero(inside)
        px = img[n, kp[n, k, 1].astype(int), kp[n, k, 0].astype(int)]
        fill = (px[:, 0] - px[:, 1]) / 255
        assert (fill[vis[n, k]] < 0.75).all()  # (a point on the crop's edge: a blended pixel)
        onto += int((fill[~vis[n, k]] > 0.99).sum())  # left out, brought back onto the output
        visible += int(vis.sum())
    assert onto > 20 and visible > 100


def test_identity_parameters_leave_the_loader_as_it_was(seg: Path) -> None:
    """degrees=0 and scale=(1, 1) draw nothing and resample as today: the same batches."""
    same = epoch(affine_loader(seg, RandomAffine(0, scale=(1, 1))))
    plain = epoch(affine_loader(seg, None))
    moved = epoch(affine_loader(seg, AFFINE))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(same, plain, strict=True) for k in a)
    assert not torch.equal(moved[0]["image"], plain[0]["image"])


def test_same_batches_for_0_and_2_workers_and_after_a_resume(seg: Path) -> None:
    ref = epoch(affine_loader(seg, AFFINE))
    two = affine_loader(seg, AFFINE, num_workers=2)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(epoch(two), ref, strict=True) for k in a)
    cut = affine_loader(seg, AFFINE, num_workers=2)
    next(iter(cut))
    state = cut.state_dict()
    again = affine_loader(seg, AFFINE, num_workers=2)
    again.load_state_dict(state)
    rest = epoch(again)
    assert len(rest) == len(ref) - 1
    assert all(torch.equal(a[k], b[k]) for a, b in zip(rest, ref[1:], strict=True) for k in a)


def test_refusals(seg: Path, packed) -> None:
    with pytest.raises(ConfigError, match="degrees=-5"):
        RandomAffine(-5)
    with pytest.raises(ConfigError, match=r"translate=\(2, 0\)"):
        RandomAffine(0, translate=(2, 0))
    with pytest.raises(ConfigError, match="scale"):
        RandomAffine(0, scale=(0, 1))
    with pytest.raises(ConfigError, match="shear"):
        RandomAffine(0, shear=(1, 2, 3))
    with pytest.raises(ConfigError, match="fill=300"):
        RandomAffine(0, fill=300)
    with pytest.raises(ConfigError, match="mask_fill=300 does not fit field 'mask'"):
        affine_loader(seg, RandomAffine(10, mask_fill=300))
    reader = feedpipe.open_dataset(packed["lmdb"])
    with pytest.raises(ConfigError, match="decode_on='device'"):
        BatchDataset(reader, ["image"], ImageOp((16, 16), affine=AFFINE), seed=0,
                     on_error="raise", encoded_images=True)
    cfg = LoaderConfig(batch_size=8, size=16, affine=AFFINE)
    with pytest.raises(ConfigError, match="DALI"):
        dali_loader(reader, cfg, World(0, 1), torch.device("cpu"))


def test_of_reads_the_configs_affine() -> None:
    assert ImageOp.of(LoaderConfig(batch_size=1, size=8)).affine is None
    op = ImageOp.of(LoaderConfig(batch_size=1, size=8, affine=AFFINE))
    assert op.affine is AFFINE and op.random
    assert AFFINE.degrees == (-40.0, 40.0) and AFFINE.shear == (-10.0, 10.0, -5.0, 5.0)
    assert RandomAffine(5, shear=7).shear == (-7.0, 7.0, 0.0, 0.0)
