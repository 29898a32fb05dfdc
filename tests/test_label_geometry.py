"""Keypoints and boxes under random-resized-crop, resize and flip, against an independent
reference (3×3 homogeneous matrices, a loop per point and per box), with hypothesis-drawn
geometry; and the flip permutation on a symmetric landmark set, checked against the image."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import feedpipe
from feedpipe import Output
from feedpipe.loader.geometry import Framing, Geometry
from feedpipe.loader.labels import Collector
from feedpipe.loader.sampler import rng_for
from feedpipe.schema import BoxesField, ImageField, KeypointsField, Schema

sys.path.insert(0, str(Path(__file__).parent))
from test_writers import write_dataset  # noqa: E402


def matrix(top: float, left: float, h: float, w: float, flip: bool, oh: float,
           ow: float) -> np.ndarray:
    """Source pixels → output pixels: translate to the crop, scale to the output, mirror."""
    t = np.array([[1, 0, -left], [0, 1, -top], [0, 0, 1]], np.float64)
    s = np.array([[ow / w, 0, 0], [0, oh / h, 0], [0, 0, 1]], np.float64)
    f = np.array([[-1, 0, ow], [0, 1, 0], [0, 0, 1]], np.float64) if flip else np.eye(3)
    return f @ s @ t


def ref_keypoints(pts: np.ndarray, m: np.ndarray, oh: float, ow: float, flip: bool,
                  perm: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray]:
    out, vis = [], []
    for p in pts:
        x, y, _ = m @ np.array([p[0], p[1], 1.0])
        out.append((x, y))
        vis.append((len(p) < 3 or p[2] > 0) and 0 <= x <= ow and 0 <= y <= oh)
    if flip and perm is not None:
        out, vis = [out[j] for j in perm], [vis[j] for j in perm]
    return np.array(out, np.float64).reshape(-1, 2), np.array(vis, bool)


def ref_boxes(boxes: np.ndarray, labels: np.ndarray, m: np.ndarray, oh: float, ow: float,
              thr: float) -> tuple[list[list[float]], list[int], list[float]]:
    kept, kept_labels, fracs = [], [], []
    for b, lab in zip(boxes, labels, strict=True):
        (xa, ya, _), (xb, yb, _) = m @ [b[0], b[1], 1.0], m @ [b[2], b[3], 1.0]
        x1, x2, y1, y2 = min(xa, xb), max(xa, xb), min(ya, yb), max(ya, yb)
        c = [min(max(x1, 0), ow), min(max(y1, 0), oh), min(max(x2, 0), ow), min(max(y2, 0), oh)]
        area = (x2 - x1) * (y2 - y1)
        if area > 0:
            frac = (c[2] - c[0]) * (c[3] - c[1]) / area
        else:
            frac = 1.0 if c == [x1, y1, x2, y2] else 0.0
        fracs.append(frac)
        if frac > 0 and frac >= thr:
            kept.append(c)
            kept_labels.append(int(lab))
    return kept, kept_labels, fracs


@st.composite
def geometries(draw: st.DrawFn) -> tuple[int, int, Geometry, tuple[int, int]]:
    h, w = draw(st.integers(2, 500)), draw(st.integers(2, 500))
    ch, cw = draw(st.integers(1, h)), draw(st.integers(1, w))
    top, left = draw(st.integers(0, h - ch)), draw(st.integers(0, w - cw))
    out = (draw(st.integers(1, 300)), draw(st.integers(1, 300)))
    return h, w, Geometry(top, left, ch, cw, draw(st.booleans())), out


@settings(max_examples=300, deadline=None)
@given(geo=geometries(), seed=st.integers(0, 2**32 - 1), vis=st.booleans())
def test_keypoints_match_reference(geo: tuple, seed: int, vis: bool) -> None:
    h, w, g, (oh, ow) = geo
    rng = np.random.default_rng(seed)
    k = 6
    pts = np.stack([rng.uniform(-20, w + 20, k), rng.uniform(-20, h + 20, k),
                    rng.integers(0, 3, k)], 1)[:, : 3 if vis else 2].astype(np.float32)
    perm = (1, 0, 3, 2, 4, 5)
    f = KeypointsField("kp", shape=pts.shape, flip_indices=perm)
    c = Collector(f, 1, (oh, ow), "pad", 0.0)
    c.put(0, pts, g, "kp")
    got = c.finish()
    want, want_vis = ref_keypoints(pts.astype(np.float64), matrix(*g[:5], oh, ow), oh, ow,
                                   g.flip, perm)
    np.testing.assert_allclose(got["kp"][0].numpy(), want, rtol=2e-7,
                               atol=2e-7 * max(oh, ow))  # float32 precision of the result
    # visibility agrees wherever a point is not within float32 rounding of the crop's edge
    x, y = want[:, 0], want[:, 1]
    edge = np.minimum.reduce([abs(x), abs(x - ow), abs(y), abs(y - oh)]) < 1e-3
    assert (got["kp_visible"][0].numpy() == want_vis)[~edge].all()


@settings(max_examples=300, deadline=None)
@given(geo=geometries(), seed=st.integers(0, 2**32 - 1), thr=st.sampled_from([0.0, 0.25, 0.6]),
       m=st.integers(0, 12))
def test_boxes_match_reference(geo: tuple, seed: int, thr: float, m: int) -> None:
    h, w, g, (oh, ow) = geo
    rng = np.random.default_rng(seed)
    xy = rng.uniform(-10, [w + 10, h + 10], (m, 2))
    wh = rng.uniform(0, [w / 2, h / 2], (m, 2)) * (rng.random((m, 1)) > 0.1)  # some zero-area
    boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
    labels = rng.integers(0, 5, m)
    f = BoxesField("boxes")
    c = Collector(f, 2, (oh, ow), "pad", thr)
    c.put(0, f.validate({"boxes": boxes, "labels": labels}), g, "boxes")
    c.put(1, f.validate({"boxes": np.zeros((0, 4)), "labels": []}), None, "boxes")
    got = c.finish()
    kept, kept_labels, fracs = ref_boxes(boxes.astype(np.float64), labels,
                                         matrix(*g[:5], oh, ow), oh, ow, thr)
    if any(abs(fr - thr) < 1e-4 or 0 < fr < 1e-4 for fr in fracs):
        return  # a float32 tie at the threshold: either decision is right
    n = int(got["boxes_count"][0])
    assert n == len(kept) and int(got["boxes_count"][1]) == 0
    np.testing.assert_allclose(got["boxes"][0, :n].numpy(), np.array(kept).reshape(-1, 4),
                               rtol=2e-7, atol=2e-7 * max(oh, ow))
    assert got["boxes_labels"][0, :n].tolist() == kept_labels
    assert (got["boxes_labels"][:, n:] == -1).all() and (got["boxes_labels"][1] == -1).all()


def test_loader_random_resized_crop_and_flip(tmp_path: Path) -> None:
    """End to end: the loader's batches against the reference under each sample's plan."""
    rng = np.random.default_rng(5)
    schema = Schema((ImageField("image", "raw"), KeypointsField("kp", shape=(4, 2)),
                     BoxesField("boxes")))
    samples = []
    for _ in range(12):
        h, w = int(rng.integers(40, 120)), int(rng.integers(40, 120))
        m = int(rng.integers(0, 6))
        xy = rng.uniform(0, [w - 5, h - 5], (m, 2))
        samples.append({"image": rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
                        "kp": np.stack([rng.uniform(0, w, 4), rng.uniform(0, h, 4)], 1)
                        .astype(np.float32),
                        "boxes": {"boxes": np.concatenate([xy, xy + 5], 1), "labels": [1] * m}})
    root = write_dataset("lmdb", tmp_path / "ds", samples, schema)
    size, seed, bs = (32, 48), 11, 5
    loader = feedpipe.make_loader(root, bs, fields=["image", "kp", "boxes"], size=size,
                                  crop="random_resized_crop", flip=True, seed=seed,
                                  shuffle=False, num_workers=0, device="cpu",
                                  output=Output(min_box_fraction=0.3))
    framing = Framing(size, "random_resized_crop", flip=True)
    flips = 0
    for number, batch in enumerate(loader):
        plan_rng = rng_for(seed, 0, 0, number)
        for pos in range(len(batch["kp"])):
            s = samples[number * bs + pos]
            g = framing.plan(*s["image"].shape[:2], plan_rng)
            flips += g.flip
            m = matrix(*g[:5], *size)
            want, vis = ref_keypoints(s["kp"].astype(np.float64), m, *size, g.flip, None)
            np.testing.assert_allclose(batch["kp"][pos].numpy(), want, rtol=2e-7, atol=1e-5)
            assert batch["kp_visible"][pos].tolist() == vis.tolist()
            kept, _, _ = ref_boxes(np.asarray(s["boxes"]["boxes"], np.float32).astype(float),
                                   np.asarray(s["boxes"]["labels"]), m, *size, 0.3)
            n = int(batch["boxes_count"][pos])
            assert n == len(kept)
            np.testing.assert_allclose(batch["boxes"][pos, :n].numpy(),
                                       np.array(kept).reshape(-1, 4), rtol=2e-7, atol=1e-5)
    assert 0 < flips < len(samples)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_flip_permutation_symmetric_landmarks(tmp_path: Path, fmt: str) -> None:
    """A face-like symmetric landmark set: with flip_indices a flipped sample's landmarks equal
    the unflipped ones (names kept); without, left and right trade places. The image (dark left,
    bright right) tells which samples were flipped."""
    pts = np.array([[30, 40, 1], [70, 40, 1], [50, 60, 1], [35, 80, 0], [65, 80, 1]], np.float32)
    image = np.zeros((100, 100, 3), np.uint8)
    image[:, 50:] = 255
    schema = Schema((ImageField("image", "raw", (100, 100, 3)),
                     KeypointsField("kp", shape=(5, 3), flip_indices=(1, 0, 2, 4, 3)),
                     KeypointsField("plain", shape=(5, 3))))
    samples = [{"image": image, "kp": pts, "plain": pts}] * 16
    root = write_dataset(fmt, tmp_path / "ds", samples, schema)
    loader = feedpipe.make_loader(root, 16, fields=["image", "kp", "plain"], size=100,
                                  crop="resize", flip=True, seed=3, shuffle=False,
                                  num_workers=0, device="cpu", output=Output(dtype="uint8",
                                                                             mean=None, std=None))
    batch = next(iter(loader))
    flipped = batch["image"][:, 0, 50, 0] > 128  # bright on the left: mirrored
    assert 0 < int(flipped.sum()) < 16
    mirrored = np.stack([100 - pts[:, 0], pts[:, 1]], 1)
    for i in range(16):
        # names kept: the same coordinates; the hidden left-mouth point is the right mouth now
        np.testing.assert_array_equal(batch["kp"][i].numpy(), pts[:, :2])
        assert batch["kp_visible"][i].tolist() == ([True, True, True, True, False] if flipped[i]
                                                   else [True, True, True, False, True])
        want_plain = mirrored if flipped[i] else pts[:, :2]
        np.testing.assert_array_equal(batch["plain"][i].numpy(), want_plain)
        assert batch["plain_visible"][i].tolist() == [True, True, True, False, True]
