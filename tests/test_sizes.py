"""Byte sizes: one convention (MB = 10^6, MiB = 2^20) and one parser for every size option, in
Python and on the command line."""

from __future__ import annotations

import pytest

from feedpipe.cli import build_parser
from feedpipe.dataset.formats.wds import WdsWriter
from feedpipe.errors import ConfigError
from feedpipe.loader.config import Remote
from feedpipe.storage.cache import Cache
from feedpipe.storage.sizes import parse_size


@pytest.mark.parametrize("text, n", [
    ("256MB", 256 * 10**6), ("256mb", 256 * 10**6), ("256M", 256 * 10**6),
    ("256MiB", 256 * 2**20), ("256 mib", 256 * 2**20), ("2G", 2 * 10**9), ("2GB", 2 * 10**9),
    ("1.5GiB", 3 * 2**29), ("200GB", 200 * 10**9), ("1TiB", 2**40), ("4k", 4000),
    ("4KiB", 4096), ("4096", 4096), ("4096B", 4096), (4096, 4096),
])
def test_si_and_iec_units(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["lots", "-1GB", "0", "0.5", "12 parsecs", "", 0, -3, True, 1.5])
def test_what_is_not_a_size_is_refused_by_option(bad):
    with pytest.raises(ConfigError, match=r"^shard_size=.*KiB, MiB") as exc:
        parse_size(bad, "shard_size")
    assert exc.value.option == "shard_size"
    with pytest.raises(ConfigError, match="is not a size"):
        parse_size(bad)


def test_every_size_option_reads_sizes_alike(tmp_path):
    p = build_parser()
    src, out = str(tmp_path), str(tmp_path / "o")
    convert = ["convert", src, "--to", "wds", "-o", out]
    assert p.parse_args([*convert, "--shard-size", "256MB"]).shard_size \
        == 256 * 10**6  # was 2^28: 256MB meant MiB on the command line only
    assert p.parse_args([*convert, "--max-member-size", "1MB"]).max_member_size == 10**6
    assert p.parse_args(["index", src, "--max-member-size", "1MiB"]).max_member_size == 2**20
    assert p.parse_args(["tune", src, "--batch-size", "4", "--budget-ram", "2GB"]
                        ).budget_ram == 2 * 10**9
    assert p.parse_args(["bench", src, "--cache-limit", "1.5GiB"]).cache_limit == 3 * 2**29
    assert p.parse_args(["bench", src, "--cache-limit", "4096"]).cache_limit == 4096
    # the Python options read the same text the same way
    assert Cache(tmp_path / "c", limit="256MB").limit == 256 * 10**6
    Remote("s3://b/d", cache_limit="256MB")
    with pytest.raises(ConfigError, match="cache_limit='256 parsecs'") as exc:
        Remote("s3://b/d", cache_limit="256 parsecs")
    assert exc.value.option == "cache_limit"
    # the defaults keep their bytes: 256 MiB shards and members, as the writer's own default
    defaults = p.parse_args(convert)
    assert defaults.shard_size is None  # unset (so --to lmdb can refuse a given one): the
    assert WdsWriter.__init__.__kwdefaults__["shard_size"] == 2**28  # writer's own default
    assert p.parse_args(["index", src]).max_member_size == 2**28
