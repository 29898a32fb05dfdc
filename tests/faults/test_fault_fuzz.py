"""Fuzzing the record decoders: whatever bytes they are given, they return or raise a typed
FeedpipeError (never a bare ValueError, struct.error, KeyError...). A few hundred cases each in the
quick tier, thousands under the ``heavy`` marker.

The heavy tier also damages whole structures of real datasets (HDF5 object headers, B-tree
nodes, heaps and the start of each dataset's data, LMDB meta and tree pages, tar headers, the
index files' npy headers), each case in a subprocess (``fuzz_driver.py``) watched with a
timeout: ``verify`` and ``make_loader`` must give a typed error within 10 s or the right data,
never a hang, a crash or a wrong sample."""

from __future__ import annotations

import io
import json
import re
import struct
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
from fuzz_driver import run_cases
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from feedpipe.dataset.formats.wds import group_by_key, tar_members
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest
from feedpipe.errors import BadInputError, FeedpipeError
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


def decoded(data: bytes, path: Path) -> list[dict]:
    """The shard's samples as the reader decodes them: its tar parsing and grouping, then each
    member present through its field's decoder."""
    return [{f.name: f.decode(group[f.wds_suffix], f"{path} key {key}") for f in SCHEMA
             if f.wds_suffix in group}
            for key, group in group_by_key(tar_members(io.BytesIO(data), path), path)]


@pytest.mark.parametrize("cases", TIERS)
def test_tar_member_headers(cases):
    valid = shard_bytes()
    path = Path("fuzz.tar")
    assert [len(s) for s in decoded(valid, path)] == [len(SCHEMA)] * 2

    @fuzz(cases)
    @given(st.one_of(st.binary(max_size=2048), mutated(valid), mutated(valid[:1024])))
    def run(data):
        only_typed(lambda: decoded(data, path))

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


# --- whole structures damaged in real datasets: a typed error within 10 s, or the right data ---

def spans_hdf5(root: Path, name: str = "data.h5") -> dict[str, tuple[str, int, int]]:
    """The HDF5 file's structures: the superblock, object headers, B-tree nodes, the group's
    local heap and symbol table node, and the first bytes of each dataset's data (images,
    offsets, labels, crc32s)."""
    import h5py

    raw = (root / name).read_bytes()
    out = {"superblock": (name, 0, 96)}
    with h5py.File(root / name, "r") as f:
        out["root group header"] = (name, h5py.h5o.get_info(f.id).addr, 256)
        for ds in f:
            out[f"{ds} header"] = (name, h5py.h5o.get_info(f[ds].id).addr, 256)
            out[f"{ds} data"] = (name, f[ds].id.get_offset(), 1024)
    for sig, size in ((b"TREE", 256), (b"HEAP", 32), (b"SNOD", 256)):
        for k, at in enumerate(m.start() for m in re.finditer(sig, raw)):
            out[f"{sig.decode()} {k}"] = (name, at, size)
    return out


def spans_lmdb(root: Path) -> dict[str, tuple[str, int, int]]:
    """LMDB's two meta pages, a branch page, a leaf page and an overflow page (its header and
    the whole page), found by their page flags."""
    raw = (root / "data.mdb").read_bytes()
    first: dict[int, int] = {}
    for pg in range(2, len(raw) // 4096):
        first.setdefault(struct.unpack_from("<H", raw, pg * 4096 + 10)[0], pg)
    out = {"meta page 0": ("data.mdb", 0, 4096), "meta page 1": ("data.mdb", 4096, 4096)}
    for flag, what in ((1, "branch page"), (2, "leaf page"), (4, "overflow page")):
        if flag in first:
            out[what] = ("data.mdb", first[flag] * 4096, 4096)
    if 4 in first:
        out["overflow header"] = ("data.mdb", first[4] * 4096, 16)
    return out


def spans_wds(root: Path) -> dict[str, tuple[str, int, int]]:
    """Tar headers (a shard's first and a later member's, its end-of-archive blocks), the npy
    header of every index file, and a page of index offsets."""
    shard = "shard-000001.tar"
    size = (root / shard).stat().st_size
    with tarfile.open(root / shard) as tar:
        fifth = tar.getmembers()[5].offset
    out = {"first tar header": (shard, 0, 512), "fifth tar header": (shard, fifth, 512),
           "end of archive": (shard, size - 1024, 1024),
           "index offsets page": ("index-offsets.npy", 128, 4096)}
    for name in sorted(p.name for p in root.glob("index-*.npy")):
        out[f"{name} header"] = (name, 0, 128)
    return out


SPANS = {"hdf5": spans_hdf5, "lmdb": spans_lmdb, "wds": spans_wds}


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", ["hdf5", "lmdb", "wds"])
def test_damaged_structures_give_a_typed_error_in_seconds(fmt, packed, tmp_path):
    """Each structure, zeroed and overwritten with random bytes: ``verify`` names a problem and
    ``make_loader`` (either ``on_error``) raises a FeedpipeError or yields only right samples,
    each within 10 s, without crashing (every case in a subprocess)."""
    cases = {f"{what} ({mode})": {"file": name, "offset": offset, "length": length, "mode": mode}
             for what, (name, offset, length) in SPANS[fmt](packed[fmt]).items()
             for mode in ("zero", "rand")}
    failures = run_cases(packed[fmt], cases, tmp_path / "case")
    assert not failures, "\n".join(failures)


@pytest.mark.heavy
def test_damaged_merged_hdf5_gives_a_typed_error_in_seconds(photo_dir, tmp_path):
    """A merged HDF5 dataset (its parts' files, read together): each structure of a part's
    ``data.h5``, zeroed and randomised: the same answers as above."""
    from converters import convert
    from converters.merge import merge
    from converters.parts import Part

    src = tmp_path / "merged"
    for i in range(2):
        convert(photo_dir, src, to="hdf5", workers=0, part=Part(i, 2))
    merge(src)
    cases = {f"{what} ({mode})": {"file": name, "offset": offset, "length": length, "mode": mode}
             for what, (name, offset, length) in spans_hdf5(
                 src, f"parts/{Part(1, 2).name}/data.h5").items() for mode in ("zero", "rand")}
    failures = run_cases(src, cases, tmp_path / "case")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("cases", TIERS)
def test_progressive_transcode(cases):
    """Damaged progressive JPEGs through the lossless transcode to baseline: it gives
    a file that decodes to exactly the source's pixels, keeps the source with a reason, or
    refuses it as damaged (BadInputError, when it would decode to made-up pixels); nothing else
    raises and the process never crashes (a beta libjpeg-turbo is bundled)."""
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
        try:
            got, why = to_baseline(data)
        except BadInputError:
            return
        if got is None:
            assert why.startswith("not transcoded: ")
        else:
            assert np.array_equal(simplejpeg.decode_jpeg(got), simplejpeg.decode_jpeg(data))

    run()
