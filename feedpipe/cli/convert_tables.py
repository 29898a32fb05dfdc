"""``feedpipe convert TABLE``: a ``.npy``/``.npz``/Parquet table, or a CSV/JSONL file without a
``path`` column, packed as arrays (:mod:`converters.tables`, :func:`converters.arrays.pack_arrays`):
each row a sample, or with ``--series`` one time series stored once (docs/arrays.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .args import given, human, print_first

if TYPE_CHECKING:
    from converters import ConvertResult

# image options that mean nothing for a table
_IMAGE_ONLY = ("masks", "targets", "target", "split_root", "mask_palette", "coco", "resize",
               "store", "codec", "keypoints_column", "boxes_column", "text_column",
               "array_column", "labels", "unlabeled", "part", "contained", "ignore_index")
NOTE_ROWS, NOTE_RATIO = 1000, 4  # a table of scalars this long and this much larger on disk: note


def add_args(c: Any) -> None:
    """The table options of ``feedpipe convert``."""
    g = c.add_argument_group("array tables: .npy, .npz, .parquet, CSV/JSONL without a path "
                             "column (docs/arrays.md)")
    g.add_argument("--columns", help="comma-separated columns (npz keys) to keep, in order "
                   "(default: every numeric one; text columns must be named)")
    g.add_argument("--dtype", choices=["float16", "float32", "float64"],
                   help="store floating-point columns as this (CSV/JSON numbers read as "
                   "float64); integer columns keep theirs")
    g.add_argument("--series", action="store_true", help="the rows are one time series: "
                   "stored once, in blocks, for feedpipe.dataset.windows.Windows")
    g.add_argument("--train-fraction", type=float, help="--series: normalization statistics "
                   "(mean/std per column) from the first this fraction of rows only")
    g.add_argument("--block-rows", type=int, help="--series: rows per stored block "
                   "(default: about 1 MiB each)")


def pack(args: argparse.Namespace, writer_options: dict[str, object],
         progress: Any) -> ConvertResult | None:
    """Pack ``args.src`` if it is a table (else None, after refusing the table options)."""
    from converters.arrays import pack_arrays
    from converters.tables import is_table, read_table

    if not is_table(args.src):
        wrong = given(args, ("columns", "dtype", "series", "train_fraction", "block_rows"))
        if wrong:
            raise ConfigError(f"{args.src}: {', '.join(wrong)} apply to array tables (.npy, "
                              ".npz, .parquet, CSV/JSONL without a 'path' column)")
        return None
    unused = given(args, _IMAGE_ONLY)
    if unused:
        why = (" (it has no 'path' column: name the column of image paths 'path' to pack "
               "images)" if str(args.src).lower().endswith((".csv", ".jsonl")) else "")
        raise ConfigError(f"{args.src} is a table of arrays{why}: {', '.join(unused)} "
                          f"appl{'ies' if len(unused) == 1 else 'y'} to images only")
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    limit = {"max_member_bytes": args.max_member_size} if args.max_member_size else {}
    cols, renamed, skipped = read_table(args.src, columns, args.dtype, args.strict, **limit)
    return pack_arrays(cols, args.out, to=args.to, series=args.series,
                       train_fraction=args.train_fraction, block_rows=args.block_rows,
                       strict=args.strict, overwrite=args.overwrite,
                       val_fraction=args.val_fraction, seed=args.seed,
                       writer_options=writer_options, progress=progress, source=args.src,
                       renamed=renamed, not_taken=skipped)


def summary(res: ConvertResult, args: argparse.Namespace) -> int:
    """What was packed: samples (or series rows), fields, missing values, rows left out."""
    import numpy as np

    import feedpipe

    roots = [res.out] if "all" in res.splits else [f"{res.out}/{s}" for s in res.splits]
    ds = feedpipe.open_dataset(roots[0])
    conv = ds.manifest.conversion
    splits = ", ".join(f"{k} {v}" for k, v in res.splits.items())
    series = conv.get("series")
    what = (f"a series of {series['rows']} rows ({res.written} block(s) of up to "
            f"{series['block_rows']} rows)" if series else f"{res.written} samples"
            + (f" ({splits})" if "all" not in res.splits else ""))
    print(f"wrote {what} to {res.out} as {args.to} in {res.seconds:.1f} s")
    print("  fields: " + ", ".join(f"{f.name} " + (f"{np.dtype(f.dtype).name} {tuple(f.shape)}"
                                   if getattr(f, "dtype", None) else "text") for f in ds.schema))
    for old, new in conv.get("renamed_columns", {}).items():
        print(f"  column {old!r} stored as field {new!r}")
    if series and "stats" in series:
        print(f"  normalization statistics from rows 0..{series['train_rows'] - 1} "
              f"(train fraction {series['train_fraction']})")
    for name, m in res.missing.items():
        inf = f", {m['infinite']} infinite" if m.get("infinite") else ""
        print(f"  missing values (NaN) in {name}: {m['values']} in {m['rows']} rows{inf} (first "
              f"rows {', '.join(map(str, m['first_rows']))}"
              + (" ..." if m["rows"] > len(m["first_rows"]) else "") + ")")
    print_first([f"  skipped {s['path']}: {s['reason']}"
                 for s in [*res.ignored_files, *res.skipped]], 20)
    print(f"  arrays {human(res.bytes_in)} -> output {human(res.bytes_out)}")
    scalars = all(getattr(f, "shape", None) == () for f in ds.schema if f.name != "path")
    if not series and scalars and res.written >= NOTE_ROWS and \
            res.bytes_out > NOTE_RATIO * max(1, res.bytes_in):
        hdf5 = "" if args.to == "hdf5" else (", and --to hdf5 stores each column as one array "
                                            "(about 6x the values, against 21x in LMDB and "
                                            "130x in WebDataset)")
        print(f"  note: {res.written:,} rows of numbers stored one record each take "
              f"{res.bytes_out / max(1, res.bytes_in):.0f}x the bytes of their values. Rows that "
              "are time steps pack once, in blocks, with --series (windows are cut at load "
              f"time){hdf5}: docs/arrays.md")
    return 0
