"""Tables without images as array sources: ``.npy``, ``.npz``, ``.parquet``, and CSV/JSONL files
whose rows have no ``path`` column (those with one are image manifests,
:mod:`converters.sources`).

:func:`read_table` returns a dict of equal-length columns for :func:`converters.arrays.pack_arrays`
(each row a sample, or a time step with ``series=True``). Numeric columns keep their dtype:
``.npy``/``.npz``/Parquet as stored; CSV and JSON numbers as int64, or float64 where a value is
fractional or missing (empty, ``NA``, ``NaN``, ``null``: NaN). Text columns are taken only when
``columns`` names them (a misnamed image manifest must not become a table of file names). A CSV
or JSONL row that cannot be read is skipped and named (``strict``: refused).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from feedpipe.errors import BadInputError, ConfigError, MissingDependencyError

from .arrays import RESERVED, as_array

TABLE_SUFFIXES = (".npy", ".npz", ".parquet", ".pq")
ROW_SUFFIXES = (".csv", ".jsonl", ".ndjson")
NA = frozenset({"", "NA", "N/A", "NaN", "nan", "null", "None"})
_IMAGE_NAME = re.compile(r"\.(jpe?g|png|webp|bmp|tiff?|gif)$", re.IGNORECASE)


def is_table(src: str | Path) -> bool:
    """Whether ``src`` is a local table of arrays: ``.npy``/``.npz``/Parquet, or a CSV/JSONL file
    whose header (first row) has no ``path`` column."""
    p = Path(src)
    suffix = p.suffix.lower()
    if "://" in str(src) or not p.is_file() or suffix not in TABLE_SUFFIXES + ROW_SUFFIXES:
        return False
    if suffix in TABLE_SUFFIXES:
        return True
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            if suffix == ".csv":
                return "path" not in next(csv.reader(fh), ["path"])
            first = next((line for line in fh if line.strip()), "")
        row = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False  # the manifest reader names the problem
    return isinstance(row, dict) and "path" not in row


def read_table(path: str | Path, columns: Sequence[str] | None = None, dtype: str | None = None,
               strict: bool = False) -> tuple[dict[str, np.ndarray], dict[str, str],
                                              list[dict[str, str]]]:
    """(columns by field name, original name → field name where they differ, rows skipped).

    ``columns``: the columns (``.npz`` keys, structured ``.npy`` fields) to take, in that order
    (default: every numeric one; text ones must be named). ``dtype``: a float dtype every
    floating-point column is cast to (integer columns keep theirs)."""
    p = Path(path)
    suffix = p.suffix.lower()
    skipped: list[dict[str, str]] = []
    if suffix == ".npy":
        raw = _npy(p)
    elif suffix == ".npz":
        raw = _npz(p)
    elif suffix in (".parquet", ".pq"):
        raw = _parquet(p, columns)
    elif suffix == ".csv":
        raw = _csv(p, skipped, strict)
    else:
        raw = _jsonl(p, skipped, strict)
    if columns:
        unknown = [c for c in columns if c not in raw]
        if unknown:
            raise ConfigError(f"columns: {unknown} not in {p}; it has {list(raw)}",
                              option="columns")
        raw = {c: raw[c] for c in columns}
    else:
        text = [c for c, a in raw.items() if a.dtype.kind == "U"]
        if text:
            c = text[0]
            hint = (" (it names image files: an image manifest needs a 'path' column)"
                    if any(_IMAGE_NAME.search(v) for v in raw[c][:100]) else "")
            raise BadInputError(f"{p}: column {c!r} is not numeric (row 1: {str(raw[c][0])!r})"
                                f"{hint}; name the columns to keep with --columns (text ones "
                                f"are stored as JSON): numeric columns are {_numeric(raw)}")
    if not raw:
        raise BadInputError(f"{p}: the table has no columns")
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt.kind != "f":
            raise ConfigError(f"dtype={dtype!r}: a float dtype (float16, float32, float64) "
                              "for the floating-point columns", option="dtype")
        raw = {c: a.astype(dt) if a.dtype.kind == "f" else a for c, a in raw.items()}
    names = _field_names(list(raw))
    return ({names[c]: a for c, a in raw.items()},
            {c: n for c, n in names.items() if c != n}, skipped)


def _numeric(raw: dict[str, np.ndarray]) -> list[str]:
    return [c for c, a in raw.items() if a.dtype.kind != "U"]


def _field_names(cols: list[str]) -> dict[str, str]:
    """Column names as field names: other characters become ``_``, a leading digit gets ``c_``,
    the reserved ``image``/``path`` get ``_`` appended, and a clash ``_2``, ``_3``..."""
    out: dict[str, str] = {}
    for c in cols:
        name = re.sub(r"\W", "_", c, flags=re.ASCII) or "column"
        name = "c_" + name if name[0].isdigit() else name
        name = name + "_" if name in RESERVED else name
        base, n = name, 2
        while name in out.values():
            name, n = f"{base}_{n}", n + 1
        out[c] = name
    return out


# --- readers ----------------------------------------------------------------------------------------

def _load(p: Path) -> Any:
    try:
        return np.load(p, allow_pickle=False)
    except ValueError as exc:  # object arrays, or not an npy/npz file
        raise BadInputError(f"{p}: cannot read without pickle ({exc}); store numeric arrays "
                            "(np.save with a numeric dtype)") from exc
    except OSError as exc:
        raise BadInputError(f"{p}: cannot read: {exc}") from exc


def _npy(p: Path) -> dict[str, np.ndarray]:
    """A structured array: a column per field; any other: one column named after the file."""
    arr = _load(p)
    if arr.ndim == 0:
        raise BadInputError(f"{p}: holds a single value, not rows")
    if arr.dtype.names:
        return {n: as_array(arr[n], f"{p}: field {n!r}") for n in arr.dtype.names}
    return {p.stem: as_array(arr, str(p))}


def _npz(p: Path) -> dict[str, np.ndarray]:
    with _load(p) as z:
        out = {}
        for k in z.files:
            try:
                out[k] = as_array(z[k], f"{p}: {k!r}")
            except ValueError as exc:  # an object array inside: refused by np.load
                raise BadInputError(f"{p}: array {k!r} cannot be read without pickle ({exc})"
                                    ) from exc
    return out


def _parquet(p: Path, columns: Sequence[str] | None) -> dict[str, np.ndarray]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError("Parquet tables need pyarrow: pip install pyarrow") from exc
    try:
        table = pq.read_table(p, columns=list(columns) if columns else None)
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{p}: cannot read as Parquet: {exc}") from exc
    out = {}
    for name, col in zip(table.column_names, table.columns):
        t = col.type
        what = f"{p}: column {name!r}"
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            rows = col.to_pylist()
            if any(r is None for r in rows):
                raise BadInputError(f"{what}: a row holds no list (null)")
            try:  # a null inside a list of ints makes the column float64, as for scalars
                out[name] = np.array(_nulls(rows), dtype=t.value_type.to_pandas_dtype())
            except (TypeError, ValueError):
                out[name] = as_array(_nulls(rows), what)
        elif pa.types.is_string(t) or pa.types.is_large_string(t) or \
                pa.types.is_dictionary(t) or pa.types.is_temporal(t):  # dates: text, as in CSV
            out[name] = np.array(["" if v is None else str(v) for v in col.to_pylist()], str)
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            out[name] = as_array(col.to_numpy(), what)  # ints with nulls: float64 with NaN
        else:
            raise BadInputError(f"{what}: type {t} is not stored (numbers, bool, text, lists of "
                                "numbers); leave it out with --columns, or cast it")
    return out


def _csv(p: Path, skipped: list[dict[str, str]], strict: bool) -> dict[str, np.ndarray]:
    with open(p, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise BadInputError(f"{p}: empty file (no header row)")
        cells: list[list[str]] = []
        for n, row in enumerate(reader, 2):
            if len(row) != len(header):
                if not row:
                    continue
                _skip(p, n, f"{len(row)} cells, the header has {len(header)}", skipped, strict)
                continue
            cells.append(row)
    if not cells:
        raise BadInputError(f"{p}: the table has a header but no rows")
    return {h: _column([r[j] for r in cells]) for j, h in enumerate(header)}


def _jsonl(p: Path, skipped: list[dict[str, str]], strict: bool) -> dict[str, np.ndarray]:
    rows: list[dict[str, Any]] = []
    keys: list[str] | None = None
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                _skip(p, n, f"invalid JSON: {exc}", skipped, strict)
                continue
            if not isinstance(row, dict):
                _skip(p, n, f"a JSON {type(row).__name__}, not an object", skipped, strict)
                continue
            keys = keys or list(row)
            if set(row) != set(keys):
                _skip(p, n, f"keys {sorted(row)}, the first row's are {sorted(keys)}", skipped,
                      strict)
                continue
            rows.append(row)
    if not rows or keys is None:
        raise BadInputError(f"{p}: no rows")
    out = {}
    for k in keys:
        values = [r[k] for r in rows]
        if any(isinstance(v, str) for v in values):
            out[k] = np.array(["" if v is None else str(v) for v in values], str)
        else:
            out[k] = as_array([_nulls(v) for v in values], f"{p}: {k!r}")
    return out


def _nulls(value: Any) -> Any:
    """JSON null (also inside lists) as NaN."""
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return np.nan if value is None else value


def _skip(p: Path, line: int, why: str, skipped: list[dict[str, str]], strict: bool) -> None:
    if strict:
        raise BadInputError(f"{p}:{line}: {why}")
    skipped.append({"path": f"{p.name}:{line}", "reason": why})


def _column(cells: list[str]) -> np.ndarray:
    """CSV cells as int64, else float64 (missing: NaN), else text."""
    na = [c.strip() in NA for c in cells]
    if not any(na):
        try:
            return np.array(cells, dtype=np.int64)
        except ValueError:
            pass
    try:
        return np.array(["nan" if m else c for c, m in zip(cells, na)], dtype=np.float64)
    except ValueError:
        return np.array(cells, dtype=str)
