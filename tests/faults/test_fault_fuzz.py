"""Fuzzing the record decoders: whatever bytes they are given, they return or raise a typed
FeedpipeError (never a bare ValueError, struct.error, KeyError...). A few hundred cases each in the
quick tier, thousands under the ``heavy`` marker."""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from feedpipe.dataset.formats.wds import decode_samples, group_by_key, tar_members
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest
from feedpipe.errors import FeedpipeError
from feedpipe.schema.codecs import npy_decode, npy_encode, pack_record, unpack_record
from feedpipe.schema.fields import ArrayField, ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema

TIERS = [pytest.param(300, id="quick"), pytest.param(3000, id="heavy", marks=pytest.mark.heavy)]
SCHEMA = Schema((ImageField("image"), LabelField("label"), JsonField("path"),
                 ArrayField("emb", "float32", (None,))))


def fuzz(cases: int):
    return settings(max_examples=cases, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def mutated(base: bytes) -> st.SearchStrategy[bytes]:
    """``base`` with a few bytes overwritten, a cut, or bytes inserted: near-valid inputs reach
    deeper into a decoder than random bytes."""
    def apply(edits: list[tuple[int, int]], cut: int | None, insert: bytes) -> bytes:
        out = bytearray(base)
        for pos, val in edits:
            out[pos % len(out)] = val
        if cut is not None:
            out = out[: cut % (len(out) + 1)]
        k = len(out) // 2
        return bytes(out[:k] + insert + out[k:])

    return st.builds(apply, st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)),
                                     max_size=6),
                     st.none() | st.integers(0, 1 << 20), st.binary(max_size=8))


def only_typed(fn, *args) -> None:
    try:
        fn(*args)
    except FeedpipeError:
        pass


@pytest.mark.parametrize("cases", TIERS)
def test_record_header(cases):
    valid = pack_record([b"\xff\xd8jpeg", b"3", b'"a/b.jpg"'])

    @fuzz(cases)
    @given(st.one_of(st.binary(max_size=64), mutated(valid)), st.integers(0, 5),
           st.sampled_from([1, 2]))
    def run(data, nfields, version):
        only_typed(lambda: [bytes(p) for p in unpack_record(data, nfields, version=version)])

    run()


@pytest.mark.parametrize("cases", TIERS)
def test_npy_header_and_array_codec(cases):
    samples = [npy_encode(a) for a in (np.arange(6, dtype="<f4").reshape(2, 3),
                                       np.zeros((0, 4), np.uint8), np.array(7, ">i8"))]
    big = io.BytesIO()  # a version-2 header, as numpy writes for very long headers
    np.lib.format.write_array(big, np.ones(3, np.uint16), version=(2, 0))
    samples.append(big.getvalue())
    field = ArrayField("emb", "float32", (None,))

    magic = st.binary(max_size=40).map(lambda b: b"\x93NUMPY" + b)

    @fuzz(cases)
    @given(st.one_of(st.binary(max_size=80), magic, *(mutated(s) for s in samples)))
    @example(b"\x93NUMPY\x02\x00\x00\x00")  # a version-2 header cut before its length
    @example(b"\x93NUMPY\x01\x00\x40\x00{'descr': '<f4', 'fortran_order': False, "
             b"'shape': (0, -1), }    ")
    def run(data):
        only_typed(npy_decode, data)
        only_typed(field.decode, data, "emb")

    run()


def shard_bytes() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key in ("000000000", "000000001"):
            for suffix, data in (("jpg", b"\xff\xd8\xff\xd9"), ("cls", b"1"),
                                 ("path.json", b'"x.jpg"'),
                                 ("emb.npy", npy_encode(np.ones(2, np.float32)))):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("cases", TIERS)
def test_tar_member_headers(cases):
    valid = shard_bytes()
    path = Path("fuzz.tar")
    assert len(list(decode_samples(group_by_key(tar_members(io.BytesIO(valid), path)), SCHEMA,
                                   path))) == 2

    @fuzz(cases)
    @given(st.one_of(st.binary(max_size=2048), mutated(valid), mutated(valid[:1024])))
    def run(data):
        only_typed(lambda: list(decode_samples(
            group_by_key(tar_members(io.BytesIO(data), path), path), SCHEMA, path)))

    run()


def manifest_json() -> dict:
    return {"feedpipe_manifest": 1, "feedpipe_version": "0", "format": "lmdb",
            "format_version": 2, "num_samples": 3, "schema": SCHEMA.to_json(),
            "classes": ["a"], "files": [{"name": "data.mdb", "size": 1, "sha256": "0"}],
            "conversion": {}, "skipped": [], "extra": {}, "complete": True}


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)


def replace_at(doc: dict, path: list[int], value: object) -> dict:
    """``doc`` with one node (chosen by ``path`` through dicts and lists) set to ``value``."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for step in path:
        kids = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not kids:
            break
        key = kids[step % len(kids)]
        if not isinstance(node[key], (dict, list)) or step % 3 == 0:
            node[key] = value
            return doc
        node = node[key]
    return doc


@pytest.mark.parametrize("cases", TIERS)
def test_manifest_json(cases):
    base = manifest_json()
    text = json.dumps(base)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / MANIFEST_NAME).write_text(text)
        assert Manifest.read(root).num_samples == 3

        @fuzz(cases)
        @given(st.one_of(st.builds(replace_at, st.just(base), st.lists(st.integers(0, 50),
                                                                       max_size=5), JSON),
                         JSON.map(lambda v: {**base, "schema": v})),
               st.one_of(st.none(), mutated(text.encode())))
        def run(doc, raw):
            (root / MANIFEST_NAME).write_bytes(json.dumps(doc).encode() if raw is None else raw)
            only_typed(Manifest.read, root)

        run()


@pytest.mark.parametrize("cases", TIERS)
def test_progressive_transcode(cases):
    """Damaged progressive JPEGs through the lossless transcode to baseline (issue 24): it gives
    a file that decodes to exactly the source's pixels, or keeps the source with a reason; it
    never raises and never crashes the process (a beta libjpeg-turbo is bundled)."""
    simplejpeg = pytest.importorskip("simplejpeg")
    from PIL import Image

    from converters.progressive import to_baseline

    rng = np.random.default_rng(0)
    smooth = np.kron(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8))
    out = io.BytesIO()
    Image.fromarray(smooth).save(out, "JPEG", quality=85, progressive=True)

    @fuzz(cases)
    @given(mutated(out.getvalue()))
    def run(data):
        got, why = to_baseline(data)
        if got is None:
            assert why.startswith("not transcoded: ")
        else:
            assert np.array_equal(simplejpeg.decode_jpeg(got), simplejpeg.decode_jpeg(data))

    run()
