"""Tables without images as array sources: ``.npy``, ``.npz``, Parquet, and CSV/JSONL files without
a ``path`` column (docs/arrays.md). Nothing is lost or cast silently: a value its column's dtype
cannot hold exactly is refused, naming the column and line; an ``.npz`` member or Parquet column
over ``max_member_bytes`` is refused before it is decompressed."""

from __future__ import annotations

import csv
import json
import re
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from feedpipe.errors import (
    BadInputError,
    ConfigError,
    CorruptRecordError,
    MissingDependencyError,
    UnsafeDataError,
)
from feedpipe.schema.codecs import npy_decode

from .arrays import RESERVED, as_array
from .sources import check_header, json_lines

TABLE_SUFFIXES = (".npy", ".npz", ".parquet", ".pq")
ROW_SUFFIXES = (".csv", ".jsonl", ".ndjson")
NA = frozenset({"", "NA", "N/A", "NaN", "nan", "null", "None"})
#: one array of a table (an ``.npz`` member, a Parquet column) is read whole into memory: a
#: larger one is refused before it is decompressed (a 4 MB ``.npz`` can hold 4 GiB of zeros)
MAX_MEMBER_BYTES = 1 << 30
EXACT = 1 << 53  # float64 holds every integer of magnitude up to this exactly
_IMAGE_NAME = re.compile(r"\.(jpe?g|png|webp|bmp|tiff?|gif)$", re.IGNORECASE)
_INT = re.compile(r"\s*[+-]?[0-9]+\s*")  # a CSV cell written as an integer


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
               strict: bool = False, max_member_bytes: int = MAX_MEMBER_BYTES
               ) -> tuple[dict[str, np.ndarray], dict[str, str], list[dict[str, str]]]:
    """(columns by field name, original name → field name where they differ, rows skipped).

    ``columns``: the columns (``.npz`` keys, structured ``.npy`` fields) to take, in that order
    (default: every numeric one; text ones must be named). ``dtype``: a float dtype every
    floating-point column is cast to (integer columns keep theirs). ``max_member_bytes``: the
    largest ``.npz`` member or Parquet column read (see the module docstring)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if isinstance(max_member_bytes, bool) or not isinstance(max_member_bytes, int) or \
            max_member_bytes < 1:
        raise ConfigError(f"max_member_bytes={max_member_bytes!r}: use a positive byte count",
                          option="max_member_bytes")
    skipped: list[dict[str, str]] = []
    if suffix == ".npy":
        raw = _npy(p)
    elif suffix == ".npz":
        raw = _npz(p, max_member_bytes)
    elif suffix in (".parquet", ".pq"):
        raw = _parquet(p, columns, max_member_bytes)
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
                                f"are stored as JSON): numeric columns are "
                                f"{[c for c, a in raw.items() if a.dtype.kind != 'U']}")
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


def _npz(p: Path, max_bytes: int) -> dict[str, np.ndarray]:
    """Each member, its size (from the zip directory) bounded by ``max_bytes`` and its npy header
    checked against that size before it is decompressed; never unpickled."""
    with _load(p) as z:
        names = {n.removesuffix(".npy"): n for n in z.zip.namelist()}
        out = {}
        for k in z.files:
            info = z.zip.getinfo(names[k])
            what = f"{p}: array {k!r}"
            _bound(what, info.file_size, max_bytes, f" ({info.compress_size:,} stored)")
            try:
                out[k] = as_array(npy_decode(z.zip.read(names[k]), what), what)
            except (zipfile.BadZipFile, CorruptRecordError, UnsafeDataError, OSError) as exc:
                raise BadInputError(f"{what} cannot be read without pickle or is damaged "
                                    f"({exc})") from exc
    return out


def _parquet(p: Path, columns: Sequence[str] | None, max_bytes: int) -> dict[str, np.ndarray]:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError as exc:
        raise MissingDependencyError("Parquet tables need pyarrow: pip install pyarrow") from exc
    try:
        table = _read_parquet(p, columns, max_bytes)
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{p}: cannot read as Parquet: {exc}") from exc
    out = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        what = f"{p}: column {name!r}"
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            rows = col.to_pylist()
            if any(r is None for r in rows):
                raise BadInputError(f"{what}: a row holds no list (null)")
            _arrow_nulls(pc.list_flatten(col), what)
            try:  # a null inside a list of ints makes the column float64, as for scalars
                out[name] = np.array(_nulls(rows), dtype=t.value_type.to_pandas_dtype())
            except (TypeError, ValueError):
                out[name] = as_array(_nulls(rows), what)
        elif pa.types.is_string(t) or pa.types.is_large_string(t) or \
                pa.types.is_dictionary(t) or pa.types.is_temporal(t):  # dates: text, as in CSV
            out[name] = np.array(["" if v is None else str(v) for v in col.to_pylist()], str)
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            _arrow_nulls(col, what)
            out[name] = as_array(col.to_numpy(), what)  # ints with nulls: float64 with NaN
        else:
            raise BadInputError(f"{what}: type {t} is not stored (numbers, bool, text, lists of "
                                "numbers); leave it out with --columns, or cast it")
    return out


def _read_parquet(p: Path, columns: Sequence[str] | None, max_bytes: int) -> Any:
    """The table, no column larger than ``max_bytes``: fixed-width columns are bounded from the
    metadata (rows × width) before anything is read; others (lists, text) while they are read,
    batch by batch (a few bytes of run-length code can stand for gigabytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(p)
    schema = pf.schema_arrow
    names = [c for c in columns if c in schema.names] if columns else schema.names
    rows = pf.metadata.num_rows
    fixed = True
    for name in names:
        t = schema.field(name).type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            _bound(f"{p}: column {name!r}", rows * max(1, t.bit_width // 8), max_bytes)
        else:
            fixed = False
    if fixed:
        return pf.read(columns=names)
    batches, sizes = [], Counter[str]()
    for batch in pf.iter_batches(batch_size=1 << 16, columns=names):
        for name, col in zip(batch.schema.names, batch.columns, strict=True):
            sizes[name] += col.nbytes
            _bound(f"{p}: column {name!r}", sizes[name], max_bytes, " or more")
        batches.append(batch)
    return pa.Table.from_batches(batches) if batches else pf.read(columns=names)


def _bound(what: str, nbytes: int, max_bytes: int, detail: str = "") -> None:
    if nbytes > max_bytes:
        raise BadInputError(f"{what} holds {nbytes:,} bytes{detail}, over the bound of "
                            f"{max_bytes:,} for one array of a table, which is read whole into "
                            "memory (max_member_bytes, --max-member-size); raise it for a real "
                            "large array")


def _arrow_nulls(col: Any, what: str) -> None:
    """Refuse what numpy would change: a bool column with nulls (it would become objects), an
    integer column with nulls holding a value float64 cannot hold exactly."""
    import pyarrow as pa
    import pyarrow.compute as pc

    nulls = col.null_count
    if not nulls:
        return
    if pa.types.is_boolean(col.type):
        raise BadInputError(f"{what}: true/false with {nulls} null(s): a bool array holds no "
                            "missing value, so storing it as it is would change it; fill the "
                            "nulls (pyarrow.compute.fill_null), or cast the column to float64 "
                            "(1.0/0.0, NaN for null) if that is what should be stored")
    if pa.types.is_integer(col.type):
        low, high = pc.min_max(col).values()
        for v in (low.as_py(), high.as_py()):
            if v is not None and abs(v) > EXACT:
                raise BadInputError(f"{what}: {v} with {nulls} null(s): an integer column with "
                                    "missing values is stored as float64 (null: NaN), which "
                                    f"cannot hold {v} exactly; fill the nulls, or leave the "
                                    "column out with --columns")


def _csv(p: Path, skipped: list[dict[str, str]], strict: bool) -> dict[str, np.ndarray]:
    with open(p, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise BadInputError(f"{p}: empty file (no header row)")
        check_header(p, header)
        cells: list[list[str]] = []
        lines: list[int] = []
        for row in reader:
            if len(row) == len(header):
                cells.append(row)
                lines.append(reader.line_num)
            elif row:  # a blank line is no row
                _skip(p, reader.line_num, f"{len(row)} cells, the header has {len(header)}",
                      skipped, strict)
    if not cells:
        raise BadInputError(f"{p}: the table has a header but no rows")
    return {h: _column([r[j] for r in cells], f"{p}: column {h!r}", lines)
            for j, h in enumerate(header)}


class _Constant(float):
    """JSON's ``Infinity``/``NaN`` constants: a value written as infinite, where a number literal
    read as infinity (``1e400``) overflowed float64."""


def _jsonl(p: Path, skipped: list[dict[str, str]], strict: bool) -> dict[str, np.ndarray]:
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    keys: list[str] | None = None
    for n, row, why in json_lines(p, "invalid JSON", parse_constant=_Constant):
        if why is None and not isinstance(row, dict):
            why = f"a JSON {type(row).__name__}, not an object"
        elif why is None:
            keys = keys or list(row)
            if set(row) != set(keys):
                why = f"keys {sorted(row)}, the first row's are {sorted(keys)}"
        if why is not None:
            _skip(p, n, why, skipped, strict)
            continue
        rows.append(row)
        lines.append(n)
    if not rows or keys is None:
        raise BadInputError(f"{p}: no rows")
    out = {}
    for k in keys:
        values = [r[k] for r in rows]
        kinds = set(map(type, values))
        what = f"{p}: column {k!r}"
        if str in kinds:
            out[k] = np.array(["" if v is None else str(v) for v in values], str)
        elif list in kinds:  # lists of numbers: their leaves checked as a column's values
            _numbers(list(_leaves(values)), what, None)
            out[k] = as_array([_nulls(v) for v in values], what)
        else:
            out[k] = _numbers(values, what, lines)
    return out


def _leaves(values: list[Any]) -> Iterator[Any]:
    for v in values:
        if isinstance(v, list):
            yield from _leaves(v)
        else:
            yield v


def _numbers(values: list[Any], what: str, lines: list[int] | None) -> np.ndarray:
    """JSON scalars (int, float, bool, None) as one array, or BadInputError naming the line of a
    value the array could not hold as given (docs/arrays.md). ``lines``: each value's line (None:
    values are counted instead)."""
    kinds = set(map(type, values))

    def at(k: int) -> str:
        return f"line {lines[k]}" if lines is not None else f"value {k + 1}"

    def line(pick: Any) -> str:
        return at(next(k for k, v in enumerate(values) if pick(v)))

    if bool in kinds and kinds - {bool}:
        if kinds <= {bool, type(None)}:
            raise BadInputError(f"{what}: true/false with null ({line(lambda v: v is None)}): "
                                "a bool array holds no missing value; fill the nulls, or write "
                                "the column as numbers (1/0, null for missing)")
        raise BadInputError(f"{what}: true/false ({line(lambda v: type(v) is bool)}) among "
                            f"numbers ({line(lambda v: type(v) in (int, float))}): nothing is "
                            "cast silently; write every value as a number, or every one as "
                            "true/false")
    if int in kinds:
        ints = values if kinds == {int} else [v for v in values if type(v) is int]
        try:
            arr = np.array(ints, np.int64)
        except OverflowError:
            big = next(v for v in ints if not -(1 << 63) <= v < 1 << 63)
            raise BadInputError(f"{what}: {big} ({line(lambda v: v == big)}) does not fit int64; "
                                "write it as text (a JSON string, kept when --columns names the "
                                "column) or leave the column out with --columns") from None
        if ints is values:
            return arr
        inexact = np.flatnonzero((arr > EXACT) | (arr < -EXACT))
        if len(inexact):
            v = ints[int(inexact[0])]
            why = (f"with a missing value ({line(lambda x: x is None)}): a column with missing "
                   "values" if type(None) in kinds else "among fractions: the column")
            raise BadInputError(f"{what}: {v} ({line(lambda x: x == v)}) {why} is float64 "
                                "(missing: NaN), which cannot hold it exactly; fill the gaps, or "
                                "leave the column out with --columns")
    if type(None) in kinds:
        values = [np.nan if v is None else v for v in values]
    arr = as_array(values, what)
    if float in kinds and arr.dtype.kind == "f":
        for k in np.flatnonzero(np.isinf(arr)).tolist():
            if type(values[k]) is float:  # not the Infinity constant: a literal that overflowed
                raise BadInputError(f"{what}: a number ({at(k)}) does not fit float64 (it would "
                                    "read as infinity); write inf or Infinity for an infinite "
                                    "value")
    return arr


def _nulls(value: Any) -> Any:
    """JSON null (also inside lists) as NaN."""
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return np.nan if value is None else value


def _skip(p: Path, line: int, why: str, skipped: list[dict[str, str]], strict: bool) -> None:
    if strict:
        raise BadInputError(f"{p}:{line}: {why}")
    skipped.append({"path": f"{p.name}:{line}", "reason": why})


def _column(cells: list[str], what: str, lines: list[int]) -> np.ndarray:
    """CSV cells read as JSON values and checked by :func:`_numbers`: an empty or NA cell is null,
    ``inf``/``Infinity`` the constant. A cell that is not a plain ASCII number (``1_000``, other
    scripts' digits: ``int`` and ``float`` take them) makes the column text."""
    na = [c.strip() in NA for c in cells]
    given = [c for c, m in zip(cells, na, strict=True) if not m] if any(na) else cells
    joined = "".join(given)
    if not joined.isascii() or "_" in joined:
        return np.array(cells, dtype=str)
    try:
        nums: list[Any] = list(map(int, given))
    except ValueError:
        try:
            nums = list(map(float, given))
        except ValueError:
            return np.array(cells, dtype=str)
        for j in np.flatnonzero(~(np.abs(np.array(nums)) < EXACT)).tolist():  # inf, big, NaN
            c = given[j].strip()
            nums[j] = int(c) if _INT.fullmatch(c) else \
                _Constant(c) if c.lstrip("+-").lower() in ("inf", "infinity") else nums[j]
    if given is not cells:
        it = iter(nums)
        nums = [None if m else next(it) for m in na]
    return _numbers(nums, what, lines)
