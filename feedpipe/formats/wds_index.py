"""DALI index files for WebDataset shards, and the way back from a DALI sample to our index.

DALI's ``readers.webdataset`` needs one index per shard (the ``wds2idx`` text format, version
1.2: a ``v1.2 <samples>`` line, then per sample ``<ext> <data offset> <size> <member name>`` for
each member). feedpipe already records every member's offset and size (``index-offsets.npy``), so
the files are written from that without scanning the tars, on first use, next to the shards
(``shard-000000.idx``), each atomically (temporary file, then rename). A read-only dataset gets
them in a per-user cache directory instead.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import CorruptRecordError
from .wds import INDEX_FILES, WdsReader

VERSION = "v1.2"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "feedpipe" / "dali-index"


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
        fields = list(self.reader.schema)
        for i in self.ranges[shard]:
            key = self.keys[i].decode()
            spans = self.offsets[i].tolist()
            lines.append(" ".join(f"{f.wds_suffix} {off} {size} {key}.{f.wds_suffix}"
                                  for f, (off, size) in zip(fields, spans)))
        return "\n".join(lines) + "\n"

    def paths(self) -> list[Path]:
        """One index file per shard, in shard order: next to the shards when that directory is
        writable, else in ``$XDG_CACHE_HOME/feedpipe/dali-index``; written when missing or
        older than its shard."""
        out = []
        for s, name in enumerate(self.reader.shards):
            tar = self.reader.root / name
            idx = tar.with_suffix(".idx")
            if not self._fresh(idx, tar, s):
                try:
                    self._write(idx, s)
                except OSError:  # a read-only dataset: cache per user, keyed by the shard's path
                    tag = hashlib.sha1(str(tar.resolve()).encode()).hexdigest()[:16]
                    idx = _cache_dir() / f"{tag}-{idx.name}"
                    if not self._fresh(idx, tar, s):
                        idx.parent.mkdir(parents=True, exist_ok=True)
                        self._write(idx, s)
            out.append(idx)
        return out

    def _fresh(self, idx: Path, tar: Path, shard: int) -> bool:
        """An existing index of this shard's sample count, no older than the shard."""
        try:
            if idx.stat().st_mtime < tar.stat().st_mtime:
                return False
            with open(idx, encoding="ascii") as fh:
                return fh.readline().split() == [VERSION, str(len(self.ranges[shard]))]
        except (OSError, UnicodeDecodeError):
            return False

    def _write(self, idx: Path, shard: int) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{idx.name}.", dir=idx.parent)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(self.text(shard))
            os.chmod(tmp, 0o644)  # mkstemp makes it private; the shards are shared
            os.replace(tmp, idx)
        except BaseException:
            os.unlink(tmp)
            raise

    def locate(self, source_info: str, field: int = 0) -> int:
        """Our sample index of a DALI sample, from its ``source_info``
        (``<shard path>:<data offset>:<member name>``) and the member's schema position."""
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
