"""Bad manifest rows and bad label options speak in one line, never a
traceback. A malformed cell refuses its row (named by manifest line, listed in the summary and the
manifest) and the rest converts; ``--strict`` stops on it with exit 2 naming the row. Options
that cannot work (``--flip-indices 1,1``, ``--vocab aab``, ``--shard-size`` with lmdb) exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fp_helpers import cli_main

import feedpipe


def _manifest(tmp_path: Path, photos, column: str, cells: list[str]) -> Path:
    """A CSV manifest ``path,label,<column>`` over copies of the first photos."""
    root = tmp_path / "data"
    root.mkdir(exist_ok=True)
    lines = [f"path,label,{column}"]
    for k, cell in enumerate(cells):
        (root / f"img{k}.jpg").write_bytes(photos[k].path.read_bytes())
        lines.append(f"img{k}.jpg,{k % 2},\"{cell}\"")
    path = root / "list.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _one_line_error(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


ROWS = {  # flag, column, cells (the third row is bad), what the refusal says
    "text outside the vocab": (["--text-column", "t", "--vocab", "abc"], "t",
                               ["ab", "ca", "xyz", "b"], "outside the vocabulary"),
    "boxes of the wrong shape": (["--boxes-column", "b"], "b",
                                 ["[[1,2,9,9,0]]", "[]", "[[1,2,3]]", "[[0,0,5,5,1]]"],
                                 "x1, y1, x2, y2, label"),
    "keypoints of another K": (["--keypoints-column", "k"], "k",
                               ["[[1,2],[3,4]]", "[[1,2],[3,4]]", "[[1,2],[3,4],[5,6]]",
                                "[[5,6],[7,8]]"], "3 points, where the other rows have 2"),
    "a cell that is not JSON": (["--keypoints-column", "k"], "k",
                                ["[[1,2]]", "[[1,2]]", "[[1,2", "[[3,4]]"], "not JSON"),
}


@pytest.mark.parametrize("case", list(ROWS))
def test_a_bad_row_is_skipped_and_named_or_stops_strict(case, tmp_path, photos, capsys):
    flags, column, cells, said = ROWS[case]
    src = _manifest(tmp_path, photos, column, cells)
    rc, out, err = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "o", "-q",
                            "--workers", "0", *flags)
    assert rc == 0, err
    assert "img2.jpg: manifest line 4" in out and said in out, out
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert len(ds) == 3
    ignored = ds.manifest.conversion["ignored"]
    assert [i["path"] for i in ignored] == ["img2.jpg"] and said in ignored[0]["reason"]
    rc, _, err = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "s", "-q",
                          "--workers", "0", "--strict", *flags)
    assert "img2.jpg: manifest line 4" in _one_line_error(rc, err) and said in err
    assert not (tmp_path / "s").exists()


def test_a_malformed_jsonl_line_is_skipped_and_named(tmp_path, photos, capsys):
    root = tmp_path / "data"
    root.mkdir()
    for k in range(3):
        (root / f"img{k}.jpg").write_bytes(photos[k].path.read_bytes())
    (root / "list.jsonl").write_text(json.dumps({"path": "img0.jpg", "label": 0}) + "\n"
                                     + '{"path": "img1.jpg", "label": 1\n'
                                     + json.dumps({"path": "img2.jpg", "label": 1}) + "\n")
    rc, out, err = cli_main(capsys, "convert", root / "list.jsonl", "--to", "lmdb", "-o",
                            tmp_path / "o", "-q", "--workers", "0")
    assert rc == 0 and "list.jsonl:2: not a JSON line" in out, out + err
    assert len(feedpipe.open_dataset(tmp_path / "o")) == 2
    rc, _, err = cli_main(capsys, "convert", root / "list.jsonl", "--to", "lmdb", "-o",
                          tmp_path / "s", "-q", "--workers", "0", "--strict")
    assert "list.jsonl:2" in _one_line_error(rc, err)


@pytest.mark.parametrize("flags, said", [
    (["--keypoints-column", "k", "--flip-indices", "1,1"], "--flip-indices 1,1: not a self-inverse"),
    (["--keypoints-column", "k", "--flip-indices", "1,0,2"], "3 entries for 2 keypoints"),
    (["--text-column", "k", "--vocab", "abca"], "--vocab abca: the characters must be distinct"),
])
def test_label_options_that_cannot_work(flags, said, tmp_path, photos, capsys):
    src = _manifest(tmp_path, photos, "k", ["[[1,2],[3,4]]"] * 2)
    rc, _, err = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "o", "-q",
                          "--workers", "0", *flags)
    assert said in _one_line_error(rc, err)


def test_manifest_without_rows_or_path_column(tmp_path, photos, capsys):
    (tmp_path / "head.csv").write_text("path,label\n")
    rc, _, err = cli_main(capsys, "convert", tmp_path / "head.csv", "--to", "lmdb", "-o",
                          tmp_path / "o", "-q")
    assert "head.csv: the manifest has no rows (only a header)" in _one_line_error(rc, err)
    (tmp_path / "file.csv").write_text("file,label,b\na.jpg,0,[]\n")
    rc, _, err = cli_main(capsys, "convert", tmp_path / "file.csv", "--to", "lmdb", "-o",
                          tmp_path / "o", "-q", "--boxes-column", "b")
    assert "no 'path' column" in _one_line_error(rc, err)
    from converters import convert
    from feedpipe.errors import BadInputError

    with pytest.raises(BadInputError, match="file.csv: no 'path' column"):
        convert(tmp_path / "file.csv", tmp_path / "o", to="lmdb", workers=0)


def test_format_options_for_another_format_are_refused(tmp_path, photo_dir, capsys):
    for flags in (["--shard-size", "1MB"], ["--compression", "gzip"]):
        rc, _, err = cli_main(capsys, "convert", photo_dir, "--to", "lmdb", "-o", tmp_path / "o",
                              "-q", *flags)
        assert f"{flags[0]} (" in _one_line_error(rc, err) and "ignored" in err
    assert not (tmp_path / "o").exists()


def test_summary_counts_skipped_inputs(tmp_path, photos, capsys):
    src = _manifest(tmp_path, photos, "t", ["a", "b"])
    (src.parent / "img1.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    rc, out, err = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "o",
                            "--workers", "0", "-q")
    first = out.splitlines()[0]
    assert rc == 0 and first.startswith("wrote 1 of 2 inputs to ") and "1 skipped" in first, out
    assert "(all" not in first
