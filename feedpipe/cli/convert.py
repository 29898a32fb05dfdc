"""Pack a source once into LMDB, HDF5 or WebDataset: an image folder or ImageFolder tree, a
CSV/JSONL manifest (with labels, boxes, keypoints, text), WebDataset shards, a Hugging Face
dataset, or a table of arrays (a .npy/.npz/Parquet table, or CSV/JSONL without a path column:
each row a sample, or with --series one time series). Writes atomically; bad inputs are skipped
and listed (--strict stops on them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from converters.options import (
    Check,
    Codec,
    ExtraChannels,
    Format,
    JpegStore,
    LabelsAs,
    Layout,
    MaskDtype,
    MaskStore,
    Store,
    TargetDtype,
    Unlabeled,
)

from ..errors import ConfigError
from ..schema.imaging import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_PIXELS_PER_BYTE,
    DEFAULT_MAX_SCANS,
    jpeg_fallback,
)
from .args import add_storage_args, given, human, print_first, size_arg, some, storage_options

if TYPE_CHECKING:
    from converters import ConvertResult

HELP = "pack images (or arrays) into LMDB, HDF5 or WebDataset"
# by dest: convert()'s keywords every image source takes (IMAGES) and image files (folders,
# trees, manifests) take (FILES); the options only image files, or images, apply to
IMAGES = ("to", "store", "codec", "quality", "check", "extra_channels", "max_pixels", "max_scans",
          "max_pixels_per_byte", "jpeg", "strict", "overwrite", "val_fraction", "seed")
FILES = ("workers", "masks", "mask_store", "mask_dtype", "num_classes", "ignore_index", "layout",
         "mask_palette", "split_root", "split_classes", "coco", "labels", "unlabeled",
         "contained")
FILES_ONLY = ("masks", "targets", "target", "split_root", "mask_palette", "ignore_index", "labels",
              "unlabeled", "contained")
IMAGES_ONLY = ("coco", "resize", "store", "codec", "keypoints_column", "boxes_column",
               "text_column", "array_column", "part")
NOTE_ROWS, NOTE_RATIO = 1000, 4  # a table of scalars this long and this much larger on disk: note


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("src", help="image folder, ImageFolder tree, .csv/.jsonl manifest, WebDataset "
                   "shards (folder, .tar/.tgz, brace pattern), or hf://org/name or a "
                   "save_to_disk folder (docs/sources.md); a table of arrays: .npy, .npz, "
                   ".parquet, or .csv/.jsonl without a path column (docs/arrays.md)")
    c.add_argument("--split", default="train", help="Hugging Face source: the split to read")
    c.add_argument("--to", required=True, choices=get_args(Format))
    c.add_argument("-o", "--out", required=True, help="output folder, or an object-store URL "
                   "(s3://bucket/ds/: shards upload as they finish, the manifest last)")
    c.add_argument("--workers", type=int, default=None, help="processes (default: usable cores)")
    c.add_argument("--store", default="passthrough", choices=get_args(Store),
                   help="passthrough keeps JPEG bytes unchanged; raw stores decoded uint8 RGB")
    c.add_argument("--resize", metavar="N|HxW",
                   help="shorter side (256) or HxW, height x width as --size elsewhere (240x320: "
                   "320 wide, 240 high); raw with N crops the center square")
    c.add_argument("--codec", default="auto", choices=get_args(Codec),
                   help="auto (default): JPEG and lossy WebP kept as they are, PNG stored "
                   "unchanged, other lossless formats (TIFF, BMP, PNM, lossless WebP, JPEG 2000) "
                   "as lossless PNG; jpeg/png/webp: re-encode everything else to that codec")
    c.add_argument("--quality", type=int, default=90, help="for lossy (re-)encoding only")
    c.add_argument("--jpeg", default="baseline", choices=get_args(JpegStore),
                   help="progressive JPEGs: baseline (default) stores them as baseline with the "
                   "same DCT coefficients (identical pixels, checked per file; ~3x faster to "
                   "decode); keep stores them byte for byte")
    c.add_argument("--extra-channels", default="refuse", choices=get_args(ExtraChannels),
                   help="images with transparent alpha, channels beyond RGB or 16-bit RGB: "
                   "refuse (skip, by name; default) or drop what 8-bit RGB cannot hold")
    c.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="refuse images declaring more pixels (decompression bombs; default "
                   f"{DEFAULT_MAX_PIXELS:,})")
    c.add_argument("--max-scans", type=int, default=DEFAULT_MAX_SCANS,
                   help="refuse JPEGs holding more scans (each decodes every block again: scan "
                   f"bombs; default {DEFAULT_MAX_SCANS})")
    c.add_argument("--max-pixels-per-byte", type=int, default=DEFAULT_MAX_PIXELS_PER_BYTE,
                   help="refuse JPEGs declaring more pixels per byte of file (cut short or "
                   f"hostile; default {DEFAULT_MAX_PIXELS_PER_BYTE}, the most a whole "
                   "Huffman-coded JPEG holds)")
    c.add_argument("--max-member-size", type=size_arg,
                   help="WebDataset shards: refuse a member larger than this (members are read "
                   "whole; default 256MiB); tables: an .npz array or a Parquet column (read "
                   "whole into memory; default 1GiB)")
    c.add_argument("--layout", default="auto", choices=get_args(Layout),
                   help="auto: an ImageFolder tree when a sub-folder holds images (class folders "
                   "win; top-level images are skipped by name), else a flat folder")
    c.add_argument("--labels", default="auto", choices=get_args(LabelsAs),
                   help="a CSV/JSONL manifest's label column: auto (integers are class indices, "
                   "other values sorted class names; a column mixing both is refused by row), "
                   "ints (every label an index), names (every label a class name, integers first "
                   "in numeric order)")
    c.add_argument("--unlabeled", default="refuse", choices=get_args(Unlabeled),
                   help="manifest rows with an empty label among labelled rows: refuse (by row; "
                   "default) or keep them with label -1, counted in the summary")
    c.add_argument("--contained", action="store_true",
                   help="refuse, by name, every file the source names or links to outside its "
                   "folder (a manifest's absolute paths, '..', symlinks leading out): for "
                   "manifests from untrusted hands")
    c.add_argument("--check", default="decode", choices=get_args(Check),
                   help="decode (default): read every JPEG whole, every scan (at 1/8 scale), so "
                   "one cut short or damaged is refused; header: its markers and end marker "
                   "only (~4x the images/s on 2 cores; damaged data then fails when loading)")
    c.add_argument("--strict", action="store_true", help="fail on the first bad or refused "
                   "input, and on a class left with no samples")
    c.add_argument("--val-fraction", type=float, default=0.0)
    c.add_argument("--split-root", choices=["separate", "field"],
                   help="SRC holds train/val(/test) ImageFolder trees: one dataset each "
                   "(separate) or one with a split field")
    c.add_argument("--split-classes", default="agree", choices=["agree", "union"],
                   help="split root: refuse differing class lists (agree) or use their union")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--overwrite", action="store_true")
    c.add_argument("--shard-size", type=size_arg,
                   help="wds: max bytes per shard (MB: 10^6, MiB: 2^20; default 256MiB)")
    c.add_argument("--shard-count", type=int, help="wds: max samples per shard (default 10000)")
    c.add_argument("--compression", choices=["lzf", "gzip"], help="hdf5 chunk compression")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_storage_args(c)
    c.add_argument("--part", metavar="i/N|auto/N",
                   help="pack only the i-th of N slices of the sorted source into "
                   "OUT/parts/ (auto: $SLURM_ARRAY_TASK_ID or $JOB_COMPLETION_INDEX); join "
                   "the parts with `feedpipe merge OUT`")
    g = c.add_argument_group("segmentation masks and targets")
    g.add_argument("--masks", type=Path, help="mask folder, matched to images by file name")
    g.add_argument("--mask-palette", metavar="auto|FILE.json",
                   help="RGB colour masks: map colours to class indices with a palette file "
                   "({\"#rrggbb\": index}) or auto (<= 256 colours, sorted; docs/sources.md)")
    g.add_argument("--mask-store", default="raw", choices=get_args(MaskStore),
                   help="lossless mask storage: raw (default, no decode when loading) or png "
                   "(smaller, ~0.4 ms to decode a 500x375 mask)")
    g.add_argument("--mask-dtype", default="uint8", choices=get_args(MaskDtype))
    g.add_argument("--num-classes", type=int, help="classes in the masks (default: max index+1)")
    g.add_argument("--ignore-index", type=int, metavar="N",
                   help="a mask value of no class (e.g. 255, VOC's void band): left out of "
                   "num_classes, background to the targets, recorded for the loader")
    g.add_argument("--targets", help="built-in targets computed from each mask, comma-separated: "
                   "distance_map, boundary")
    g.add_argument("--target", action="append", metavar="NAME=MODULE:FUNCTION",
                   help="a user target: a function mask -> ndarray (repeatable)")
    g.add_argument("--distance-signed", action="store_true", help="negative inside objects")
    g.add_argument("--distance-per-class", action="store_true",
                   help="one channel per class 1..K-1 (needs --num-classes)")
    g.add_argument("--distance-truncate", type=float, help="clip distances at this many pixels")
    g.add_argument("--distance-normalize", action="store_true",
                   help="divide by the truncation (or the image diagonal): values in [-1, 1]")
    g.add_argument("--distance-dtype", default="float16", choices=get_args(TargetDtype),
                   help="storage; uint8/uint16 need --distance-truncate or --distance-normalize")
    g.add_argument("--boundary-width", type=float, default=1.0)
    g = c.add_argument_group("keypoints, boxes, text and arrays (docs/fields.md)")
    g.add_argument("--coco", type=Path, help="a COCO instances.json whose images are in SRC: "
                   "boxes, categories and iscrowd per image")
    g.add_argument("--keypoints-column", help="manifest column of [[x, y(, v)], ...] pixels")
    g.add_argument("--boxes-column", help="manifest column of [[x1, y1, x2, y2, label], ...]")
    g.add_argument("--text-column", help="manifest column of text labels (UTF-8)")
    g.add_argument("--array-column", action="append", default=[],
                   help="manifest column of .npy paths or JSON lists (repeatable)")
    g.add_argument("--flip-indices", help="comma-separated landmark order after a horizontal "
                   "flip (left/right pairs swapped), e.g. 1,0,2")
    g.add_argument("--vocab", help="the characters text labels may use (CTC index = position+1)")
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
    c.set_defaults(parser=c)  # given() compares with its defaults and names its flags


def _columns(args: argparse.Namespace) -> object:
    from converters import LabelColumns

    if not (args.keypoints_column or args.boxes_column or args.text_column or args.array_column):
        return None
    try:
        flip = tuple(int(i) for i in args.flip_indices.split(",")) if args.flip_indices else None
    except ValueError as exc:
        raise ConfigError(f"--flip-indices {args.flip_indices}: use comma-separated ints") from exc
    return LabelColumns(args.keypoints_column, args.boxes_column, args.text_column,
                        tuple(args.array_column), flip, args.vocab)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from converters import convert

    writer_options = _writer_options(args)
    bar = tqdm(total=None, unit="img", disable=args.quiet or None, dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    table = None
    try:
        table = _pack_table(args, writer_options, progress)
        res = table or _convert_records(args, writer_options, progress)
        res = res or convert(args.src, **_options(args, writer_options, progress),
                             **{k: getattr(args, k) for k in FILES}, targets=_targets(args),
                             columns=_columns(args))  # type: ignore[arg-type]
    except KeyboardInterrupt:
        bar.close()
        kept = ("the uploaded shards were kept without a manifest (nothing reads them as a "
                "dataset); run the same command again to resume" if "://" in args.out else
                f"the partial output was removed and {args.out} was left as it was")
        print(f"feedpipe convert: interrupted; {kept}", file=sys.stderr)
        return 130
    finally:
        bar.close()
    if table is not None:
        return _table_summary(table, args)
    _summary(res, args)
    return 0


def _options(args: argparse.Namespace, writer_options: dict[str, object],
             progress: Any) -> dict[str, Any]:
    """:func:`converters.convert`'s output and the keywords every source takes."""
    from converters import parse_resize
    from converters.parts import parse_part

    return {"out": args.out, **{k: getattr(args, k) for k in IMAGES},
            "resize": parse_resize(args.resize), "writer_options": writer_options,
            "progress": progress, "storage_options": storage_options(args),
            "part": parse_part(args.part) if args.part else None}


def _writer_options(args: argparse.Namespace) -> dict[str, object]:
    """The format's own options; one given for another format is refused, not ignored."""
    opts = {"shard_size": ("wds", args.shard_size), "shard_count": ("wds", args.shard_count),
            "compression": ("hdf5", args.compression)}
    wrong = [f"--{k.replace('_', '-')} ({fmt} only)" for k, (fmt, v) in opts.items()
             if v is not None and fmt != args.to]
    if wrong:
        raise ConfigError(f"--to {args.to}: {', '.join(wrong)} would be ignored; drop it, or "
                          "pick the format it applies to")
    return {k: v for k, (fmt, v) in opts.items() if v is not None}


def _convert_records(args: argparse.Namespace, writer_options: dict[str, object],
                     progress: Any) -> ConvertResult | None:
    """Foreign WebDataset shards and Hugging Face datasets (converters.records); None for the
    sources :func:`converters.convert` reads."""
    from converters import convert
    from converters.foreign_wds import record_source

    limit = args.max_member_size
    src = record_source(args.src, args.split, limit)
    if limit is not None and (src is None or src.kind != "wds-shards"):
        raise ConfigError(f"{args.src}: --max-member-size applies to WebDataset shards and "
                          "tables only")
    if src is None:
        return None
    unused = given(args, FILES_ONLY)
    if unused:
        raise ConfigError(f"{args.src}: {', '.join(unused)} apply to image folders and "
                          "manifests, not to WebDataset shards or Hugging Face datasets")
    return convert(src, **_options(args, writer_options, progress))


def _summary(res: ConvertResult, args: argparse.Namespace) -> None:
    """Samples written out of the inputs tried (never "all" when some were skipped), the splits
    when there are several, how each input was stored, files not taken, what needs attention."""
    from converters.palette import show_palette

    splits = ", ".join(f"{k} {v}" for k, v in res.splits.items())
    what = (f"{res.written} of {res.written + len(res.skipped)} inputs" if res.skipped else
            f"{res.written} samples")
    print(f"wrote {what}" + (f" ({splits})" if "all" not in res.splits else "")
          + f" to {res.out} as {args.to} in {res.seconds:.1f} s ({res.rate:.0f} images/s)"
          + (f"; {len(res.skipped)} skipped (listed below and in the manifest)"
             if res.skipped else ""))
    print(f"  stored unchanged: {res.passthrough}, progressive JPEGs made baseline "
          f"(lossless): {res.transcoded}, re-encoded: {res.reencoded}, skipped: "
          f"{len(res.skipped)}, files not taken: {res.ignored}; image codec {res.image_codec}")
    if res.stored:
        print("  stored: " + ", ".join(f"{k} {v}" for k, v in sorted(res.stored.items())))
    fallback = jpeg_fallback()  # turbojpeg decoded each at conversion; Pillow cannot tell
    reads = ("turbojpeg decoded each whole" if fallback == "turbojpeg" else f"{fallback} "
             "decodes them, and cannot tell one cut short: pip install turbojpeg to check them")
    for names, text in ((res.slow_jpegs, "JPEGs need the slower fallback decoder (simplejpeg "
                         f"cannot read them; {reads})"),
                        (res.channels_dropped, "images had alpha or extra channels dropped "
                         "(--extra-channels drop)"),
                        # (a part holds a slice of them: `feedpipe merge` names the empty ones)
                        ([] if args.part else res.empty_classes, "classes have no samples")):
        if names:
            print(f"  {len(names)} {text}: {some(names)}")
    print_first([f"  re-encoded (lossy) {f['path']}: {f['reason']}" for f in res.lossy], 10,
                "more re-encoded")
    if res.progressive_kept:
        print(f"  {len(res.progressive_kept)} progressive JPEGs stored as they are (listed in the "
              "manifest): " + some([f"{k['path']} ({k['reason']})" for k in res.progressive_kept],
                                   sep="; "))
    print_first([f"  not taken {f['path']}: {f['reason']}" for f in res.ignored_files], 10,
                "more not taken")
    print(f"  input {human(res.bytes_in)} -> output {human(res.bytes_out)}"
          + (f" ({res.bytes_out / res.bytes_in:.3f}x)" if res.bytes_in else ""))
    print_first([f"  skipped {s['path']}: {s['reason']}" for s in res.skipped], 20)
    if res.unmatched_masks:
        print(f"  masks without an image: {len(res.unmatched_masks)} (listed in the manifest): "
              + some(res.unmatched_masks))
    if res.unlabeled:
        print(f"  unlabeled: {len(res.unlabeled)} rows stored with label -1 (--unlabeled keep; "
              "listed in the manifest): " + some(res.unlabeled))
    if res.mask_palette is not None:
        print(f"  mask palette ({len(res.mask_palette)} colours; conversion.mask_palette in the "
              f"manifest; pass this JSON as a --mask-palette file to keep the numbering): "
              f"{show_palette(res.mask_palette)}")
    print_first([f"  colour {c['colour']} left out of the auto palette: at most {c['pixels']} "
                 f"pixel(s) in one mask ({c['mask']}); masks holding it are skipped"
                 for c in res.palette_left_out], 10, "more colours left out")


def _targets(args: argparse.Namespace) -> list[object]:
    """--targets built-ins (with their --distance-*/--boundary-* options) + --target name=spec."""
    from converters.targets import make_boundary, make_distance_map, user_target

    out: list[object] = []
    for name in filter(None, (n.strip() for n in (args.targets or "").split(","))):
        if name == "distance_map":
            out.append(make_distance_map(
                signed=args.distance_signed, per_class=args.distance_per_class,
                num_classes=args.num_classes, truncate=args.distance_truncate,
                normalize=args.distance_normalize, dtype=args.distance_dtype))
        elif name == "boundary":
            out.append(make_boundary(width=args.boundary_width))
        else:
            raise ConfigError(f"--targets {name}: built-ins are distance_map, boundary; add your "
                              "own with --target name=package.module:function")
    for spec in args.target or []:
        name, eq, ref = spec.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"--target {spec}: use name=package.module:function")
        try:
            out.append(user_target(name.strip(), ref.strip()))
        except ConfigError as exc:
            raise ConfigError(f"{exc}{_path_hint(ref.strip())}") from exc
    return out


def _path_hint(ref: str) -> str:
    """Why ``module:function`` may not import from the command: the ``feedpipe`` command does
    not search the current folder, and its workers import the module too."""
    import importlib.util

    top = ref.partition(":")[0].split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if found or not top:
        return ""
    here = [p for p in (Path(f"{top}.py"), Path(top)) if p.exists()]
    where = (f"{here[0]} is in the current folder, which the feedpipe command does not search"
             if here else f"no module {top!r} on the import path")
    return (f" ({where}: run with PYTHONPATH set to the folder that holds it, e.g. "
            f"PYTHONPATH=. feedpipe convert ...)")


def _pack_table(args: argparse.Namespace, writer_options: dict[str, object],
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
    unused = given(args, (*FILES_ONLY, *IMAGES_ONLY))
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


def _table_summary(res: ConvertResult, args: argparse.Namespace) -> int:
    """What was packed: samples (or series rows), fields, missing values, rows left out."""
    import numpy as np

    from ..dataset.registry import open_dataset

    roots = [res.out] if "all" in res.splits else [f"{res.out}/{s}" for s in res.splits]
    ds = open_dataset(roots[0])
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
