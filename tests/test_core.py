"""Core contract: every format round-trips converted photos; make_loader batches them."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import feedpipe
from converters import convert
from converters.synth import make_photos
from feedpipe import Output, Sampler
from feedpipe.errors import BadInputError

FORMATS = ["lmdb", "hdf5", "wds"]


@pytest.fixture(scope="session")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    make_photos(root, 96, size=(160, 120), classes=3, seed=0)
    (root / "astronaut" / "notes.txt").write_text("not an image")
    (root / "coffee" / "broken.jpg").write_bytes(b"")
    return root


@pytest.fixture(scope="session", params=FORMATS)
def packed(request, photos, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "ds"
    res = convert(photos, out, to=request.param, workers=0)
    return out, res


def test_round_trip_passthrough(packed, photos):
    out, res = packed
    ds = feedpipe.open_dataset(out)
    assert len(ds) == res.written == 96
    assert res.ignored == 1 and [s["path"] for s in res.skipped] == ["coffee/broken.jpg"]
    assert ds.manifest.skipped[0]["reason"] == "empty file"
    for i in (0, 17, -1):
        raw = ds.read_raw(i)
        assert raw["image"] == (photos / raw["path"]).read_bytes()
        img = ds[i]["image"]
        ref = np.asarray(Image.open(io.BytesIO(raw["image"])).convert("RGB"))
        assert img.shape == ref.shape and img.dtype == np.uint8
        assert np.abs(img.astype(int) - ref).mean() < 2
        assert ds.classes[ds[i]["label"]] == raw["path"].split("/")[0]
    batch = ds.get_batch([5, 2, 5, -1])
    assert [b["path"] for b in batch] == [ds[5]["path"], ds[2]["path"], ds[5]["path"],
                                          ds[len(ds) - 1]["path"]]
    with pytest.raises(IndexError):
        ds[len(ds)]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone[3]["path"] == ds[3]["path"]


def test_incomplete_output_refused(tmp_path, photos):
    out = tmp_path / "x"
    convert(photos, out, to="lmdb", workers=0)
    (out / "feedpipe.json").unlink()
    with pytest.raises(BadInputError, match="did not finish"):
        feedpipe.open_dataset(out)


def test_cli_convert_info_verify(tmp_path, photos):
    out = tmp_path / "cli"
    cli = [sys.executable, "-m", "feedpipe.cli"]
    r = subprocess.run([*cli, "convert", str(photos), "--to", "wds", "-o", str(out), "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote 96 of 97 inputs" in r.stdout and "1 skipped" in r.stdout
    assert "96 samples" in subprocess.run([*cli, "info", str(out)], capture_output=True,
                                          text=True).stdout
    assert subprocess.run([*cli, "verify", str(out)]).returncode == 0
    shard = out / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[2000] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = subprocess.run([*cli, "verify", str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "shard-000000.tar" in r.stdout


@pytest.mark.parametrize("workers", [0, 2])
def test_make_loader_batches(packed, workers):
    out, _ = packed
    ld = feedpipe.make_loader(out, 16, size=64, device="cpu", num_workers=workers,
                              seed=3, output=Output(dtype="uint8"))
    assert len(ld) == 6
    batches = list(ld)
    assert [b["image"].shape for b in batches] == [torch.Size([16, 3, 64, 64])] * 6
    labels = torch.cat([b["label"] for b in batches])
    ds = feedpipe.open_dataset(out)
    assert sorted(labels.tolist()) == sorted(ds[i]["label"] for i in range(len(ds)))
    ld.set_epoch(0)
    again = list(ld)
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(batches, again, strict=True))


def test_resume_continues_exactly(packed):
    out, _ = packed
    kw = dict(size=32, device="cpu", num_workers=0, seed=7, output=Output(dtype="uint8"))
    full = [b["label"] for b in feedpipe.make_loader(out, 8, **kw)]
    ld = feedpipe.make_loader(out, 8, **kw)
    it = iter(ld)
    for _ in range(5):
        next(it)
    state = ld.state_dict()
    fresh = feedpipe.make_loader(out, 8, **kw)
    fresh.load_state_dict(state)
    rest = [b["label"] for b in fresh]
    assert len(rest) == len(full) - 5
    assert all(torch.equal(a, b) for a, b in zip(rest, full[5:], strict=True))


def test_ranks_disjoint_equal(packed):
    from feedpipe.loader.sampler import World
    out, _ = packed
    seen, counts = [], []
    for rank in range(3):
        ld = feedpipe.make_loader(out, 10, size=32, device="cpu", num_workers=0, fields=["path"],
                                  output=Output(dtype="uint8"),
                                  sampler=Sampler(world=World(rank, 3), uneven="drop"))
        paths = [p for b in ld for p in b["path"]]
        counts.append(len(ld))
        seen.append(set(paths))
    assert len(set(counts)) == 1
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_normalized_float_output(packed):
    out, _ = packed
    ld = feedpipe.make_loader(out, 8, size=48, device="cpu", num_workers=0)
    b = next(iter(ld))
    assert b["image"].dtype == torch.float32 and b["image"].shape == (8, 3, 48, 48)
    assert b["image"].is_contiguous(memory_format=torch.channels_last)
    assert -3 < b["image"].mean().item() < 3


def test_webdataset_library_reads_our_shards(tmp_path, photos):
    import webdataset as wds

    out = tmp_path / "w"
    convert(photos, out, to="wds", workers=0, writer_options={"shard_count": 40})
    ds = feedpipe.open_dataset(out)
    shards = sorted(str(p) for p in out.glob("shard-*.tar"))
    assert len(shards) == 3
    samples = list(wds.WebDataset(shards, shardshuffle=False, empty_check=False))
    assert len(samples) == len(ds)
    for k in (0, 45, 95):
        raw = ds.read_raw(k)
        assert samples[k]["jpg"] == raw["image"]
        assert int(samples[k]["cls"]) == raw["label"]
        assert samples[k]["__key__"] == ds.key_of(k)


class _Boom:
    def __reduce__(self):
        import pathlib
        return (pathlib.Path.touch, (pathlib.Path(_Boom.marker),))


def test_pickle_payload_is_refused_without_running(tmp_path):
    import lmdb

    from feedpipe.dataset.manifest import FileEntry, Manifest
    from feedpipe.dataset.registry import WRITERS
    from feedpipe.errors import UnsafeDataError
    from feedpipe.schema.codecs import pack_record
    from feedpipe.schema.fields import ArrayField
    from feedpipe.schema.model import Schema

    schema = Schema((ArrayField("x", "float32", (2,)),))
    with pytest.raises(UnsafeDataError):
        ArrayField("y", "O")
    root = tmp_path / "evil"
    w = WRITERS["lmdb"](root, schema)
    w.write({"x": np.zeros(2, np.float32)})
    files, extra = w.close()
    _Boom.marker = str(tmp_path / "pwned")
    evil = io.BytesIO()
    np.save(evil, np.array([_Boom()], dtype=object), allow_pickle=True)
    env = lmdb.open(str(root), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"000000000", pack_record([evil.getvalue()]))
    env.close()
    Manifest("lmdb", 1, schema, files=tuple(FileEntry.of(root, f) for f in files)).write(root)
    ds = feedpipe.open_dataset(root)
    with pytest.raises(UnsafeDataError, match="object dtype"):
        ds[0]
    assert not (tmp_path / "pwned").exists()


def test_import_and_convert_cli_do_not_import_torch(tmp_path, photos):
    # torch costs 1-2 s at start-up: a conversion (and the codecs) must not pay for it, while
    # the lazy top-level names keep working
    code = ("import sys, feedpipe, feedpipe.schema.codecs, feedpipe.dataset.registry, converters\n"
            "from feedpipe.cli import main\n"
            f"assert main(['convert', {str(photos)!r}, '--to', 'wds', '-o', "
            f"{str(tmp_path / 'out')!r}, '-q']) == 0\n"
            "assert 'torch' not in sys.modules and 'scipy' not in sys.modules, 'imported'\n"
            "assert callable(feedpipe.make_loader) and 'torch' in sys.modules\n"
            "assert 'make_loader' in dir(feedpipe) and feedpipe.Schema.__name__ == 'Schema'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    with pytest.raises(AttributeError):
        feedpipe.no_such_name  # noqa: B018
    assert all(getattr(feedpipe, name) is not None for name in feedpipe.__all__)


def test_the_public_names_are_one_list():
    """``__all__`` names every lazy export (it listed 18 of 38), each resolves to the object its
    module defines, and ``from feedpipe import *`` brings them all."""
    import importlib

    from feedpipe import _EXPORTS

    assert sorted(feedpipe.__all__) == sorted(_EXPORTS) and len(feedpipe.__all__) == 47
    for name, module in _EXPORTS.items():  # converters: a package beside feedpipe (convert)
        path = module if module == "converters" else f"feedpipe.{module}"
        assert getattr(feedpipe, name) is getattr(importlib.import_module(path), name)
    scope: dict[str, object] = {}
    exec("from feedpipe import *", scope)  # noqa: S102
    assert set(scope) - {"__builtins__"} == set(_EXPORTS)
    assert set(_EXPORTS) <= set(dir(feedpipe))
