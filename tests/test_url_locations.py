"""URL-looking locations that feedpipe cannot serve fail loudly: never a local folder named 's3:'."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fp_helpers import cli_main

from converters import convert
from feedpipe.dataset.manifest import Manifest
from feedpipe.dataset.verify import verify
from feedpipe.errors import ConfigError
from feedpipe.paths import url_scheme

UNSUPPORTED = "nosuch://bucket/ds/"  # a scheme no storage backend serves


@pytest.mark.parametrize(("text", "scheme"), [
    ("s3://bucket/ds/", "s3"), ("GS://b/k", "gs"), ("hf://datasets/o/n", "hf"),
    ("https://h/x", "https"), (Path("s3://bucket/ds"), "s3"), ("s3:/bucket/ds", "s3"),
    ("data/s3:/x", None), ("./ds", None), ("/abs/ds", None), ("C:/ds", None), ("ds", None),
])
def test_url_scheme(text, scheme):
    assert url_scheme(text) == scheme


@pytest.mark.parametrize("out", [UNSUPPORTED, Path("s3://bucket/ds/")])
def test_convert_api_refuses_url_output(tmp_path, photo_dir, out, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="URL"):
        convert(photo_dir, out, to="wds", workers=0)
    assert os.listdir(tmp_path) == []  # no local folder named 'nosuch:' or 's3:'


def test_convert_api_refuses_url_source(tmp_path):
    with pytest.raises(ConfigError, match="the source is a nosuch:// URL"):
        convert(UNSUPPORTED, tmp_path / "out", to="wds", workers=0)
    assert not (tmp_path / "out").exists()


def test_readers_refuse_a_path_made_from_a_url():
    for call in (Manifest.read, verify):
        with pytest.raises(ConfigError, match="pathlib.Path drops one of its slashes"):
            call(Path("s3://bucket/ds"))


@pytest.mark.parametrize("command", ["convert", "info", "verify", "bench", "doctor"])
def test_cli_refuses_unsupported_urls(tmp_path, photo_dir, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    args = ([command, str(photo_dir), "--to", "wds", "-o", UNSUPPORTED, "-q"]
            if command == "convert" else [command, UNSUPPORTED])
    rc, out, err = cli_main(capsys, *args)
    assert rc == 2, (out, err)
    assert "nosuch://" in err and "URL" in err
    assert os.listdir(tmp_path) == []
