"""One packer for every source: record sources (foreign WebDataset shards,
Hugging Face datasets, arrays) go through :func:`converters.convert` like image folders, so a URL
output, ``--storage-option`` and ``--part`` mean the same for them, or are refused by name."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import cli_main
from PIL import Image

pytest.importorskip("s3fs")
from servers import cli_opts, objects  # noqa: E402

from converters import convert  # noqa: E402
from converters.foreign_wds import source as shard_source  # noqa: E402
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest  # noqa: E402


def _shards(root: Path, n: int = 6) -> Path:
    """One foreign WebDataset shard of ``n`` small JPEG samples with a class."""
    root.mkdir()
    with tarfile.open(root / "train-000.tar", "w") as tf:
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(np.full((16, 20, 3), 20 * i, np.uint8)).save(buf, "JPEG")
            for ext, data in (("jpg", buf.getvalue()), ("cls", str(i % 2).encode())):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return root


def test_shards_to_a_url_upload_and_leave_no_local_folder(tmp_path, s3, capsys, monkeypatch):
    """``feedpipe convert SHARDS -o s3://...`` with ``--storage-option``: uploaded and committed
    like an image folder's conversion; before, the records packer took the URL for a path and
    made a local folder named ``s3:``, and the storage options went unused."""
    bucket, opts, fs = s3
    src = _shards(tmp_path / "shards")
    monkeypatch.chdir(tmp_path)
    url = f"{bucket}/ds"
    rc, out, err = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", url, *cli_opts(opts))
    assert rc == 0, err
    assert not (tmp_path / "s3:").exists()
    local = tmp_path / "local"
    convert(shard_source([str(src)]), local, to="lmdb")
    held = objects(fs, url)
    m = Manifest.read(local)
    assert set(held) == {MANIFEST_NAME, *(f.name for f in m.files)}
    for f in m.files:  # the same bytes as the local conversion
        assert held[f.name] == (local / f.name).read_bytes(), f.name


def test_part_of_shards_is_refused_by_name(tmp_path, capsys):
    """``--part`` splits the sorted list of a folder's or manifest's images; for shards it was
    silently ignored (the whole source written as if it were the part). Now a ConfigError."""
    src = _shards(tmp_path / "shards")
    rc, out, err = cli_main(capsys, "convert", src, "--to", "wds", "-o", tmp_path / "o",
                            "--part", "0/2")
    assert rc != 0 and "--part" in err, (rc, out, err)
    assert not os.path.exists(tmp_path / "o")


def test_convert_takes_a_record_source(tmp_path):
    """The one entry point: ``convert`` packs a record source with the same keywords as a
    folder; keywords that only mean something for image files are refused by name."""
    src = _shards(tmp_path / "shards")
    res = convert(shard_source([str(src)]), tmp_path / "o", to="hdf5", val_fraction=0.5, seed=1)
    assert res.written == 6 and set(res.splits) == {"train", "val"}
    with pytest.raises(Exception, match="masks"):
        convert(shard_source([str(src)]), tmp_path / "p", to="lmdb", masks=tmp_path)
    assert not (tmp_path / "p").exists()
