"""The writing half of every conversion, whatever the source: write each split's :class:`Sample`
objects in order, name the skipped ones, refuse an empty result, write the manifests and commit,
or remove the partial output on any failure."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from feedpipe.dataset.formats.base import sample_key
from feedpipe.dataset.manifest import Manifest
from feedpipe.dataset.registry import WRITERS, DatasetWriter
from feedpipe.errors import BadInputError, ConfigError

from .output import abandon, empty_result, is_remote, open_output
from .result import ConvertResult, Stored
from .sources import Source

Progress = Callable[[int, int], None]


@dataclass
class Sample:
    """One input's outcome: its values to write into ``split``, or None and the reason it is
    skipped. ``name`` is listed in the skip list, ``shown`` names it in a strict error, and
    ``stored`` (how its image was stored) is counted once it is written."""

    name: str
    split: str
    values: dict[str, Any] | None
    why: str = ""
    shown: str = ""
    stored: Stored | None = None


@dataclass
class PackTarget:
    """Where and how a conversion writes: the output, the format and the run's policies."""

    out: str | Path
    to: str
    overwrite: bool = False
    storage_options: Mapping[str, Any] | None = None
    writer_options: dict[str, Any] | None = None
    strict: bool = False
    progress: Progress | None = None
    key0: int | None = None  # a WebDataset part's first key (keys stay unique once merged)
    # a value its field cannot hold skips the sample, named (records carry values as given);
    # False: it raises (image files: the values are the converter's own)
    skip_bad_values: bool = False
    t0: float = field(default_factory=time.perf_counter)  # when the conversion started

    def __post_init__(self) -> None:
        if self.to not in WRITERS:
            raise ConfigError(f"to={self.to!r}: use one of {sorted(WRITERS)}", option="to")
        if not is_remote(self.out):
            self.out = Path(self.out)


def split_indices(n: int, val_fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of validation items: a seeded permutation, deterministic for (n, seed)."""
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n)[:round(n * val_fraction)]] = True
    return mask


#: (what to write for each split, the schema) once every sample is written: the manifest's
#: ``conversion`` (without ``split``) and the schema, settled from what was written
Finish = Callable[[dict[str, list[dict[str, str]]]], tuple[dict[str, Any], Any]]


def write_samples(target: PackTarget, result: ConvertResult, *, claim: Source | None,
                  split_names: Iterable[str], schema: Any, classes: tuple[str, ...],
                  samples: Iterable[Sample], total: int, finish: Finish, where: str,
                  why_empty: Callable[[list[dict[str, str]]], str]) -> ConvertResult:
    """Write ``samples`` into one writer per split (``""``: the output itself) and commit.
    ``claim``: the source the output must stay out of (None: none); ``where`` and ``why_empty``
    (from the skip list) say why nothing was written, if so."""
    output = open_output(target.out, target.overwrite, target.storage_options)
    tmp = output.claim(claim)
    names = list(split_names)
    splits = {n: (tmp / n if n else tmp) for n in names}
    writers: dict[str, DatasetWriter] = {}
    skipped: dict[str, list[dict[str, str]]] = {n: [] for n in names}
    try:
        writers = {n: WRITERS[target.to](p, schema, **(target.writer_options or {}))
                   for n, p in splits.items()}
        for k, s in enumerate(samples):
            why = s.why if s.values is None else _write(target, writers[s.split], s.values)
            if why is not None:
                if target.strict:
                    raise BadInputError(f"{s.shown or s.name}: {why}")
                skipped[s.split].append({"path": s.name, "reason": why})
            else:
                if s.stored is not None:
                    result.tally(s.stored, s.name)
                output.after_write(splits[s.split], writers[s.split])
            if target.progress is not None:
                target.progress(k + 1, total)
        gone = [s for n in names for s in skipped[n]]
        empty = empty_result(where, {n: w.count for n, w in writers.items()}, gone, why_empty)
        if empty is not None:
            raise empty
        conversion, schema = finish(skipped)
        for name, writer in writers.items():
            files, extra = writer.close()
            root = splits[name]
            entries = tuple(output.entry(root, f) for f in files)
            Manifest(target.to, writer.count, schema, classes, entries,
                     {**conversion, "split": name or None}, tuple(skipped[name]), extra
                     ).write(root)
            result.splits[name or "all"] = writer.count
            result.written += writer.count
            result.bytes_out += sum(e.size for e in entries)
        result.skipped = gone
    except BaseException as exc:
        abandon(exc, writers.values(), output, Path(target.out), tmp)
    output.commit()
    result.seconds = time.perf_counter() - target.t0
    return result


def _write(target: PackTarget, writer: DatasetWriter, values: dict[str, Any]) -> str | None:
    """Append one sample; the reason it cannot be stored (a value its field cannot hold), or
    None."""
    try:
        if target.key0 is not None and target.to == "wds":
            writer.write(values, key=sample_key(target.key0 + writer.count))  # type: ignore
        else:
            writer.write(values)
    except (TypeError, ValueError) as exc:
        if not target.skip_bad_values:
            raise
        return f"cannot store: {exc}"
    return None
