"""Keypoints, boxes, text and arrays: lossless round trips in every format, the batches the
loader makes of them (padded, CTC-ready, stacked, lists), conversion from manifest columns, and
the refusals (bad values, DALI, geometric-looking meta)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from fp_helpers import CLI

import feedpipe
from converters import LabelColumns, convert
from converters.synth import make_photos
from feedpipe import Output
from feedpipe.errors import ConfigError
from feedpipe.schema import (
    ArrayField,
    BoxesField,
    ImageField,
    KeypointsField,
    Schema,
    TextField,
)
from feedpipe.schema.model import field_from_json

sys.path.insert(0, str(Path(__file__).parent))
from test_writers import write_dataset  # noqa: E402

VOCAB = "0123456789abcdef"
SCHEMA = Schema((
    ImageField("image", "raw", (20, 30, 3)),
    KeypointsField("kp", shape=(3, 3), flip_indices=(1, 0, 2)),
    BoxesField("boxes", classes=("cat", "dog", "émeu"), attrs=("iscrowd",)),
    TextField("text", vocab=VOCAB),
    TextField("caption"),
    ArrayField("series", "float32", (None, 2)),
    ArrayField("emb", "float16", (4,)),
))
FIELDS = [f.name for f in SCHEMA]


def make_samples(n: int = 11, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        m = i % 5  # 0..4 boxes, 0 included
        xy = rng.uniform(0, 10, (m, 2)).astype(np.float32)  # inside the 30×20 image
        out.append({
            "image": rng.integers(0, 256, (20, 30, 3), dtype=np.uint8),
            "kp": np.array([[1.5, 2.25, 1], [np.float32(1 / 3), 6, 2], [29, 19, 0]], np.float32),
            "boxes": {"boxes": np.concatenate([xy, xy + rng.uniform(0, 9, (m, 2))], 1)
                      .astype(np.float32), "labels": rng.integers(0, 3, m),
                      "iscrowd": rng.integers(0, 2, m)},
            "text": "".join(rng.choice(list(VOCAB), i % 4 + 1)),
            "caption": "ünïcødé ✓" * (i % 2),  # "" included
            "series": rng.normal(size=(i % 6, 2)).astype(np.float32),  # 0 rows included
            "emb": rng.normal(size=4).astype(np.float16),
        })
    return out


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return make_samples()


@pytest.fixture(scope="module", params=["lmdb", "hdf5", "wds"])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            samples: list[dict]) -> Path:
    return write_dataset(request.param, tmp_path_factory.mktemp(request.param) / "ds", samples,
                         SCHEMA)


def test_round_trip_exact(written: Path, samples: list[dict]) -> None:
    ds = feedpipe.open_dataset(written)
    assert ds.schema == SCHEMA  # the manifest keeps flip_indices, classes, attrs and vocab
    for i, s in enumerate(samples):
        got = ds[i]
        np.testing.assert_array_equal(got["kp"], s["kp"])
        assert got["kp"].dtype == np.float32
        for key in ("boxes", "labels", "iscrowd"):
            np.testing.assert_array_equal(got["boxes"][key], s["boxes"][key])
        assert got["boxes"]["boxes"].dtype == np.float32 and got["boxes"]["labels"].dtype == np.int64
        assert got["text"] == s["text"] and got["caption"] == s["caption"]
        np.testing.assert_array_equal(got["series"], s["series"])
        np.testing.assert_array_equal(got["emb"], s["emb"])


def test_field_json_round_trip() -> None:
    for f in SCHEMA:
        assert field_from_json(json.loads(json.dumps(f.to_json()))) == f


def test_batches_padded_ctc_ready_and_stacked(written: Path, samples: list[dict]) -> None:
    loader = feedpipe.make_loader(written, 4, fields=FIELDS, shuffle=False, num_workers=0,
                                  device="cpu")
    seen = 0
    for batch in loader:
        n = len(batch["kp"])
        part = samples[seen: seen + n]
        assert batch["kp"].shape == (n, 3, 2) and batch["kp_visible"].dtype == torch.bool
        counts = [len(s["boxes"]["labels"]) for s in part]
        assert batch["boxes_count"].tolist() == counts
        assert batch["boxes"].shape == (n, max(counts), 4)
        for j, s in enumerate(part):
            m = counts[j]
            np.testing.assert_array_equal(batch["boxes"][j, :m].numpy(), s["boxes"]["boxes"])
            assert batch["boxes_labels"][j, :m].tolist() == s["boxes"]["labels"].tolist()
            assert batch["boxes_iscrowd"][j, :m].tolist() == s["boxes"]["iscrowd"].tolist()
            assert (batch["boxes_labels"][j, m:] == -1).all()
            L = len(s["text"])
            assert batch["text_lengths"][j] == L
            assert batch["text"][j, :L].tolist() == [VOCAB.index(c) + 1 for c in s["text"]]
            assert (batch["text"][j, L:] == 0).all()
            assert batch["caption"][j, : len(s["caption"])].tolist() == [ord(c) for c in
                                                                          s["caption"]]
            r = len(s["series"])
            assert batch["series_lengths"][j] == r
            np.testing.assert_array_equal(batch["series"][j, :r].numpy(), s["series"])
            assert (batch["series"][j, r:] == 0).all()
        np.testing.assert_array_equal(batch["emb"].numpy(), np.stack([s["emb"] for s in part]))
        # CTC-ready: the padded targets and lengths go straight into ctc_loss
        T, C = 8, len(VOCAB) + 1
        log_probs = torch.randn(T, n, C).log_softmax(2)
        loss = torch.nn.functional.ctc_loss(log_probs, batch["text"], torch.full((n,), T),
                                            batch["text_lengths"])
        assert torch.isfinite(loss)
        seen += n
    assert seen == len(samples)


def test_ragged_list_with_workers(written: Path, samples: list[dict]) -> None:
    loader = feedpipe.make_loader(written, 4, fields=["image", "boxes", "series"], shuffle=False,
                                  num_workers=2, device="cpu", output=Output(ragged="list"))
    got = [b for batch in loader for b in zip(batch["boxes"], batch["boxes_labels"],
                                              batch["series"], strict=True)]
    assert len(got) == len(samples)
    for (boxes, labels, series), s in zip(got, samples, strict=True):
        np.testing.assert_array_equal(boxes.numpy(), s["boxes"]["boxes"])
        assert labels.tolist() == s["boxes"]["labels"].tolist()
        np.testing.assert_array_equal(series.numpy(), s["series"])


@pytest.mark.parametrize("field, value, match", [
    (KeypointsField("kp", shape=(3, 2)), np.zeros((4, 2)), "does not match"),
    (BoxesField("b", classes=("a",)), {"boxes": [[0, 0, 1, 1]], "labels": [1]}, "labels must"),
    (BoxesField("b"), {"boxes": [[5, 0, 1, 1]], "labels": [0]}, "x2 >= x1"),
    (BoxesField("b"), {"boxes": [[0, 0, np.nan, 1]], "labels": [0]}, "finite"),
    (BoxesField("b", attrs=("iscrowd",)), {"boxes": [[0, 0, 1, 1]], "labels": [0]}, "iscrowd"),
    (TextField("t", vocab="01"), "012", "outside the vocabulary"),
    (TextField("t"), "a\0b", "NUL"),
])
def test_bad_values_refused(field, value, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        field.validate(value)


def test_bad_schemas_refused() -> None:
    with pytest.raises(ValueError, match="self-inverse permutation"):
        KeypointsField("kp", shape=(3, 2), flip_indices=(1, 2, 0))
    with pytest.raises(ValueError, match=r"\(K, 2\) or \(K, 3\)"):
        KeypointsField("kp", shape=(3, 4))
    with pytest.raises(ValueError, match="float32"):
        KeypointsField("kp", "float64", (3, 2))
    with pytest.raises(ValueError, match="distinct"):
        TextField("t", vocab="aa")


def test_batch_key_clash_refused(tmp_path: Path) -> None:
    schema = Schema((ImageField("image", "raw", (4, 4, 3)), TextField("t"),
                     ArrayField("t_lengths", "int64", (1,))))
    root = write_dataset("lmdb", tmp_path / "ds", [{"image": np.zeros((4, 4, 3), np.uint8),
                                                    "t": "x", "t_lengths": [1]}], schema)
    with pytest.raises(ConfigError, match="t_lengths"):
        feedpipe.make_loader(root, 1, fields=["t", "t_lengths"], num_workers=0, device="cpu")


def test_dali_refuses_geometric_fields_by_name(written: Path) -> None:
    from feedpipe.loader.config import LoaderConfig
    from feedpipe.loader.dali.pipeline import dali_fields
    reader = feedpipe.open_dataset(written)
    for name in ("kp", "boxes"):
        cfg = LoaderConfig(batch_size=2, fields=("image", name), backend="dali")
        with pytest.raises(ConfigError, match=f"does not load keypoints or boxes.*'{name}'"):
            dali_fields(reader, cfg)
    cfg = LoaderConfig(batch_size=2, fields=("image", "text", "series"), backend="dali")
    assert dali_fields(reader, cfg) == ("image", ("text", "series"))  # host fields: served


def write_manifest(tmp_path: Path) -> tuple[Path, list[dict]]:
    src = make_photos(tmp_path / "img", 4, size=(64, 48), classes=1, seed=1)
    rows = []
    for k, p in enumerate(sorted(src.rglob("*.jpg"))):
        np.save(tmp_path / f"w{k}.npy", np.arange(k * 3, dtype=np.float32).reshape(k, 3))
        rows.append({"path": p.relative_to(tmp_path).as_posix(), "label": "face",
                     "landmarks": json.dumps([[10, 12], [40, 12], [25, 30.5]]),
                     "boxes": json.dumps([[1, 2, 30, 40, k]] * k), "code": "ab1"[: k + 1],
                     "window": f"w{k}.npy", "bbox": "[1, 2, 3, 4]"})
    path = tmp_path / "m.csv"
    import csv
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path, rows


def test_manifest_columns_cli(tmp_path: Path) -> None:
    manifest, rows = write_manifest(tmp_path)
    out = tmp_path / "out"
    run = subprocess.run([*CLI, "convert", str(manifest), "--to", "hdf5", "-o", str(out), "-q",
                          "--workers", "0", "--keypoints-column", "landmarks",
                          "--flip-indices", "1,0,2", "--boxes-column", "boxes",
                          "--text-column", "code", "--vocab", "ab1",
                          "--array-column", "window"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "'bbox'" in run.stderr and "meta" in run.stderr  # left in meta: warned
    ds = feedpipe.open_dataset(out)
    assert ds.schema["landmarks"].flip_indices == (1, 0, 2)
    assert ds.schema["code"].vocab == "ab1"
    assert ds.schema["window"].shape == (None, 3)
    for i, r in enumerate(rows):
        s = ds[i]
        np.testing.assert_array_equal(s["landmarks"], np.array(json.loads(r["landmarks"]),
                                                                np.float32))
        assert s["boxes"]["labels"].tolist() == [i] * i
        assert s["code"] == r["code"]
        np.testing.assert_array_equal(s["window"], np.load(tmp_path / r["window"]))
        assert s["meta"] == {"bbox": "[1, 2, 3, 4]"}


def test_keypoints_that_are_not_pixels_of_their_image_are_warned_by_file(tmp_path: Path) -> None:
    """Normalized keypoints (all in [0, 1]) and keypoints mostly outside their image convert
    with a warning naming the files (also kept in the manifest); points stored invisible (COCO's
    0, 0, 0) count for neither, and good rows warn of nothing."""
    src = make_photos(tmp_path / "img", 6, size=(64, 48), classes=1, seed=1)
    cells = [[[10, 12, 2], [40, 12, 2], [0, 0, 0]],  # good, with an unlabelled point at 0, 0
             [[0.1, 0.2, 2], [0.5, 0.45, 2], [0, 0, 0]],  # normalized
             [[0.3, 0.9, 1], [0.7, 0.1, 2], [0, 0, 0]],  # normalized
             [[10, 200, 2], [300, 5, 2], [20, 20, 2]],  # 2 of 3 outside a ~64x48 image
             [[30, 20, 2], [31, 21, 2], [0, 0, 0]],  # good
             [[0, 0, 0], [0, 0, 0], [0, 0, 0]]]  # nothing labelled: nothing to judge
    paths = [p.relative_to(tmp_path).as_posix() for p in sorted(src.rglob("*.jpg"))]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": p, "kp": c}) + "\n"
                                for p, c in zip(paths, cells, strict=True)))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        res = convert(manifest, tmp_path / "out", to="lmdb", workers=0,
                      columns=LabelColumns(keypoints="kp"))
    assert res.written == 6
    said = [str(w.message) for w in got if "keypoints 'kp'" in str(w.message)]
    assert len(said) == 2
    unit = next(m for m in said if "[0, 1]" in m)
    assert "2 of 6 samples" in unit and paths[1] in unit and paths[2] in unit
    assert "normalized" in unit and paths[0] not in unit
    out = next(m for m in said if "outside" in m)
    assert "1 of 6 samples" in out and f"{paths[3]} (" in out and ": 2 of 3)" in out
    assert feedpipe.open_dataset(tmp_path / "out").manifest.conversion[
        "keypoint_warnings"] == said
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"path": p, "kp": cells[0]}) + "\n" for p in paths))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        convert(good, tmp_path / "good", to="lmdb", workers=0,
                columns=LabelColumns(keypoints="kp"))
    assert not [w for w in got if "keypoints" in str(w.message)]


def test_resize_refused_with_geometric_columns(tmp_path: Path) -> None:
    manifest, _ = write_manifest(tmp_path)
    with pytest.raises(ConfigError, match="resize"), pytest.warns(UserWarning, match="bbox"):
        convert(manifest, tmp_path / "out", to="lmdb", resize=32, workers=0,
                columns=LabelColumns(keypoints="landmarks"))


def test_any_shape_arrays_pad_with_per_dim_lengths_or_refuse_mixed_ranks(tmp_path: Path) -> None:
    schema = Schema((ArrayField("a", "int64"),))
    same = [{"a": np.arange(k * 2).reshape(k, 2)} for k in (1, 3)] + [{"a": np.ones((2, 5), np.int64)}]
    root = write_dataset("lmdb", tmp_path / "same", same, schema)
    batch = next(iter(feedpipe.make_loader(root, 3, fields=["a"], shuffle=False, num_workers=0,
                                           device="cpu")))
    assert batch["a"].shape == (3, 3, 5)
    assert batch["a_lengths"].tolist() == [[1, 2], [3, 2], [2, 5]]
    np.testing.assert_array_equal(batch["a"][1, :3, :2].numpy(), same[1]["a"])
    mixed = write_dataset("lmdb", tmp_path / "mixed",
                          [{"a": np.ones(3, np.int64)}, {"a": np.ones((2, 2), np.int64)}], schema)
    with pytest.raises(ConfigError, match="ranks \\[1, 2\\].*ragged='list'"):
        next(iter(feedpipe.make_loader(mixed, 2, fields=["a"], shuffle=False, num_workers=0,
                                       device="cpu")))
    listed = next(iter(feedpipe.make_loader(mixed, 2, fields=["a"], shuffle=False, num_workers=0,
                                            device="cpu", output=Output(ragged="list"))))
    assert [t.shape for t in listed["a"]] == [(3,), (2, 2)]


def test_loader_warns_when_meta_meets_moved_pixels(tmp_path: Path) -> None:
    manifest, _ = write_manifest(tmp_path)
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="bbox"):  # conversion's own warning
        convert(manifest, out, to="lmdb", workers=0, columns=LabelColumns(keypoints="landmarks"))

    def warned(**kw: object) -> list[str]:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            feedpipe.make_loader(out, 2, shuffle=False, num_workers=0, device="cpu", **kw)
        return [str(w.message) for w in got if "'meta'" in str(w.message)]

    msgs = warned(fields=["image", "meta"], size=32, crop="random_resized_crop", flip=True)
    assert len(msgs) == 1 and "docs/fields.md" in msgs[0] and str(out) in msgs[0]
    assert len(warned(fields=["image", "meta"], size=32, crop="resize")) == 1
    hw = tuple(feedpipe.open_dataset(out)[0]["image"].shape[:2])
    assert len(warned(fields=["image", "meta"], size=hw, crop="none", flip=True)) == 1
    assert not warned(fields=["image", "landmarks"], size=32, crop="random_resized_crop",
                      flip=True)  # meta not requested
    assert not warned(fields=["image", "meta"], size=hw, crop="none")  # nothing moves
    assert not warned(fields=["meta"], size=32, flip=True)  # no image to move
