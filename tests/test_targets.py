"""Targets computed from masks (converters.targets): distance maps and boundaries against
brute-force references written from the module's definitions, their storage (float16 / quantized
uint8/uint16) round trips, and parameter validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import seg_helpers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import ndimage
from seg_helpers import ref_boundary, ref_distance_map

from converters.targets import (
    Target,
    boundary,
    distance_map,
    make_boundary,
    make_distance_map,
    user_target,
)
from feedpipe.errors import ConfigError
from feedpipe.schema.masks import TargetField
from feedpipe.schema.model import field_from_json

# applied per test, so that this module does not change hypothesis settings for the session
fast = settings(deadline=None, max_examples=40,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MAX_LABEL = 3


@st.composite
def masks(draw, max_side: int = 40, max_label: int = MAX_LABEL) -> np.ndarray:
    """Random H×W uint8 label masks (1×1 .. 40×40): overlapping rectangles and ellipses, random
    pixel noise, or a constant (empty / all-object) mask."""
    h = draw(st.integers(1, max_side))
    w = draw(st.integers(1, max_side))
    kind = draw(st.sampled_from(["shapes", "shapes", "noise", "constant"]))
    if kind == "constant":
        return np.full((h, w), draw(st.integers(0, max_label)), np.uint8)
    if kind == "noise":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        density = draw(st.floats(0.05, 0.95))
        labels = rng.integers(1, max_label + 1, (h, w))
        return np.where(rng.random((h, w)) < density, labels, 0).astype(np.uint8)
    mask = np.zeros((h, w), np.uint8)
    yy, xx = np.mgrid[:h, :w]
    for _ in range(draw(st.integers(1, 5))):
        cy, cx = draw(st.floats(-2, h + 1)), draw(st.floats(-2, w + 1))
        ry, rx = draw(st.floats(0.5, max(0.5, h / 1.5))), draw(st.floats(0.5, max(0.5, w / 1.5)))
        if draw(st.booleans()):
            region = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
        else:
            region = (np.abs(yy - cy) <= ry) & (np.abs(xx - cx) <= rx)
        mask[region] = draw(st.integers(0, max_label))
    return mask


truncations = st.one_of(st.none(), st.floats(0.5, 30.0))


def scipy_signed(obj: np.ndarray) -> np.ndarray:
    """The definition with scipy's exact EDT (for masks that have both sides)."""
    return np.where(obj, 0.5 - ndimage.distance_transform_edt(obj),
                    ndimage.distance_transform_edt(~obj) - 0.5)


# --- distance_map: values --------------------------------------------------------------------

@fast
@given(masks(), st.booleans(), truncations, st.booleans())
def test_distance_map_matches_brute_force(mask, signed, truncate, normalize):
    got = distance_map(mask, signed=signed, truncate=truncate, normalize=normalize)
    assert got.dtype == np.float32 and got.shape == mask.shape
    want = ref_distance_map(mask, signed=signed, truncate=truncate, normalize=normalize)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    if not signed:
        assert (got >= 0).all()
    elif (mask > 0).any() and not (mask > 0).all():
        assert (got[mask > 0] < 0).all() and (got[mask == 0] > 0).all()
    bound = 1.0 if normalize else (truncate if truncate is not None else math.hypot(*mask.shape))
    assert np.abs(got).max() <= bound * (1 + 1e-6)


@fast
@given(masks(), st.booleans(), truncations)
def test_distance_map_matches_scipy_edt_formula(mask, signed, truncate):
    obj = mask > 0
    if obj.all() or not obj.any():
        return  # no boundary: covered by test_no_boundary_gets_the_cap
    d = scipy_signed(obj)
    if not signed:
        d = np.abs(d)
    if truncate is not None:
        d = np.clip(d, -truncate, truncate)
    got = distance_map(mask, signed=signed, truncate=truncate)
    np.testing.assert_allclose(got, d, rtol=1e-6, atol=1e-5)


@fast
@given(masks(), st.integers(2, 5), st.booleans(), truncations, st.booleans())
def test_per_class_channels(mask, num_classes, signed, truncate, normalize):
    got = distance_map(mask, signed=signed, per_class=True, num_classes=num_classes,
                       truncate=truncate, normalize=normalize)
    assert got.dtype == np.float32 and got.shape == (*mask.shape, num_classes - 1)
    want = ref_distance_map(mask, signed=signed, per_class=True, num_classes=num_classes,
                            truncate=truncate, normalize=normalize)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    for k in range(1, num_classes):  # channel k-1 is the plain map of the mask "== k"
        single = distance_map((mask == k).astype(np.uint8), signed=signed, truncate=truncate,
                              normalize=normalize)
        np.testing.assert_array_equal(got[..., k - 1], single)


def test_straight_edge_is_exact():
    """Columns 0..4 object, 5..11 background: 0.5, 1.5, ... from the edge on both sides."""
    mask = np.zeros((6, 12), np.uint8)
    mask[:, :5] = 2
    row = distance_map(mask, signed=True)[3]
    np.testing.assert_array_equal(row, [-4.5, -3.5, -2.5, -1.5, -0.5,
                                        0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5])
    np.testing.assert_array_equal(distance_map(mask)[3], np.abs(row))
    np.testing.assert_array_equal(distance_map(mask, signed=True, truncate=2)[0],
                                  np.clip(row, -2, 2))
    np.testing.assert_allclose(distance_map(mask, signed=True, truncate=2, normalize=True)[0],
                               np.clip(row, -2, 2) / 2)
    np.testing.assert_allclose(distance_map(mask, normalize=True)[0],
                               np.abs(row) / math.hypot(6, 12), rtol=1e-6)
    diagonal = np.zeros((3, 3), np.uint8)
    diagonal[0, 0] = 1  # the far corner is sqrt(8) centre-to-centre from the object pixel
    assert distance_map(diagonal)[2, 2] == pytest.approx(math.sqrt(8) - 0.5, rel=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (40, 3)])
@pytest.mark.parametrize("fill", [0, 2])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("truncate", [None, 3.0])
@pytest.mark.parametrize("normalize", [False, True])
def test_no_boundary_gets_the_cap(shape, fill, signed, truncate, normalize):
    """Empty and all-object masks: cap (= truncate, else the diagonal) everywhere, -cap inside
    when signed; normalized: ±1."""
    mask = np.full(shape, fill, np.uint8)
    cap = truncate if truncate is not None else math.hypot(*shape)
    want = cap * (-1.0 if (signed and fill) else 1.0)
    if normalize:
        want /= cap
    got = distance_map(mask, signed=signed, truncate=truncate, normalize=normalize)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, np.full(shape, want), rtol=1e-6)
    # per class: the class present everywhere is all object, the absent ones all background
    pc = distance_map(mask, signed=signed, per_class=True, num_classes=4, truncate=truncate,
                      normalize=normalize)
    assert pc.shape == (*shape, 3)
    for k in (1, 2, 3):
        inside = fill == k
        w = (cap if not (signed and inside) else -cap) / (cap if normalize else 1.0)
        np.testing.assert_allclose(pc[..., k - 1], np.full(shape, w), rtol=1e-6)


# --- distance_map: storage -------------------------------------------------------------------

@fast
@given(masks(), st.booleans(), st.booleans(), truncations, st.booleans())
def test_float16_storage_round_trip(mask, signed, per_class, truncate, normalize):
    t = make_distance_map(signed=signed, per_class=per_class, num_classes=4 if per_class else None,
                          truncate=truncate, normalize=normalize)
    assert t.dtype == "float16" and t.rescale == "distance" and t.interp == "linear"
    stored = t.compute(mask, "m")
    assert stored.dtype == np.float16
    f = t.field()
    assert isinstance(f, TargetField) and not f.quantized
    assert f.channels == (3 if per_class else None)
    f = field_from_json(f.to_json())  # as a reader sees it
    got = f.to_user(stored, "m")
    assert got.dtype == np.float32 and got.shape == stored.shape
    want = distance_map(mask, signed=signed, per_class=per_class,
                        num_classes=4 if per_class else None, truncate=truncate,
                        normalize=normalize)
    assert (np.abs(got - want) <= np.abs(want) * 2.0**-11 + 1e-7).all()


@fast
@given(masks(), st.sampled_from(["uint8", "uint16"]), st.booleans(), st.booleans(), truncations,
       st.booleans())
def test_quantized_storage_within_half_a_step(mask, dtype, signed, per_class, truncate, normalize):
    if truncate is None and not normalize:
        normalize = True  # quantized storage needs a bounded range
    nc = 3 if per_class else None
    t = make_distance_map(signed=signed, per_class=per_class, num_classes=nc, truncate=truncate,
                          normalize=normalize, dtype=dtype)
    stored = t.compute(mask, "m")
    assert stored.dtype == np.dtype(dtype)
    hi = 1.0 if normalize else truncate
    lo = -hi if signed else 0.0
    steps = 255 if dtype == "uint8" else 65535
    f = field_from_json(t.field().to_json())
    assert f.quantized and f.clip == (lo, hi)
    assert f.scale == pytest.approx((hi - lo) / steps) and f.offset == pytest.approx(lo)
    got = f.to_user(stored, "m")
    assert got.dtype == np.float32
    want = distance_map(mask, signed=signed, per_class=per_class, num_classes=nc,
                        truncate=truncate, normalize=normalize)
    assert np.abs(got - want).max() <= (hi - lo) / steps / 2 * (1 + 1e-3) + 1e-6 * hi
    # the extremes of the range are representable exactly (within float32 rounding)
    assert got.min() >= lo - 1e-5 * hi and got.max() <= hi + 1e-5 * hi


def test_quantized_caps_hit_the_range_ends():
    t = make_distance_map(signed=True, truncate=10.0, dtype="uint8")
    f = t.field()
    empty = f.to_user(t.compute(np.zeros((4, 5), np.uint8), "e"), "e")
    full = f.to_user(t.compute(np.ones((4, 5), np.uint8), "f"), "f")
    np.testing.assert_allclose(empty, 10.0, atol=1e-5)
    np.testing.assert_allclose(full, -10.0, atol=1e-5)
    assert t.compute(np.zeros((2, 2), np.uint8), "e").tolist() == [[255, 255], [255, 255]]
    assert t.compute(np.ones((2, 2), np.uint8), "f").tolist() == [[0, 0], [0, 0]]


# --- boundary --------------------------------------------------------------------------------

@fast
@given(masks(), st.sampled_from([1, 2, 1.5, 3]))
def test_boundary_matches_brute_force(mask, width):
    got = boundary(mask, width=width)
    assert got.dtype == np.uint8 and got.shape == mask.shape
    np.testing.assert_array_equal(got, ref_boundary(mask, width))
    t = make_boundary(width=width)
    stored = t.compute(mask, "m")
    f = field_from_json(t.field().to_json())
    assert f.interp == "nearest" and f.rescale == "none" and not f.quantized
    out = f.to_user(stored, "m")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, got)


def test_boundary_examples():
    mask = np.zeros((5, 6), np.uint8)
    mask[1:4, 1:4] = 2  # a 3×3 square
    b1 = boundary(mask)
    want = np.zeros_like(mask)
    want[1:4, 1:4] = 1
    want[2, 2] = 0  # the centre is 1 px from every edge pixel, but all of those are class 2
    np.testing.assert_array_equal(b1, want)
    np.testing.assert_array_equal(boundary(mask, width=2), (mask > 0).astype(np.uint8))
    # the image border is not a boundary; neighbouring labelled regions both get one
    full = np.full((4, 4), 3, np.uint8)
    assert not boundary(full).any()
    two = np.ones((4, 4), np.uint8)
    two[:, 2:] = 2
    np.testing.assert_array_equal(boundary(two)[0], [0, 1, 1, 0])
    np.testing.assert_array_equal(boundary(two, width=2)[0], [1, 1, 1, 1])


# --- Target objects, validation --------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: make_distance_map(truncate=0),
    lambda: make_distance_map(truncate=-3.0),
    lambda: make_distance_map(per_class=True),
    lambda: make_distance_map(per_class=True, num_classes=1),
    lambda: make_distance_map(dtype="uint8"),
    lambda: make_distance_map(dtype="uint16", signed=True),
    lambda: make_distance_map(dtype="int8", truncate=4.0),
    lambda: make_boundary(width=0),
    lambda: make_boundary(width=-1),
    lambda: distance_map(np.zeros((3, 3), np.uint8), per_class=True),
    lambda: user_target("t", "no_colon_here"),
    lambda: user_target("t", "seg_helpers:does_not_exist"),
    lambda: user_target("t", "no_such_module_xyz:fn"),
    lambda: user_target("t", 42),
], ids=["truncate0", "truncate<0", "per_class-no-K", "per_class-K1", "uint8-unbounded",
        "uint16-unbounded", "int8", "width0", "width<0", "fn-per_class-no-K", "spec-no-colon",
        "spec-no-attr", "spec-no-module", "not-callable"])
def test_bad_parameters_are_config_errors(make):
    with pytest.raises(ConfigError):
        make()


def test_bounded_quantized_configurations_are_accepted():
    assert make_distance_map(dtype="uint8", truncate=5.0).scale_offset == \
        pytest.approx((5 / 255, 0))
    assert make_distance_map(dtype="uint16", normalize=True, signed=True).scale_offset == \
        pytest.approx((2 / 65535, -1.0))
    t = make_distance_map(per_class=True, num_classes=3, truncate=4.0, signed=True)
    assert t.channels == 2 and t.field().shape == (None, None, 2)
    assert t.field().clip == (-4.0, 4.0)


def test_user_targets():
    mask = np.array([[0, 1, 2], [3, 4, 0]], np.uint8)
    by_fn = user_target("mine", seg_helpers.user_target_fn)
    by_spec = user_target("mine", "seg_helpers:user_target_fn")
    for t in (by_fn, by_spec):
        assert t.name == "mine" and t.dtype == "float16"
        assert t.spec == "seg_helpers:user_target_fn"
        out = t.field().to_user(t.compute(mask, "m"), "m")
        np.testing.assert_array_equal(out, seg_helpers.user_target_expected(mask))
    renamed = user_target("other", make_boundary(width=2))
    assert renamed.name == "other" and renamed.field().name == "other"
    np.testing.assert_array_equal(renamed.compute(mask, "m"), boundary(mask, width=2))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_target_compute_checks_the_function_result():
    mask = np.zeros((3, 4), np.uint8)
    with pytest.raises(ValueError, match="shape"):
        Target("t", lambda m: np.zeros((4, 3), np.float32)).compute(mask, "x")
    with pytest.raises(ValueError, match="dtype"):
        Target("t", lambda m: np.full(m.shape, "a")).compute(mask, "x")
    with pytest.raises(ValueError, match="overflow"):
        Target("t", lambda m: np.full(m.shape, 1e6)).compute(mask, "x")  # > float16 max
    with pytest.raises(ValueError, match="range"):
        Target("t", lambda m: np.full(m.shape, 300), dtype="uint8", interp="nearest"
               ).compute(mask, "x")
    per = make_distance_map(per_class=True, num_classes=3)
    with pytest.raises(ValueError, match="shape"):
        Target("t", lambda m: np.zeros(m.shape, np.float32), channels=2).compute(mask, "x")
    assert per.compute(mask, "x").shape == (3, 4, 2)
