"""A CSV/JSONL manifest's label column is read one way for every row.
One ``unknown`` or ``1.5`` among integer labels used to switch the whole dataset to sorted
string classes (label 2 became 4, 10 became 2) without a word, and an empty label cell was stored
as -1 and counted nowhere. Now a mix, or an empty cell among labelled rows, is refused naming
the rows, unless ``labels=``/``--labels`` or ``unlabeled=``/``--unlabeled`` says how to read it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from fp_helpers import run_cli

import feedpipe
from converters import convert
from feedpipe.errors import BadInputError, ConfigError


def _manifest(tmp_path: Path, photos, labels: list, suffix: str = ".csv") -> Path:
    root = tmp_path / "data"
    root.mkdir(exist_ok=True)
    rows = []
    for k, lab in enumerate(labels):
        name = f"img{k:02d}.jpg"
        (root / name).write_bytes(photos[k].path.read_bytes())
        rows.append({"path": name, "label": lab})
    path = root / f"list{suffix}"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        if suffix == ".csv":
            w = csv.DictWriter(fh, ["path", "label"])
            w.writeheader()
            w.writerows(rows)
        else:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def _labels(out: Path) -> list[int]:
    return [int(s["label"]) for s in feedpipe.open_dataset(out)]


@pytest.mark.parametrize("stray", ["unknown", "1.5"])
def test_one_non_integer_label_is_refused_naming_its_row(tmp_path, photos, stray):
    src = _manifest(tmp_path, photos, [*range(12), stray])
    with pytest.raises(BadInputError, match=rf"1 row\(s\) break a label column of integers "
                       rf"\(12 integer, 1 other\): row 13 \(img12.jpg: '{stray}'\).*--labels names"):
        convert(src, tmp_path / "o", to="lmdb", workers=0)
    assert not (tmp_path / "o").exists()
    r = run_cli("convert", src, "--to", "lmdb", "-o", tmp_path / "o", "-q")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "row 13" in r.stderr, r.stderr


def test_names_keep_integer_classes_in_numeric_order(tmp_path, photos):
    src = _manifest(tmp_path, photos, [*range(12), "unknown"])
    r = run_cli("convert", src, "--to", "wds", "-o", tmp_path / "o", "-q", "--labels", "names")
    assert r.returncode == 0, r.stderr
    assert _labels(tmp_path / "o") == [*range(12), 12]  # 2 stays 2, 10 stays 10
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.classes == (*map(str, range(12)), "unknown")
    assert ds.manifest.conversion["labels"] == "names"


def test_many_rows_are_counted_and_the_first_named(tmp_path, photos):
    src = _manifest(tmp_path, photos, ["cat", "dog"] * 5 + [3, 4, 5, 6, 7, 8, 9], ".jsonl")
    with pytest.raises(BadInputError, match=r"7 row\(s\) break a label column of names "
                       r"\(7 integer, 10 other\): row 11 \(img10.jpg: 3\).* and 2 more"):
        convert(src, tmp_path / "o", to="lmdb", workers=0)


def test_ints_refuses_names_and_negative_indices(tmp_path, photos):
    src = _manifest(tmp_path, photos, ["cat", "dog", "cat"])
    with pytest.raises(BadInputError, match=r"3 row\(s\) have a label that is not an integer"):
        convert(src, tmp_path / "o", to="lmdb", workers=0, labels="ints")
    assert convert(src, tmp_path / "p", to="lmdb", workers=0).written == 3  # names: as before
    neg = _manifest(tmp_path, photos, [0, -3, 1], ".jsonl")
    with pytest.raises(BadInputError, match=r"negative class index: row 2 \(img01.jpg: -3\)"):
        convert(neg, tmp_path / "q", to="lmdb", workers=0)
    bad = _manifest(tmp_path, photos, [0, True, [1]], ".jsonl")
    with pytest.raises(BadInputError, match=r"2 row\(s\) have a label that is neither"):
        convert(bad, tmp_path / "r", to="lmdb", workers=0)


def test_integer_labels_read_as_before(tmp_path, photos):
    src = _manifest(tmp_path, photos, [2, 10, 0, 7])
    assert convert(src, tmp_path / "o", to="lmdb", workers=0, labels="ints").written == 4
    assert _labels(tmp_path / "o") == [2, 10, 0, 7]
    assert feedpipe.open_dataset(tmp_path / "o").classes == ()


def test_empty_label_is_refused_or_kept_and_counted(tmp_path, photos):
    src = _manifest(tmp_path, photos, [0, 1, "", 2, " "])
    with pytest.raises(BadInputError, match=r"2 row\(s\) have an empty label among 3 labelled "
                       r"rows: row 3 \(img02.jpg: ''\), row 5 \(img04.jpg: ' '\).*--unlabeled keep"):
        convert(src, tmp_path / "o", to="lmdb", workers=0)
    r = run_cli("convert", src, "--to", "hdf5", "-o", tmp_path / "o", "-q", "--unlabeled", "keep")
    assert r.returncode == 0, r.stderr
    assert "unlabeled: 2 rows stored with label -1" in r.stdout and "img02.jpg" in r.stdout
    assert _labels(tmp_path / "o") == [0, 1, -1, 2, -1]
    m = feedpipe.open_dataset(tmp_path / "o").manifest
    assert m.conversion["unlabeled"] == ["img02.jpg", "img04.jpg"]
    res = convert(src, tmp_path / "p", to="lmdb", workers=0, unlabeled="keep")
    assert res.unlabeled == ["img02.jpg", "img04.jpg"]


def test_a_column_with_no_labels_is_an_unlabeled_dataset(tmp_path, photos):
    src = _manifest(tmp_path, photos, ["", "", ""])
    ds = feedpipe.open_dataset(convert(src, tmp_path / "o", to="lmdb", workers=0).out)
    assert "label" not in ds.schema and ds.manifest.conversion["unlabeled"] == []


def test_label_options_are_for_manifests(tmp_path, photo_dir, photos):
    with pytest.raises(ConfigError, match="labels='names'.*imagefolder source"):
        convert(photo_dir, tmp_path / "o", to="lmdb", workers=0, labels="names")
    src = _manifest(tmp_path, photos, [0, 1])
    with pytest.raises(ConfigError, match="labels='number'"):
        convert(src, tmp_path / "o", to="lmdb", labels="number")  # type: ignore[arg-type]
