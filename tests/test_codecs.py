"""Property-based round trips of the byte-level codecs and every field's encode/decode."""

from __future__ import annotations

import io
import json
import struct
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from feedpipe.errors import CorruptRecordError, UnsafeDataError
from feedpipe.schema.codecs import (
    jpeg_complete,
    jpeg_info,
    npy_decode,
    npy_encode,
    npy_header,
    pack_record,
    unpack_record,
)
from feedpipe.schema.fields import ArrayField, BytesField, ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema, field_from_json

# applied per test, so that this module does not change hypothesis settings for the session
fast = settings(deadline=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

numeric_dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?"),
    hnp.complex_number_dtypes(endianness="?"),
)
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
numeric_arrays = hnp.arrays(numeric_dtypes, shapes)


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality with dtype (byte order included) and shape: NaNs and -0.0 count."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --- npy ------------------------------------------------------------------------------------------

@fast
@given(numeric_arrays)
def test_npy_round_trip(arr):
    data = npy_encode(arr)
    out = npy_decode(data)
    assert same_array(out, arr)
    assert not out.flags.writeable  # a zero-copy view of the (immutable) payload


@fast
@given(numeric_arrays, st.sampled_from(["F", "strided"]))
def test_npy_round_trip_non_contiguous(arr, layout):
    assume(arr.ndim >= 1)
    src = np.asfortranarray(arr) if layout == "F" else arr[::-1]
    out = npy_decode(npy_encode(src))
    assert out.shape == src.shape and out.dtype == src.dtype
    assert np.ascontiguousarray(out).tobytes() == np.ascontiguousarray(src).tobytes()


@fast
@given(numeric_arrays)
def test_npy_decode_fast_path_agrees(arr):
    data = npy_encode(arr)
    expected = npy_header(arr.dtype, arr.shape)
    assert data.startswith(expected[0])
    assert same_array(npy_decode(data, "x", expected), arr)
    assert same_array(npy_decode(memoryview(data), "x", expected), arr)


@fast
@given(numeric_arrays, st.data())
def test_npy_truncated_or_extended_is_corrupt(arr, data):
    assume(arr.nbytes > 0)
    payload = npy_encode(arr)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(CorruptRecordError):
        npy_decode(payload[:cut])
    with pytest.raises(CorruptRecordError):
        npy_decode(payload + b"\x00")


def test_npy_matches_numpy_load():
    arr = np.arange(24, dtype=">i4").reshape(2, 3, 4)
    assert same_array(np.load(io.BytesIO(npy_encode(arr)), allow_pickle=False), arr)


def test_npy_refuses_object_arrays():
    with pytest.raises(UnsafeDataError):
        npy_encode(np.array([1, None], dtype=object))
    buf = io.BytesIO()
    np.save(buf, np.array([1, 2], dtype=object), allow_pickle=True)
    with pytest.raises(UnsafeDataError):
        npy_decode(buf.getvalue())
    buf = io.BytesIO()  # a structured dtype with an object member is refused too
    np.save(buf, np.zeros(2, dtype=[("a", "i4"), ("b", "O")]), allow_pickle=True)
    with pytest.raises(UnsafeDataError):
        npy_decode(buf.getvalue())


def test_a_damaged_npy_header_is_refused_without_a_python_warning():
    """A header with an invalid escape reaches ast.literal_eval: a typed error, and no
    SyntaxWarning about escape sequences printed at the user."""
    head = b"{'descr': '<f4\\q', 'fortran_order': False, 'shape': (3,), }"
    head += b" " * (-(len(head) + 11) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + bytes(12)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(CorruptRecordError, match="malformed npy header"):
            npy_decode(data)
    assert not said, [str(w.message) for w in said]


@fast
@given(st.binary(max_size=64))
def test_npy_decode_of_garbage_raises_typed_error(junk):
    for data in (junk, b"\x93NUMPY\x01\x00" + junk):
        try:
            npy_decode(data)
        except (CorruptRecordError, UnsafeDataError):
            pass


# --- the LMDB record layout ------------------------------------------------------------------------

@fast
@given(st.lists(st.binary(max_size=200), max_size=12))
def test_record_round_trip(payloads):
    rec = pack_record(payloads)
    assert rec[:4] == b"FPR2"
    n = struct.unpack_from("<I", rec, 4)[0]
    assert n == len(payloads)
    assert list(struct.unpack_from(f"<{n}I", rec, 8 + 4 * n)) == [zlib.crc32(p) for p in payloads]
    out = unpack_record(rec, len(payloads))
    assert [bytes(p) for p in out] == payloads
    assert all(isinstance(p, memoryview) for p in out)  # zero-copy views
    assert [bytes(p) for p in unpack_record(memoryview(rec), len(payloads))] == payloads


def v1_record(payloads: list[bytes]) -> bytes:
    """The version-1 layout (no checksums), as datasets of feedpipe <= 0.x hold it."""
    n = len(payloads)
    return b"".join([b"FPR1", struct.pack(f"<I{n}I", n, *map(len, payloads)), *payloads])


@fast
@given(st.lists(st.binary(max_size=50), max_size=6))
def test_version_1_records_still_read(payloads):
    rec = v1_record(payloads)
    assert [bytes(p) for p in unpack_record(rec, len(payloads), version=1)] == payloads
    with pytest.raises(CorruptRecordError):  # each version reads its own layout only
        unpack_record(rec, len(payloads))
    with pytest.raises(CorruptRecordError):
        unpack_record(pack_record(payloads), len(payloads), version=1)


@fast
@given(st.lists(st.binary(max_size=50), min_size=1, max_size=6), st.data())
def test_record_damage_is_detected(payloads, data):
    rec = pack_record(payloads)
    with pytest.raises(CorruptRecordError):
        unpack_record(rec, len(payloads) + 1)
    cut = data.draw(st.integers(0, len(rec) - 1))
    with pytest.raises(CorruptRecordError):
        unpack_record(rec[:cut], len(payloads))
    with pytest.raises(CorruptRecordError):
        unpack_record(rec + b"x", len(payloads))
    with pytest.raises(CorruptRecordError):
        unpack_record(b"FPR1" + rec[4:], len(payloads))
    # any single flipped bit, header or payload, is caught: no wrong bytes come out
    bit = data.draw(st.integers(0, 8 * len(rec) - 1))
    flipped = bytearray(rec)
    flipped[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptRecordError):
        unpack_record(bytes(flipped), len(payloads))


# --- fields -------------------------------------------------------------------------------------------

def field_round_trip(field, value):
    stored = field.validate(value)
    payload = field.encode(stored)
    assert isinstance(payload, bytes)
    back = field.decode(payload, "test")
    return stored, back, field.materialize(back)


@fast
@given(st.integers(-2**63, 2**63 - 1))
def test_label_field(n):
    f = LabelField("label")
    _, back, user = field_round_trip(f, n)
    assert back == n and type(user) is int
    assert f.encode(n) == str(n).encode()  # the WebDataset .cls convention


def test_label_field_rejects_garbage():
    with pytest.raises(CorruptRecordError):
        LabelField("label").decode(b"1.5", "x")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                               max_size=4),
    max_leaves=12)


@fast
@given(json_values)
def test_json_field(value):
    _, back, user = field_round_trip(JsonField("meta"), value)
    assert back == value and user == value
    assert json.loads(JsonField("meta").encode(value)) == value


@fast
@given(st.binary(max_size=300))
def test_bytes_field(value):
    _, back, user = field_round_trip(BytesField("blob"), value)
    assert bytes(back) == value and type(user) is bytes and user == value


@fast
@given(numeric_arrays)
def test_array_field_any_shape(arr):
    f = ArrayField("a", arr.dtype.str, None)
    stored, back, user = field_round_trip(f, arr)
    assert same_array(back, arr) and same_array(user, arr)
    assert user.flags.writeable and user.flags.owndata  # a private copy


@fast
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=5)))
def test_array_field_variable_dims(arr):
    f = ArrayField("m", "float32", (None, arr.shape[1]))
    _, back, _ = field_round_trip(f, arr)
    assert same_array(back, arr)
    with pytest.raises(ValueError):
        f.validate(arr.reshape(-1))


@fast
@given(hnp.arrays(np.int16, st.just((3, 2))))
def test_array_field_fixed_shape_fast_path(arr):
    f = ArrayField("v", "int16", (3, 2))
    _, back, _ = field_round_trip(f, arr)
    assert same_array(back, arr)
    with pytest.raises(CorruptRecordError):  # a payload with another shape is refused on read
        f.decode(npy_encode(arr.reshape(2, 3)), "x")
    with pytest.raises(CorruptRecordError):  # and with another dtype
        f.decode(npy_encode(arr.astype(np.int32)), "x")


@fast
@given(st.floats(allow_nan=True) | st.integers(-2**31, 2**31 - 1))
def test_array_field_scalar(x):
    f = ArrayField("s", "float64", ())
    _, back, user = field_round_trip(f, np.float64(x))
    assert back.shape == () and user.shape == ()
    assert back.tobytes() == np.float64(x).tobytes()


def test_array_field_casts_only_safely():
    f = ArrayField("a", "int64", (2,))
    assert f.validate(np.array([1, 2], np.int8)).dtype == np.int64
    with pytest.raises(TypeError):
        f.validate(np.array([1.5, 2.0]))
    with pytest.raises(UnsafeDataError):
        ArrayField("o", object)


@fast
@given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 9), st.integers(1, 9), st.just(3))))
def test_raw_image_field(arr):
    for f in (ImageField("image", "raw"), ImageField("image", "raw", arr.shape)):
        _, back, user = field_round_trip(f, arr)
        assert same_array(back, arr)
        assert same_array(f.to_user(back, "x"), arr)


@fast
@given(st.binary(min_size=1, max_size=100))
def test_encoded_image_field_stores_bytes_unchanged(data):
    f = ImageField("image", "jpeg")
    _, back, user = field_round_trip(f, data)
    assert bytes(back) == data and user == data


# --- schema ----------------------------------------------------------------------------------------

def test_schema_json_round_trip():
    schema = Schema((ImageField("image", "raw", (4, 5, 3)), ImageField("photo", "webp"),
                     LabelField("label"), ArrayField("m", ">u2", (None, 3)),
                     ArrayField("any", "float16"), BytesField("b"), JsonField("meta")))
    back = Schema.from_json(json.loads(json.dumps(schema.to_json())))
    assert back == schema
    for f in schema:
        assert field_from_json(f.to_json()) == f


def test_schema_rejects_clashes():
    with pytest.raises(ValueError):
        Schema((LabelField("x"), JsonField("x")))
    with pytest.raises(ValueError):  # both would be the WebDataset member "<key>.jpg"
        Schema((ImageField("image", "jpeg"), ImageField("label", "jpeg")))
    with pytest.raises(ValueError):
        LabelField("not a name")


# --- JPEG header parsing and truncation checks -----------------------------------------------------

@st.composite
def jpegs(draw):
    w, h = draw(st.integers(1, 48)), draw(st.integers(1, 48))
    mode = draw(st.sampled_from(["RGB", "L"]))
    seed = draw(st.integers(0, 2**16))
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    img = Image.fromarray(arr).convert(mode)
    orientation = draw(st.sampled_from([None, 1, 3, 6, 8]))
    kw = {"quality": draw(st.integers(5, 100)), "progressive": draw(st.booleans()),
          "optimize": draw(st.booleans())}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    out = io.BytesIO()
    img.save(out, "JPEG", **kw)
    return out.getvalue(), (w, h, 3 if mode == "RGB" else 1, orientation or 1)


@fast
@given(jpegs())
def test_jpeg_info_and_complete(case):
    data, expected = case
    assert jpeg_info(data) == expected
    assert jpeg_info(memoryview(data)) == expected
    assert jpeg_complete(data)
    assert jpeg_complete(data + b"\x00\x00\r\n")  # trailing padding some cameras write


@fast
@given(jpegs(), st.data())
def test_truncated_jpeg_is_incomplete(case, data):
    jpg, expected = case
    cut = data.draw(st.integers(0, len(jpg) - 1))
    truncated = jpg[:cut]
    assert not jpeg_complete(truncated)
    info = jpeg_info(truncated)  # never raises; the header either parses fully or not at all
    assert info is None or info == expected


@fast
@given(st.binary(max_size=200))
def test_jpeg_checks_on_garbage_never_raise(junk):
    for data in (junk, b"\xff\xd8" + junk):
        jpeg_complete(data)
        info = jpeg_info(data)
        assert info is None or len(info) == 4


def test_jpeg_info_big_endian_exif():
    # a hand-made APP1 with a Motorola-order TIFF block (PIL writes Intel order)
    tiff = b"MM\x00\x2a\x00\x00\x00\x08" + b"\x00\x01" + struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0) \
        + b"\x00\x00\x00\x00"
    app1 = b"\xff\xe1" + struct.pack(">H", 2 + 6 + len(tiff)) + b"Exif\x00\x00" + tiff
    out = io.BytesIO()
    Image.new("RGB", (7, 5), (10, 200, 30)).save(out, "JPEG")
    plain = out.getvalue()
    data = plain[:2] + app1 + plain[2:]
    assert jpeg_info(data) == (7, 5, 3, 6)
    assert Image.open(io.BytesIO(data)).getexif()[0x0112] == 6  # Pillow agrees it is valid


def test_jpeg_checks_reject_non_jpeg():
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, "PNG")
    assert jpeg_info(out.getvalue()) is None
    assert not jpeg_complete(out.getvalue())
    assert jpeg_info(b"") is None and not jpeg_complete(b"")
