"""Mixing several datasets: make_loader(Mix([a, b], weights=...)), its planned order, source field,
schema checks, per-rank equality and exact resume, on real datasets of every format."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import feedpipe
from converters import convert
from converters.synth import make_photos
from feedpipe import Mix, Output, Sampler, Workers
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.dataset.mixed import MixedReader
from feedpipe.dataset.registry import WRITERS, open_dataset
from feedpipe.errors import ConfigError
from feedpipe.loader.config import LoaderConfig
from feedpipe.loader.mixing import MixOrder, epoch_counts
from feedpipe.loader.sampler import World
from feedpipe.schema.fields import ArrayField, ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema

N_OTHER = 30
KW = dict(size=24, crop="resize", device="cpu",
          fields=["image", "label", "path", "source"], output=Output(dtype="uint8"))


def mix_order(reader, cfg, epoch):
    """The epoch's global order of a mix: mixed (global) indices."""
    return MixOrder.of(reader, cfg).build(len(reader), None, seed=cfg.seed, epoch=epoch)[0]


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> dict[str, Path]:
    """Different photos (seed 1, same four class names) packed as WebDataset and HDF5."""
    root = tmp_path_factory.mktemp("other")
    src = make_photos(root / "src", N_OTHER, size=(96, 72), classes=4, seed=1)
    out = {}
    for fmt, opts in (("wds", {"shard_count": 8}), ("hdf5", None)):
        res = convert(src, root / fmt, to=fmt, workers=0, writer_options=opts)
        assert res.written == N_OTHER
        out[fmt] = root / fmt
    return out


def batches(loader) -> list[dict]:
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
            for b in loader]


def flat(bs: list[dict], key: str) -> list:
    out: list = []
    for b in bs:
        out += b[key].tolist() if isinstance(b[key], torch.Tensor) else list(b[key])
    return out


def reference(path: Path) -> dict[str, tuple[torch.Tensor, int]]:
    """path → (image, label) from a plain loader over one dataset, same options."""
    kw = {**KW, "fields": ["image", "label", "path"]}
    out = {}
    for b in feedpipe.make_loader(path, 16, shuffle=False, num_workers=0, **kw):
        for img, lab, p in zip(b["image"], b["label"].tolist(), b["path"], strict=True):
            out[p] = (img.clone(), lab)
    return out


def test_counts_are_planned():
    assert epoch_counts([72, 30], [0.7, 0.3], 100) == [70, 30]
    assert epoch_counts([72, 30], None, None) == [72, 30]
    assert epoch_counts([10, 10, 10], [1, 1, 1], 10) == [4, 3, 3]  # remainder to the first
    assert sum(epoch_counts([5, 7], [0.123, 0.877], 997)) == 997


def test_proportions_and_source_field(packed, other):
    """Exact per-source counts over an epoch, and every sample's pixels and label are those of
    the dataset its ``source`` names (the two sets share relative paths, not pixels)."""
    mix = {"a": packed["lmdb"], "b": other["wds"]}
    ld = feedpipe.make_loader(Mix(mix, weights=[0.7, 0.3], epoch_size=100), 10, num_workers=0,
                              seed=3, **KW)
    assert ld.source_names == ("a", "b")
    bs = batches(ld)
    assert len(bs) == 10 and all(b["source"].dtype == torch.int64 for b in bs)
    sources = flat(bs, "source")
    assert Counter(sources) == {0: 70, 1: 30}
    refs = [reference(packed["lmdb"]), reference(other["wds"])]
    paths = flat(bs, "path")
    images = torch.cat([b["image"] for b in bs])
    labels = flat(bs, "label")
    for s, p, img, lab in zip(sources, paths, images, labels, strict=True):
        want_img, want_lab = refs[s][p]
        assert torch.equal(img, want_img), (s, p)
        assert lab == want_lab
    # b gives 30 of its 30 samples: each exactly once; a gives 70 distinct of 72
    assert sorted(p for s, p in zip(sources, paths, strict=True) if s == 1) == sorted(refs[1])
    assert len({p for s, p in zip(sources, paths, strict=True) if s == 0}) == 70


def test_the_readme_example_runs_as_written(packed, other):
    """docs/load.md "Mixing datasets": its code block, on two generated datasets of different
    sizes (it used to lack size=, which photos of different sizes need)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "load.md").read_text()
    section = page[page.index("## Mixing datasets"):]
    code = section[section.index("```python\n") + 10:section.index("```\n", 10)]
    space = {"feedpipe": feedpipe, "lmdb_path": packed["lmdb"], "wds_path": other["wds"]}
    exec(code, space)  # noqa: S102 - the docs' own example
    batch = next(iter(space["loader"]))
    assert batch["image"].shape[0] == 64 and set(batch["source"].tolist()) <= {0, 1}


def test_proportions_close_to_weights_within_batches(packed, other):
    """The interleave is a seeded shuffle: a long epoch's running share follows the weights."""
    r = MixedReader([open_dataset(packed["lmdb"]), open_dataset(other["hdf5"])])
    cfg = LoaderConfig(batch_size=8, mix=Mix([], weights=(0.7, 0.3), epoch_size=2000))
    order = mix_order(r, cfg, 0)
    from_b = (order >= 72).astype(float)
    assert from_b.sum() == 600
    halves = [from_b[:1000].mean(), from_b[1000:].mean()]
    assert all(abs(h - 0.3) < 0.05 for h in halves)  # ~6 sigma for a binomial share


def test_down_and_up_sampling_cover_sources(packed, other):
    """A down-weighted source sees all its samples before any repeat (across epochs); an
    up-weighted one repeats each sample count // size times."""
    r = MixedReader([open_dataset(packed["hdf5"]), open_dataset(other["wds"])])
    cfg = LoaderConfig(batch_size=8, mix=Mix([], weights=(1, 1), epoch_size=72))  # a: 36 of 72, b: 36 of 30
    e0, e1 = mix_order(r, cfg, 0), mix_order(r, cfg, 1)
    a = np.concatenate([e0[e0 < 72], e1[e1 < 72]])
    assert sorted(a.tolist()) == list(range(72))
    assert not np.array_equal(e0, e1)
    cfg = LoaderConfig(batch_size=8, mix=Mix([], weights=(0, 1), epoch_size=60))
    b = mix_order(r, cfg, 0)
    assert Counter(b.tolist()) == {72 + i: 2 for i in range(N_OTHER)}


def test_same_order_whatever_workers(packed, other):
    mix = Mix([packed["wds"], other["hdf5"], packed["lmdb"]], weights=[0.5, 0.3, 0.2])
    kw = dict(seed=7, **KW)
    ref = batches(feedpipe.make_loader(mix, 8, num_workers=0, **kw))
    got = batches(feedpipe.make_loader(mix, 8, num_workers=2, **kw))
    assert len(ref) == len(got)
    for x, y in zip(ref, got, strict=True):
        assert torch.equal(x["source"], y["source"]) and torch.equal(x["label"], y["label"])
        assert torch.equal(x["image"], y["image"]) and x["path"] == y["path"]
    other_seed = batches(feedpipe.make_loader(mix, 8, num_workers=0, **{**kw, "seed": 8}))
    assert flat(other_seed, "source") != flat(ref, "source")


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_equal_batches_per_rank(packed, other, uneven):
    """Every rank gets the same number of batches; together they read the planned epoch."""
    mix = Mix([packed["lmdb"], other["wds"]], weights=[0.6, 0.4], epoch_size=101)
    kw = dict(num_workers=0, seed=2, size=24, crop="resize", device="cpu",
              fields=["label", "source"], output=Output(dtype="uint8"))
    ranks = [batches(feedpipe.make_loader(mix, 8, sampler=Sampler(World(r, 3), uneven),
                                          **kw)) for r in range(3)]
    assert len({len(b) for b in ranks}) == 1
    counts = Counter(s for b in ranks for s in flat(b, "source"))
    total = sum(counts.values())
    assert total == (102 if uneven == "pad" else 99)  # 34/34/33 padded, or trimmed to 33 each


def test_resume_mid_epoch_exact(packed, other):
    mix = Mix({"photos": packed["hdf5"], "more": other["wds"]}, weights=[0.3, 0.7],
              epoch_size=80)
    kw = dict(seed=4, num_workers=0, **KW)
    ref = batches(feedpipe.make_loader(mix, 8, **kw))
    ld = feedpipe.make_loader(mix, 8, **kw)
    it = iter(ld)
    for _ in range(4):
        next(it)
    state = ld.state_dict()
    assert state["mix"]["names"] == ["photos", "more"]
    resumed = feedpipe.make_loader(mix, 8, **kw)
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(rest) == len(ref) - 4
    for x, y in zip(ref[4:], rest, strict=True):
        assert torch.equal(x["source"], y["source"]) and torch.equal(x["image"], y["image"])
    changed = feedpipe.make_loader(replace(mix, weights=[0.5, 0.5]), 8, **kw)
    with pytest.raises(ConfigError, match="mix"):
        changed.load_state_dict(state)


def _tiny(root: Path, image: ImageField, label=None, classes=("a", "b")) -> Path:
    """A 6-sample LMDB dataset with the given image field (and label field)."""
    label = label or LabelField("label")
    schema = Schema((image, label, JsonField("path")))
    w = WRITERS["lmdb"](root, schema)
    for i in range(6):
        img = np.full((24, 24, 3), 40 * i, np.uint8)
        if image.codec != "raw":
            from fp_helpers import jpeg_bytes
            img = jpeg_bytes(img)
        w.write({"image": img, "label": i % 2 if isinstance(label, LabelField)
                 else np.float32(i), "path": f"{i}.x"})
    files, _ = w.close()
    Manifest("lmdb", 6, schema, classes=classes,
             files=tuple(FileEntry.of(root, f) for f in files)).write(root)
    return root


def test_schema_mismatch_names_the_field(tmp_path, packed):
    raw = _tiny(tmp_path / "raw", ImageField("image", "raw", (24, 24, 3)))
    with pytest.raises(ConfigError, match=r"'image'.*raw") as exc:
        feedpipe.make_loader([packed["lmdb"], raw], 4, **KW)
    assert exc.value.option == "fields"
    odd = _tiny(tmp_path / "odd", ImageField("image"), ArrayField("label", "float32", ()))
    with pytest.raises(ConfigError, match=r"'label'.*kind"):
        feedpipe.make_loader([packed["lmdb"], odd], 4, **KW)
    # not requested, no complaint: the image fields agree
    ld = feedpipe.make_loader([packed["lmdb"], odd], 4, **{**KW, "fields": ["image", "source"]})
    assert len(ld) == (72 + 6 + 3) // 4


def test_class_lists_equal_or_union(tmp_path, packed):
    two = _tiny(tmp_path / "two", ImageField("image"), classes=("zebra", "astronaut"))
    with pytest.raises(ConfigError, match=r"Mix\(\.\.\., classes='union'\)") as exc:
        feedpipe.make_loader([packed["lmdb"], two], 4, **KW)
    assert "zebra" in str(exc.value)
    ld = feedpipe.make_loader(Mix([packed["lmdb"], two], classes="union"), 6, num_workers=0, **KW)
    first = open_dataset(packed["lmdb"]).classes
    assert ld.classes == (*first, "zebra")
    seen = Counter()
    for b in ld:
        for s, lab, p in zip(b["source"].tolist(), b["label"].tolist(), b["path"], strict=True):
            if s == 1:
                want = ("zebra", "astronaut")[int(p.split(".")[0]) % 2]
                assert ld.classes[lab] == want
                seen[want] += 1
    assert seen == {"zebra": 3, "astronaut": 3}


def test_bad_mix_options(packed):
    with pytest.raises(ConfigError, match="a list of datasets"):
        feedpipe.make_loader(Mix(packed["lmdb"], weights=[1.0]), 4, **KW)
    with pytest.raises(ConfigError, match="one weight per dataset"):
        feedpipe.make_loader(Mix([packed["lmdb"], packed["wds"]], weights=[1.0]), 4, **KW)
    with pytest.raises(ConfigError, match="weights"):
        feedpipe.make_loader(Mix([packed["lmdb"], packed["wds"]], weights=[1.0, -1.0]), 4, **KW)
    with pytest.raises(ConfigError, match="epoch_size"):
        feedpipe.make_loader(Mix([packed["lmdb"], packed["wds"]], epoch_size=0), 4, **KW)


def test_dali_backend_reads_the_same_mix(packed, other):
    """backend="dali" (CPU mode): the same plan, so the same sources, labels and paths per batch
    as the torch backend; only the decoder and resizer differ (pixels close, not equal)."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported")
    mix = Mix([packed["lmdb"], other["wds"]], weights=[0.6, 0.4], epoch_size=40)
    kw = dict(seed=5, num_workers=0, **KW)
    d = batches(feedpipe.make_loader(mix, 8, backend="dali", **kw))
    t = batches(feedpipe.make_loader(mix, 8, backend="torch", **kw))
    assert len(d) == len(t) == 5
    for x, y in zip(d, t, strict=True):
        assert torch.equal(x["source"].cpu(), y["source"]) and x["path"] == y["path"]
        assert torch.equal(x["label"].cpu(), y["label"])
        diff = (x["image"].cpu().float() - y["image"].float()).abs().mean().item()
        assert diff < 8, diff


def test_jpeg_and_png_sources_mix(tmp_path, packed, other):
    """Encoded images of different codecs mix (each record decoded by its own magic bytes),
    pixel-exact to each dataset read alone."""
    src = tmp_path / "src"
    make_photos(src, 8, size=(64, 48), classes=4, seed=2)
    png = tmp_path / "png"
    convert(src, png, to="lmdb", workers=0, codec="png")
    ld = feedpipe.make_loader({"jpeg": other["hdf5"], "png": png}, 8, num_workers=0, **KW)
    refs = [reference(other["hdf5"]), reference(png)]
    seen = Counter()
    for b in ld:
        for s, p, img in zip(b["source"].tolist(), b["path"], b["image"], strict=True):
            assert torch.equal(img, refs[s][p][0])
            seen[s] += 1
    assert seen == {0: N_OTHER, 1: 8}


def test_corrupt_record_names_its_dataset(tmp_path, packed):
    """A damaged record in a mix is named by its source's name, directory, key and file."""
    from fp_helpers import jpeg_bytes

    from feedpipe.errors import CorruptRecordError

    root = tmp_path / "bad"
    schema = Schema((ImageField("image"), LabelField("label"), JsonField("path")))
    w = WRITERS["lmdb"](root, schema)
    good = jpeg_bytes(np.full((24, 24, 3), 90, np.uint8))
    for i in range(6):
        w.write({"image": good[:200] if i == 3 else good, "label": i % 2, "path": f"img{i}.jpg"})
    files, _ = w.close()
    classes = open_dataset(packed["lmdb"]).classes
    Manifest("lmdb", 6, schema, classes=classes,
             files=tuple(FileEntry.of(root, f) for f in files)).write(root)
    ld = feedpipe.make_loader({"good": packed["lmdb"], "bad": root}, 8, shuffle=False,
                              num_workers=0, **KW)
    with pytest.raises(CorruptRecordError) as exc:
        list(ld)
    msg = str(exc.value)
    assert "mix source 'bad'" in msg and str(root) in msg and "000000003" in msg
    assert "img3.jpg" in msg
    skipping = feedpipe.make_loader({"good": packed["lmdb"], "bad": root}, 8, shuffle=False,
                                    num_workers=0, workers=Workers(on_error="skip"), **KW)
    with pytest.warns(UserWarning, match="skipped 1"):
        assert sum(len(b["label"]) for b in skipping) == 78
    assert len(skipping.skipped) == 1 and "img3.jpg" in skipping.skipped[0]


def test_sharded_source_reads_stay_shard_local(packed, other):
    """A WebDataset source is read shard by shard in the mix's order: within an epoch its
    samples change shard only when a shard is done (one shard open per source at a time)."""
    wds = open_dataset(other["wds"])
    shards = wds.shard_ranges()
    assert len(shards) >= 3
    r = MixedReader([open_dataset(packed["lmdb"]), wds])
    order = mix_order(r, LoaderConfig(batch_size=8, seed=9), 0)
    local = order[order >= 72] - 72
    assert sorted(local.tolist()) == list(range(N_OTHER))
    shard_of = np.searchsorted([s.stop for s in shards], local, side="right")
    assert int((np.diff(shard_of) != 0).sum()) == len(shards) - 1


def test_mix_resumes_at_another_world_size(packed, other):
    """A mix saved by 2 ranks mid-epoch resumes on 3 ranks with exactly the rest of the epoch's
    planned picks (the global order is the mix's, dealt anew)."""
    kw = dict(fields=["path", "source"], size=16, seed=5, device="cpu", num_workers=0,
              output=Output(dtype="uint8"))
    srcs = Mix([packed["lmdb"], other["wds"]], weights=[0.7, 0.3], epoch_size=60)

    def loaders(size):
        return [feedpipe.make_loader(srcs, 4, sampler=Sampler(world=World(r, size)),
                                     **kw) for r in range(size)]

    def picks(ld, n=None):
        it = iter(ld)
        return [(int(s), p) for _, b in zip(range(len(ld) if n is None else n), it, strict=False)
                for s, p in zip(b["source"], b["path"], strict=True)]

    whole = [x for ld in loaders(1) for x in picks(ld)]
    pre, two = [], loaders(2)
    for ld in two:
        pre += picks(ld, 3)
    state = two[0].state_dict()
    assert state["samples"] == len(pre) == 24
    post = []
    for ld in loaders(3):
        ld.load_state_dict(state)
        post += picks(ld)
    assert sorted(pre + post) == sorted(whole)
