"""Contract tests for a conversion split into parts and merged (every format): the merged
dataset is the single conversion's samples, keys, labels and bytes; verify passes; a missing,
repeated or foreign part is refused by name; an interrupted merge never reads as a dataset."""

from __future__ import annotations

import shutil
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

import feedpipe
from converters import convert
from converters.merge import merge
from converters.parts import Part, parse_part
from feedpipe.dataset.verify import verify
from feedpipe.errors import BadInputError, ConfigError, CorruptRecordError


def _parts(src: Path, out: Path, fmt: str, n: int = 3, only=None, **kw) -> None:
    opts = {"shard_count": 10} if fmt == "wds" else None
    for i in only if only is not None else range(n):
        convert(src, out, to=fmt, workers=0, writer_options=opts, part=Part(i, n), **kw)


def _same(a, b) -> None:
    assert len(a) == len(b) and a.classes == b.classes
    assert a.schema.to_json() == b.schema.to_json()
    assert [a.key_of(i) for i in range(len(a))] == [b.key_of(i) for i in range(len(b))]
    for i in range(0, len(a), 16):  # per-sample stored bytes, labels and paths
        idx = range(i, min(i + 16, len(a)))
        assert a.read_raw_batch(idx) == b.read_raw_batch(idx)


def test_merged_parts_equal_one_conversion(fmt, photo_dir, packed, tmp_path):
    out = tmp_path / "merged"
    _parts(photo_dir, out, fmt)
    assert sorted(p.name for p in (out / "parts").iterdir()) == \
        [f"part-0000{i}-of-00003" for i in range(3)]
    for i in range(3):  # each part is a complete, verifiable partial dataset
        assert verify(out / "parts" / Part(i, 3).name, decode=False).ok
    res = merge(out)
    assert res.parts == 3 and res.moved == 0 and res.num_samples == 72
    merged, single = feedpipe.open_dataset(out), feedpipe.open_dataset(packed[fmt])
    _same(merged, single)
    assert merged[71]["label"] == single[71]["label"] == 3
    report = verify(out)
    assert report.ok, report.problems
    assert report.records_checked == 72


def test_cli_parts_auto_and_glob_moved_in(fmt, photo_dir, packed, tmp_path):
    """`--part auto/N` under a Slurm-like index, parts written elsewhere, merged with a glob."""
    elsewhere = tmp_path / "scratch"
    for i in range(2):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path),
               "SLURM_ARRAY_TASK_ID": str(i)}
        subprocess.run([sys.executable, "-m", "feedpipe.cli", "convert", str(photo_dir), "--to",
                        fmt, "-o", str(elsewhere), "--part", "auto/2", "-q", "--workers", "0"],
                       check=True, env=env, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "feedpipe.cli", "merge", str(tmp_path / "ds"),
                           str(elsewhere / "parts" / "part-*")], check=True, capture_output=True,
                          text=True)
    assert "merged 2 parts (2 moved in)" in done.stdout
    assert not list((elsewhere / "parts").iterdir())  # moved, not copied
    _same(feedpipe.open_dataset(tmp_path / "ds"), feedpipe.open_dataset(packed[fmt]))


def test_missing_and_duplicate_parts_are_refused(fmt, photo_dir, tmp_path):
    out = tmp_path / "ds"
    _parts(photo_dir, out, fmt, only=[0, 2])
    with pytest.raises(BadInputError, match="1 of 3 parts missing: part-00001-of-00003"):
        merge(out)
    _parts(photo_dir, tmp_path / "other", fmt, only=[1, 2])
    with pytest.raises(BadInputError, match="part 2 of 3 given twice"):
        merge(out, [tmp_path / "other" / "parts" / "part-00001-of-00003",
                    tmp_path / "other" / "parts" / "part-00002-of-00003"])
    assert len(list((tmp_path / "other" / "parts").iterdir())) == 2  # nothing moved
    with pytest.raises(BadInputError):
        feedpipe.open_dataset(out)
    merge(out, [tmp_path / "other" / "parts" / "part-00001-of-00003"])
    assert len(feedpipe.open_dataset(out)) == 72


def test_parts_of_other_classes_or_schema_are_refused(fmt, photo_dir, tmp_path):
    renamed = tmp_path / "renamed"
    shutil.copytree(photo_dir, renamed)
    first = sorted(p.name for p in renamed.iterdir())[0]
    (renamed / first).rename(renamed / "zebra")
    _parts(photo_dir, tmp_path / "a", fmt, only=[0, 2])
    _parts(renamed, tmp_path / "b", fmt, only=[1])
    with pytest.raises(BadInputError, match=rf"class lists differ.*\['zebra'\].*\['{first}'\]"):
        merge(tmp_path / "a", [tmp_path / "b" / "parts" / "part-00001-of-00003"])
    _parts(photo_dir, tmp_path / "c", fmt, only=[1], store="raw", resize=32)
    with pytest.raises(BadInputError, match="schemas differ in field 'image'"):
        merge(tmp_path / "a", [tmp_path / "c" / "parts" / "part-00001-of-00003"])
    _parts(photo_dir, tmp_path / "d", fmt, only=[1], quality=50)  # same schema, other options
    with pytest.raises(BadInputError, match="different source lists or options"):
        merge(tmp_path / "a", [tmp_path / "d" / "parts" / "part-00001-of-00003"])


def test_interrupted_merge_is_incomplete_and_rerun_finishes(photo_dir, tmp_path):
    out = tmp_path / "ds"
    _parts(photo_dir, tmp_path / "w", "hdf5")
    (out / "parts").mkdir(parents=True)  # a merge killed after moving one part in
    shutil.move(tmp_path / "w" / "parts" / "part-00000-of-00003", out / "parts")
    with pytest.raises(BadInputError):
        feedpipe.open_dataset(out)
    res = merge(out, [str(tmp_path / "w" / "parts" / "part-*")])
    assert (res.parts, res.moved) == (3, 2) and verify(out).ok
    with pytest.raises(Exception, match="already a complete dataset"):
        merge(out)
    before = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
    with pytest.raises(ConfigError, match="already a merged dataset"):  # as for a URL
        convert(photo_dir, out, to="hdf5", workers=0, part=Part(1, 3), overwrite=True)
    assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == before


def test_hdf5_merge_reads_its_parts_files_and_a_missing_one_is_named(photo_dir, tmp_path):
    out = tmp_path / "ds"
    _parts(photo_dir, out, "hdf5", n=2)
    merge(out)
    assert not (out / "data.h5").exists()  # no file over the parts: the reader opens them
    (out / "parts" / "part-00001-of-00002" / "data.h5").unlink()
    with pytest.raises(CorruptRecordError, match="part-00001-of-00002/data.h5.*No such file"):
        feedpipe.open_dataset(out)[0]


def test_part_argument():
    assert parse_part("2/8", {}) == Part(2, 8)
    assert parse_part("auto/4", {"JOB_COMPLETION_INDEX": "3"}) == Part(3, 4)
    assert parse_part("auto/4", {"SLURM_ARRAY_TASK_ID": "1", "JOB_COMPLETION_INDEX": "3"}) \
        == Part(1, 4)
    with pytest.raises(ConfigError, match="SLURM_ARRAY_TASK_ID.*JOB_COMPLETION_INDEX"):
        parse_part("auto/4", {})
    for bad in ("4/4", "-1/4", "1", "a/4", "1/x", "auto/0"):
        with pytest.raises(ConfigError, match="--part"):
            parse_part(bad, {"SLURM_ARRAY_TASK_ID": "7"})
    slices = [Part(i, 7).bounds(100) for i in range(7)]
    assert slices[0][0] == 0 and slices[-1][1] == 100
    assert all(a[1] == b[0] for a, b in pairwise(slices))


def test_part_refuses_val_fraction(photo_dir, tmp_path):
    with pytest.raises(ConfigError, match="--val-fraction"):
        convert(photo_dir, tmp_path / "o", to="wds", workers=0, val_fraction=0.2,
                part=Part(0, 2))
    (tmp_path / "afile").write_text("not feedpipe's")
    with pytest.raises(ConfigError, match="afile is a file, not a folder"):
        convert(photo_dir, tmp_path / "afile", to="wds", workers=0, part=Part(0, 2))
    assert (tmp_path / "afile").read_text() == "not feedpipe's"


def test_loader_reads_a_merged_dataset_in_worker_processes(fmt, photo_dir, tmp_path):
    """make_loader over a merged dataset (several LMDB environments, an HDF5 VDS, one index
    over the parts' shards) with real DataLoader workers: every sample once, labels intact."""
    out = tmp_path / "ds"
    _parts(photo_dir, out, fmt, n=2)
    merge(out)
    loader = feedpipe.make_loader(out, 8, size=32, num_workers=2, device="cpu", shuffle=True,
                                  drop_last=False)
    labels = sorted(int(v) for batch in loader for v in batch["label"])
    single = feedpipe.open_dataset(out)
    assert labels == sorted(single[i]["label"] for i in range(len(single)))
    assert len(labels) == 72
