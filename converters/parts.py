"""Conversion split into parts (``feedpipe convert --part i/N``): part ``i`` of ``N`` packs the
contiguous slice ``[i*n//N, (i+1)*n//N)`` of the sorted source, so every machine computes the same
slice; ``auto/N`` takes ``i`` from Slurm's or Kubernetes' index variable."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.errors import ConfigError
from feedpipe.storage.store import is_remote, open_store

from .options import PackOptions
from .sources import Source

PARTS_DIR = "parts"
#: environment variables holding a task's index, in the order they are looked up
INDEX_VARS = ("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX")


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` (0-based)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 1
                and isinstance(self.index, int) and 0 <= self.index < self.count):
            raise ConfigError(f"part {self.index}/{self.count}: use i/N with N >= 1 and "
                              "0 <= i < N (parts are numbered from 0)")

    @property
    def name(self) -> str:
        """The part's directory name inside ``OUT/parts/``; sorts in part order."""
        return f"part-{self.index:05d}-of-{self.count:05d}"

    def bounds(self, n: int) -> tuple[int, int]:
        """The slice ``[start, stop)`` of an ``n``-item source list this part packs."""
        return self.index * n // self.count, (self.index + 1) * n // self.count


def parse_part(text: str, env: Mapping[str, str] | None = None) -> Part:
    """``"3/8"`` → Part(3, 8); ``"auto/8"`` reads the index from Slurm's or Kubernetes' variable."""
    env = os.environ if env is None else env
    m = re.fullmatch(r"\s*(auto|-?\d+)\s*/\s*(\d+)\s*", text)
    if not m:
        raise ConfigError(f"--part {text}: use i/N (e.g. 0/4) or auto/N")
    i = m[1]
    if i == "auto":
        found = [(v, env[v]) for v in INDEX_VARS if env.get(v, "").strip()]
        if not found:
            raise ConfigError(f"--part {text}: neither {' nor '.join('$' + v for v in INDEX_VARS)}"
                              " is set; run it as a Slurm array task or a Kubernetes indexed "
                              "Job, or give the index (--part 0/4)")
        var, i = found[0]
        text = f"{text} (${var}={i})"
    try:
        return Part(int(i), int(m[2]))
    except ValueError:
        raise ConfigError(f"--part {text}: the index must be an integer") from None
    except ConfigError as exc:
        raise ConfigError(f"--part {text}: {exc}") from None


def fingerprint(source: Source, to: str, options: Mapping[str, Any]) -> str:
    """SHA-256 of what every part must share: the sorted source list, classes, format, options."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": to, "classes": list(source.classes), "kind": source.kind,
                         "options": options}, sort_keys=True, default=str).encode())
    for it in source.items:
        h.update(json.dumps([it.rel, it.label, it.extra], sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def plan_part(part: Part, source: Source, out: str | Path, to: str, opts: PackOptions,
              val_fraction: float, storage_options: Mapping[str, Any] | None = None,
              ) -> tuple[str | Path, int, int, dict[str, Any]]:
    """Check a part conversion: its directory, slice and the manifest's ``part`` entry (what
    :func:`converters.merge.merge` checks). Never into a merged dataset: replacing a part's files
    would break its manifest."""
    options = {f.name: getattr(opts, f.name) for f in fields(opts) if f.name != "targets"}
    options["targets"] = [[t.name, t.spec, t.params] for t in opts.targets]

    if val_fraction:
        raise ConfigError("--part with --val-fraction: split the merged dataset instead, or "
                          "convert train and val as separate sources")
    if source.masked and options.get("num_classes") is None:
        raise ConfigError("--part with --masks needs --num-classes: each part would otherwise "
                          "record only the classes its own masks hold")
    n = len(source.items)
    if n < part.count:
        raise ConfigError(f"--part {part.index}/{part.count}: the source has {n} items, fewer "
                          "than the parts; use fewer parts")
    if is_remote(out) and to != "wds":
        raise ConfigError(f"--part into object storage ({out}): only --to wds parts can be "
                          "merged there (LMDB and HDF5 merge into several files a remote reader "
                          "cannot open together); use --to wds for remote data, or convert the "
                          "parts to a local folder")
    if not is_remote(out) and Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"{out} is a file, not a folder: parts are converted into a folder's "
                          "parts/ (give -o a new or existing folder)")
    try:
        open_store(out, storage_options).size(MANIFEST_NAME)
    except FileNotFoundError:  # no manifest there: not a merged dataset
        pass
    else:
        raise ConfigError(f"{out} is already a merged dataset; convert parts into a new output")
    start, stop = part.bounds(n)
    info = {"index": part.index, "count": part.count, "start": start, "stop": stop,
            "source_items": n, "fingerprint": fingerprint(source, to, options)}
    where = f"{str(out).rstrip('/')}/{PARTS_DIR}/{part.name}" if is_remote(out) else \
        Path(out) / PARTS_DIR / part.name
    return where, start, stop, info
