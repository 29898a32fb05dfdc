"""DALI index files for WebDataset shards, and the way back from a DALI sample to our index.

DALI's ``readers.webdataset`` needs one ``wds2idx`` index per shard (v1.2: a ``v1.2 <samples>``
line, then per sample ``<ext> <offset> <size> <member>`` per member), written atomically from
``index-offsets.npy`` on first use, next to the shards or, read-only, in :func:`cache_dir`.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from ...dataset.formats.wds import INDEX_FILES, WdsReader
from ...errors import CorruptRecordError
from ...paths import cache_dir, write_atomic

VERSION = "v1.2"
log = logging.getLogger("feedpipe.formats")


class DaliIndex:
    """The DALI index files of a WebDataset dataset, and sample lookup by (shard, offset)."""

    def __init__(self, reader: WdsReader) -> None:
        self.reader = reader
        root = reader.root
        self.offsets = np.load(root / INDEX_FILES[0], mmap_mode="r", allow_pickle=False)
        self.keys = np.load(root / INDEX_FILES[2], mmap_mode="r", allow_pickle=False)
        self.ranges = reader.shard_ranges()
        self._shard_no = {name: s for s, name in enumerate(reader.shards)}
        self._starts: dict[int, np.ndarray] = {}

    def text(self, shard: int) -> str:
        """The index file of one shard."""
        lines = [f"{VERSION} {len(self.ranges[shard])}"]
        fields = self.reader.tar_fields()  # not the fields kept in the index (version 3)
        for i in self.ranges[shard]:
            key = self.keys[i].decode()
            spans = self.offsets[i].tolist()
            lines.append(" ".join(f"{f.wds_suffix} {spans[c][0]} {spans[c][1]} {key}.{f.wds_suffix}"
                                  for c, f in fields))
        return "\n".join(lines) + "\n"

    def paths(self) -> list[Path]:
        """One index file per shard, in shard order (see the module docstring); written when
        missing, older than its shard or damaged."""
        out = []
        for s, name in enumerate(self.reader.shards):
            tar = self.reader.root / name
            idx = tar.with_suffix(".idx")
            if not self._fresh(idx, tar, s):
                text = self.text(s)
                try:
                    write_atomic(idx, text)
                except OSError:  # a read-only dataset: cache per user, keyed by the shard's path
                    tag = hashlib.sha1(str(tar.resolve()).encode()).hexdigest()[:16]
                    idx = cache_dir() / "dali-index" / f"{tag}-{idx.name}"
                    if not self._fresh(idx, tar, s):
                        idx.parent.mkdir(parents=True, exist_ok=True)
                        write_atomic(idx, text)
            out.append(idx)
        return out

    def _fresh(self, idx: Path, tar: Path, shard: int) -> bool:
        """An existing index no older than the shard, with its header and one line per sample;
        a damaged one is logged."""
        n = len(self.ranges[shard])
        if idx.is_symlink():  # never read through a link (it may lead outside); rewrite it
            log.warning("DALI index %s is a symlink; writing a regular file in its place", idx)
            return False
        try:
            if idx.stat().st_mtime < tar.stat().st_mtime:
                return False
            lines = idx.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return False
        except (OSError, UnicodeDecodeError) as exc:
            why = str(exc)
        else:
            if lines[:1] and lines[0].split() == [VERSION, str(n)] and len(lines) == n + 1:
                return True
            why = f"expected a {VERSION!r} header for {n} samples and {n} sample lines"
        log.warning("DALI index %s is damaged (%s); writing it again", idx, why)
        return False

    def locate(self, source_info: str, field: int = 0) -> int:
        """Our sample index of a DALI sample's ``source_info`` (``<shard>:<offset>:<member>``)."""
        try:
            path, offset, _ = source_info.rsplit(":", 2)
            shard = self._shard_no[Path(path).name]
            off = int(offset)
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"{self.reader.root}: DALI sample {source_info!r} is not "
                                     "from this dataset's shards") from exc
        starts = self._starts.get(shard)
        if starts is None:
            r = self.ranges[shard]
            starts = self._starts[shard] = np.asarray(self.offsets[r.start: r.stop, field, 0])
        pos = int(np.searchsorted(starts, off))
        if pos >= len(starts) or starts[pos] != off:
            raise CorruptRecordError(f"{self.reader.root}: no sample at {source_info!r}; the "
                                     "index files do not match the shards")
        return self.ranges[shard].start + pos
