"""Arrays without images packed as datasets (:func:`pack_arrays`, docs/arrays.md): a dict of
equal-length arrays or an iterable of sample dicts, each value keeping its dtype (object dtypes
refused: they would need pickle), packed by :func:`converters.convert` as a record source. NaN and
infinities are counted per field; ``series=True`` stores one time series once, in blocks of rows,
for :class:`feedpipe.dataset.windows.Windows`."""

from __future__ import annotations

import warnings
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from feedpipe.errors import BadInputError, ConfigError
from feedpipe.schema.fields import ArrayField, Field, JsonField

from .options import Format
from .pack import ConvertResult, convert
from .packer import Progress
from .records import Record, RecordSource

NUMERIC = "biufc"  # bool, ints, unsigned ints, floats, complex: what a tensor can hold
TEXT = "U"  # numpy str: stored as JSON text
RESERVED = ("image", "path")  # image fields and source paths have their own meaning
FIRST_ROWS = 10  # rows named per field in the missing-value report
BLOCK_BYTES = 1 << 20  # series blocks of about this many bytes

Arrays = Mapping[str, Any]


def pack_arrays(data: Arrays | Iterable[Mapping[str, Any]], out: str | Path, *, to: Format,
                series: bool = False, train_fraction: float | None = None,
                block_rows: int | None = None, strict: bool = False, overwrite: bool = False,
                val_fraction: float = 0.0, seed: int = 0,
                writer_options: dict[str, Any] | None = None, progress: Progress | None = None,
                source: str | Path | None = None, renamed: Mapping[str, str] | None = None,
                not_taken: Sequence[dict[str, str]] = ()) -> ConvertResult:
    """Pack ``data`` (a dict of equal-length arrays, or an iterable of sample dicts) into
    ``out`` as ``to`` ("lmdb", "hdf5" or "wds"), each value with its own dtype.

    An iterable's first sample fixes the fields, dtypes and shapes; a later sample that differs
    is skipped and named (``strict=True``: refused). ``val_fraction``: a seeded random
    ``out/train`` + ``out/val`` split of the samples. ``series=True``: the rows are one time
    series, stored once in blocks of ``block_rows`` rows (default: about 1 MiB each);
    ``train_fraction`` (series only): per-field mean/std over the first that fraction of the rows,
    for ``Windows(normalize=True)``. ``source``: the file the arrays came from (the output may
    not lie inside it; named in the manifest); ``renamed``: original column name → field name;
    ``not_taken``: input rows left out before packing (``{"path", "reason"}``: listed).
    """
    if series and val_fraction:
        raise ConfigError("val_fraction splits samples at random; a series is split by time when "
                          "it is read: Windows(split=...) (docs/arrays.md)", option="val_fraction")
    if train_fraction is not None and not series:
        raise ConfigError("train_fraction sets the rows a series' normalization statistics come "
                          "from: pass series=True too", option="train_fraction")
    if train_fraction is not None and not 0.0 < train_fraction <= 1.0:
        raise ConfigError(f"train_fraction={train_fraction}: use a fraction in (0, 1]",
                          option="train_fraction")
    if block_rows is not None and (not series or block_rows < 1):
        raise ConfigError(f"block_rows={block_rows}: a positive row count, with series=True",
                          option="block_rows")
    roots = (Path(source),) if source is not None else ()
    where = str(source) if source is not None else "arrays"
    info: dict[str, Any] = {"arrays": where}
    if renamed:
        info["renamed_columns"] = dict(renamed)
    if series:
        cols = columns(data, where) if isinstance(data, Mapping) else _stacked(data, where)
        src = _series(cols, roots, info, train_fraction, block_rows)
    elif isinstance(data, Mapping):
        src = _rows(columns(data, where), roots, info)
    else:
        src = _samples(data, roots, info, where)
    src = replace(src, not_taken=tuple(not_taken))
    result = convert(src, out, to=to, strict=strict, overwrite=overwrite,
                     val_fraction=val_fraction, seed=seed, writer_options=writer_options,
                     progress=progress)
    result.missing = info["missing"]
    result.image_codec = ""
    return result


# --- checks ---------------------------------------------------------------------------------------

def check_name(name: object, where: str) -> str:
    """A key as a field name: an identifier, not one of :data:`RESERVED`."""
    if not isinstance(name, str) or not (name.isascii() and name.isidentifier()):
        raise BadInputError(f"{where}: key {name!r} is not a field name (letters, digits and _, "
                            "not starting with a digit); rename it")
    if name in RESERVED:
        raise BadInputError(f"{where}: key {name!r} is reserved ({name} fields hold "
                            f"{'images' if name == 'image' else 'source paths'}); rename it")
    return name


def as_array(value: Any, what: str) -> np.ndarray:
    """``value`` as an ndarray of a storable dtype (numbers, bool or text), else BadInputError."""
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # numpy >= 1.24: a ragged nested list
        raise BadInputError(f"{what}: not one array ({exc}); give equal-length rows") from exc
    if arr.dtype.hasobject:
        raise BadInputError(f"{what}: object dtype (Python objects, mixed types or ragged "
                            "lists): storing it would need pickle; give a numeric array")
    if arr.dtype.kind not in NUMERIC + TEXT:
        raise BadInputError(f"{what}: dtype {arr.dtype} is not stored (numbers, bool or str "
                            "only); convert it, e.g. datetimes with .astype('int64')")
    return arr


def columns(data: Arrays, where: str = "arrays") -> dict[str, np.ndarray]:
    """A dict of arrays checked: names, dtypes, and one equal length (samples or rows)."""
    if not data:
        raise BadInputError(f"{where}: no arrays to pack")
    cols = {check_name(k, where): as_array(v, f"{where}: {k!r}") for k, v in data.items()}
    for k, a in cols.items():
        if a.ndim == 0:
            raise BadInputError(f"{where}: {k!r} is a single value; give one per sample (an "
                                "array of length N)")
        if a.dtype.kind == TEXT and a.ndim > 1:
            raise BadInputError(f"{where}: {k!r} is text of shape {a.shape}; text is stored one "
                                "string per sample")
    lengths = {k: len(a) for k, a in cols.items()}
    if len(set(lengths.values())) > 1:
        raise BadInputError(f"{where}: arrays of different lengths {lengths}; each holds one "
                            "entry per sample, so all must be equally long")
    return cols


def _field(name: str, arr: np.ndarray, block: bool = False) -> Field:
    """The field of ``arr``'s entries (or of blocks of them): an array, or JSON text."""
    if arr.dtype.kind == TEXT:
        return JsonField(name)
    return ArrayField(name, dtype=arr.dtype.str, shape=((None,) if block else ()) + arr.shape[1:])


# --- missing values ---------------------------------------------------------------------------------

def missing_report(cols: Mapping[str, np.ndarray], report: dict[str, Any] | None = None,
                   first_row: int = 0) -> dict[str, Any]:
    """NaN and infinities per field of the rows ``cols`` (row ``first_row`` first), added to
    ``report``: values (``infinite`` of them, when any), rows, and the first rows holding one
    (fields without: absent)."""
    out: dict[str, Any] = {} if report is None else report
    for k, a in cols.items():
        if a.dtype.kind not in "fc" or not len(a):
            continue
        gaps = ~np.isfinite(a)
        rows = gaps.reshape(len(a), -1).any(axis=1)
        if rows.any():
            entry = out.setdefault(k, {"values": 0, "rows": 0, "first_rows": []})
            entry["values"] += int(gaps.sum())
            entry["rows"] += int(rows.sum())
            entry["first_rows"] += (np.flatnonzero(rows)[:FIRST_ROWS - len(entry["first_rows"])]
                                    + first_row).tolist()
            if inf := int(np.isinf(a).sum()):
                entry["infinite"] = entry.get("infinite", 0) + inf
    return out


# --- sources ----------------------------------------------------------------------------------------

def _rows(cols: dict[str, np.ndarray], roots: tuple[Path, ...], info: dict[str, Any]
          ) -> RecordSource:
    """Sample ``k`` = entry ``k`` of every array."""
    n = len(next(iter(cols.values())))
    fields = tuple(_field(k, a) for k, a in cols.items())
    info["missing"] = missing_report(cols)
    text = {k for k, a in cols.items() if a.dtype.kind == TEXT}

    def records() -> Iterator[Record]:
        for k in range(n):
            yield Record(f"sample {k}", values={c: str(a[k]) if c in text else a[k]
                                                for c, a in cols.items()})

    return RecordSource(roots, "arrays", fields, (), False, n, records, conversion=info,
                        images=False)


def _samples(data: Iterable[Mapping[str, Any]], roots: tuple[Path, ...], info: dict[str, Any],
             where: str) -> RecordSource:
    """An iterable of sample dicts, read once; its first sample fixes the fields."""
    it = iter(data)
    try:
        first = next(it)
    except StopIteration:
        raise BadInputError(f"{where}: wrote 0 samples: the source holds no samples") from None
    if not isinstance(first, Mapping) or not first:
        raise BadInputError(f"{where}: sample 0 is {type(first).__name__}, not a dict of values")
    head = {check_name(k, where): as_array(v, f"{where}: sample 0 {k!r}")
            for k, v in first.items()}
    for k, a in head.items():
        if a.dtype.kind == TEXT and a.ndim:
            raise BadInputError(f"{where}: sample 0 {k!r} is text of shape {a.shape}; text is "
                                "stored one string per sample")
    fields = tuple(_field(k, a[None]) for k, a in head.items())
    count = len(data) if hasattr(data, "__len__") else 0  # type: ignore[arg-type]
    info["missing"] = {}

    def records() -> Iterator[Record]:
        k = -1
        for k, sample in enumerate(chain([first], it)):
            values, why = _sample(sample, head, k)
            if why is None:
                missing_report({n: v[None] for n, v in values.items()
                                if isinstance(v, np.ndarray)}, info["missing"], k)
            yield Record(f"sample {k}", values=values, problem=why)
        info["inputs"] = k + 1

    return RecordSource(roots, "arrays", fields, (), False, count, records, conversion=info,
                        images=False)


def _sample(sample: Any, head: Mapping[str, np.ndarray], k: int
            ) -> tuple[dict[str, Any], str | None]:
    """One sample's values checked against the first's keys and dtypes; (values, problem)."""
    if not isinstance(sample, Mapping):
        return {}, f"a {type(sample).__name__}, not a dict of values"
    if set(sample) != set(head):
        return {}, (f"keys {sorted(map(str, sample))}, the first sample's are {sorted(head)}")
    values: dict[str, Any] = {}
    for name, ref in head.items():
        try:
            arr = as_array(sample[name], name)
        except BadInputError as exc:
            return {}, str(exc)
        if arr.dtype != ref.dtype:
            return {}, f"{name!r} is {arr.dtype}, the first sample's is {ref.dtype}"
        values[name] = str(arr) if ref.dtype.kind == TEXT else arr
    return values, None


def _stacked(data: Iterable[Mapping[str, Any]], where: str) -> dict[str, np.ndarray]:
    """An iterable of rows as a dict of columns (a series is read whole anyway)."""
    rows = list(data)
    if not rows:
        raise BadInputError(f"{where}: wrote 0 samples: the source holds no rows")
    keys = list(rows[0]) if isinstance(rows[0], Mapping) else None
    for k, r in enumerate(rows):
        if not isinstance(r, Mapping) or list(r) != keys:
            raise BadInputError(f"{where}: row {k} has keys {list(r) if isinstance(r, Mapping) else r!r}"
                                f", row 0 has {keys}; a series needs every column in every row")
    return columns({key: np.stack([as_array(r[key], f"{where}: row {k} {key!r}")
                                   for k, r in enumerate(rows)]) for key in keys or ()}, where)


def _series(cols: dict[str, np.ndarray], roots: tuple[Path, ...], info: dict[str, Any],
            train_fraction: float | None, block_rows: int | None) -> RecordSource:
    """One time series stored once: sample ``b`` = rows ``b*B .. (b+1)*B-1`` of every column."""
    n = len(next(iter(cols.values())))
    if n == 0:
        raise BadInputError(f"{info['arrays']}: wrote 0 samples: the series has no rows")
    row_bytes = sum(a[:1].nbytes for a in cols.values())
    rows = block_rows or int(np.clip(BLOCK_BYTES // max(1, row_bytes), 64, 1 << 16))
    rows = min(rows, n)
    info["missing"] = missing_report(cols)
    series: dict[str, Any] = {"rows": n, "block_rows": rows,
                              "columns": {k: [a.dtype.str, list(a.shape[1:])]
                                          for k, a in cols.items()}}
    if train_fraction is not None:
        k = round(n * train_fraction)
        if k < 1:
            raise ConfigError(f"train_fraction={train_fraction} of {n} rows leaves no training "
                              "rows to compute statistics from", option="train_fraction")
        series.update(train_fraction=train_fraction, train_rows=k,
                      stats={c: _stats(a[:k]) for c, a in cols.items()
                             if a.dtype.kind in "biuf"})
    info["series"] = series
    info["inputs"] = n  # rows, not blocks
    fields = tuple(_field(k, a, block=True) for k, a in cols.items())
    text = {k for k, a in cols.items() if a.dtype.kind == TEXT}

    def records() -> Iterator[Record]:
        for b in range(0, n, rows):
            e = min(n, b + rows)
            yield Record(f"rows {b}..{e - 1}", values={c: a[b:e].tolist() if c in text
                                                       else a[b:e] for c, a in cols.items()})

    return RecordSource(roots, "series", fields, (), False, -(-n // rows), records,
                        conversion=info, images=False)


def _stats(train: np.ndarray) -> dict[str, Any]:
    """Per-element mean and std (float64, NaN and infinities ignored, as gaps; flat, C order)
    over the training rows; an element with no finite value there is None
    (``Windows(normalize=True)`` refuses it by name)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN element: None below
        x = train.astype(np.float64)
        x[~np.isfinite(x)] = np.nan
        mean, std = np.nanmean(x, axis=0), np.nanstd(x, axis=0)

    def listed(a: np.ndarray) -> Any:
        return [None if np.isnan(v) else float(v) for v in a.flat] if a.ndim else \
            (None if np.isnan(a) else float(a))

    return {"mean": listed(mean), "std": listed(std)}
