"""The ``feedpipe`` command: convert, info, verify. Progress bars live here, not in the library."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .errors import ConfigError, FeedpipeError
from .imaging import DEFAULT_MAX_PIXELS, decoder_info
from .manifest import Manifest
from .schema import MaskField, TargetField

if TYPE_CHECKING:
    from converters import ConvertResult


def _size(text: str) -> int:
    """``256MB``, ``2G``, ``4096`` → bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("b")
    mult = units.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if t[-1:] in units else t) * mult)
    except (ValueError, OverflowError):
        n = 0
    if n <= 0:
        raise ConfigError(f"{text!r} is not a size: use a positive byte count with an optional "
                          "k/m/g suffix, e.g. 256MB or 2G")
    return n


def size_arg(text: str) -> str:
    """argparse ``type=`` for size options: checked at parse time (the flag is named), kept as
    text for the command."""
    try:
        _size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def hw_size(text: str) -> int | tuple[int, int]:
    """``--size``: ``224`` (square) or ``HxW`` (``96x128``), as make_loader's ``size=``."""
    h, x, w = text.lower().partition("x")
    try:
        size = (int(h), int(w)) if x else int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use N (square) or HxW, e.g. 224 or "
                                         "96x128") from None
    if min((size, size) if isinstance(size, int) else size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sides must be at least 1 pixel")
    return size


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def cmd_convert(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from converters import convert, parse_resize

    writer_options: dict[str, object] = {}
    if args.to == "wds":
        writer_options = {"shard_size": _size(args.shard_size), "shard_count": args.shard_count}
    elif args.to == "hdf5" and args.compression:
        writer_options = {"compression": args.compression}
    bar = tqdm(total=None, unit="img", disable=args.quiet or None, dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        res = convert(args.src, args.out, to=args.to, workers=args.workers, store=args.store,
                      resize=parse_resize(args.resize), codec=args.codec, quality=args.quality,
                      check=args.check, strict=args.strict, val_fraction=args.val_fraction,
                      seed=args.seed, overwrite=args.overwrite, writer_options=writer_options,
                      progress=progress, masks=args.masks, mask_store=args.mask_store,
                      mask_dtype=args.mask_dtype, num_classes=args.num_classes,
                      targets=_targets(args), extra_channels=args.extra_channels,
                      max_pixels=args.max_pixels, layout=args.layout)
    except KeyboardInterrupt:
        bar.close()
        print(f"feedpipe convert: interrupted; the partial output was removed and {args.out} was "
              "left as it was", file=sys.stderr)
        return 130
    finally:
        bar.close()
    splits = ", ".join(f"{k} {v}" for k, v in res.splits.items())
    print(f"wrote {res.written} samples ({splits}) to {res.out} as {args.to} in {res.seconds:.1f} s "
          f"({res.rate:.0f} images/s)")
    print(f"  stored unchanged: {res.passthrough}, re-encoded: {res.reencoded}, "
          f"skipped: {len(res.skipped)}, files not taken: {res.ignored}; image codec "
          f"{res.image_codec}")
    _print_stored(res)
    print(f"  input {_human(res.bytes_in)} -> output {_human(res.bytes_out)}"
          + (f" ({res.bytes_out / res.bytes_in:.3f}x)" if res.bytes_in else ""))
    for s in res.skipped[:20]:
        print(f"  skipped {s['path']}: {s['reason']}")
    if len(res.skipped) > 20:
        print(f"  ... and {len(res.skipped) - 20} more (all listed in the manifest)")
    if res.unmatched_masks:
        print(f"  masks without an image: {len(res.unmatched_masks)} (listed in the manifest): "
              + ", ".join(res.unmatched_masks[:5]) + (" ..." if len(res.unmatched_masks) > 5
                                                      else ""))
    return 0


def _print_stored(res: ConvertResult) -> None:
    """How each input was stored (from→to), files not taken, and what needs attention."""
    if res.stored:
        print("  stored: " + ", ".join(f"{k} {v}" for k, v in sorted(res.stored.items())))
    for key, text in (("slow_jpegs", "JPEGs need the slower fallback decoder (simplejpeg refuses "
                       "them; Pillow reads them)"),
                      ("channels_dropped", "images had alpha or extra channels dropped "
                       "(--extra-channels drop)"),
                      ("empty_classes", "classes have no samples")):
        names = getattr(res, key)
        if names:
            print(f"  {len(names)} {text}: " + ", ".join(names[:5])
                  + (" ..." if len(names) > 5 else ""))
    for f in res.ignored_files[:10]:
        print(f"  not taken {f['path']}: {f['reason']}")
    if len(res.ignored_files) > 10:
        print(f"  ... and {len(res.ignored_files) - 10} more not taken (all listed in the "
              "manifest)")


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
        out.append(user_target(name.strip(), ref.strip()))
    return out


def cmd_info(args: argparse.Namespace) -> int:
    m = Manifest.read(args.path)
    if args.json:
        print(json.dumps(m.to_json(), indent=1))
        return 0
    total = sum(f.size for f in m.files)
    print(f"{args.path}: {m.format} (format v{m.format_version}), {m.num_samples} samples, "
          f"{len(m.files)} files, {_human(total)}")
    if m.format_version < 2:
        print("record checksums: none (format v1); re-convert to add a crc32 per record, "
              "checked on every read")
    print("fields: " + ", ".join(
        f"{f.name} ({', '.join(f'{k}={v}' for k, v in f.to_json().items() if k != 'name')})"
        for f in m.schema))
    if m.classes:
        shown = ", ".join(m.classes[:10]) + (" ..." if len(m.classes) > 10 else "")
        print(f"classes ({len(m.classes)}): {shown}")
    for f in m.schema:
        if isinstance(f, MaskField):
            print(f"mask: {f.codec}, {np.dtype(f.dtype)}, {f.num_classes} classes")
        elif isinstance(f, TargetField):
            store = np.dtype(f.dtype).name + (f" (value = stored x {f.scale:.6g} + {f.offset:g})"
                                              if f.quantized else "")
            params = ", ".join(f"{k}={v}" for k, v in f.params if k != "dtype")
            print(f"target {f.name}: {f.target}({params}); stored {store}; resampled "
                  f"{f.interp}" + ("; values rescale with the geometry" if f.rescale == "distance"
                                   else ""))
    lists = ("ignored", "jpegs_needing_fallback_decoder", "channels_dropped", "empty_classes")
    skip = ("targets", "masks_without_images", *lists)
    conv = {k: v for k, v in m.conversion.items() if v not in (None, "", 0, 0.0, False)
            and k not in skip}
    print("conversion: " + ", ".join(f"{k}={v}" for k, v in conv.items()))
    if m.conversion.get("masks_without_images"):
        print(f"masks without an image: {len(m.conversion['masks_without_images'])}")
    for key in lists:
        if m.conversion.get(key):
            print(f"{key.replace('_', ' ')}: {len(m.conversion[key])} (listed by --json)")
    print(f"skipped inputs: {len(m.skipped)}")
    for s in m.skipped[:10]:
        print(f"  {s.get('path')}: {s.get('reason')}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify

    report = verify(args.path, decode=not args.no_decode)
    for line in report.notes:
        print(f"NOTE {line}")
    for line in report.problems:
        print(f"DAMAGED {line}")
    status = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"{args.path}: checked {report.files_checked} files and {report.records_checked} "
          f"records: {status}")
    return 0 if report.ok else 1


def _demo(out: Path, images: int) -> int:
    from .demo import run_demo

    run_demo(out, images)
    return 0


CORE_COMMANDS = frozenset({"convert", "info", "verify", "demo", "decoders"})


def build_parser(core_only: bool = False) -> argparse.ArgumentParser:
    """The whole CLI; ``core_only`` leaves out bench, doctor, monitor and tune, whose modules
    import torch (1-2 s), so a conversion starts without it."""
    p = argparse.ArgumentParser(prog="feedpipe", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of every error (and log at INFO level)")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="pack images into LMDB, HDF5 or WebDataset shards")
    c.add_argument("src", help="image folder, ImageFolder tree, or .csv/.jsonl manifest")
    c.add_argument("--to", required=True, choices=["lmdb", "hdf5", "wds"])
    c.add_argument("-o", "--out", required=True, type=Path)
    c.add_argument("--workers", type=int, default=None, help="processes (default: usable cores)")
    c.add_argument("--store", default="passthrough", choices=["passthrough", "reencode", "raw"],
                   help="passthrough keeps JPEG bytes unchanged; raw stores decoded uint8 RGB")
    c.add_argument("--resize", help="shorter side (256) or WxH (320x240); raw crops to square")
    c.add_argument("--codec", default="auto", choices=["auto", "jpeg", "png", "webp"],
                   help="auto (default): JPEG and lossy WebP kept as they are, PNG stored "
                   "unchanged, other lossless formats (TIFF, BMP, PNM, lossless WebP, JPEG 2000) "
                   "as lossless PNG; jpeg/png/webp: re-encode everything else to that codec")
    c.add_argument("--quality", type=int, default=90, help="for lossy (re-)encoding only")
    c.add_argument("--extra-channels", default="refuse", choices=["refuse", "drop"],
                   help="images with transparent alpha, channels beyond RGB or 16-bit RGB: "
                   "refuse (skip, by name; default) or drop what 8-bit RGB cannot hold")
    c.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="refuse images declaring more pixels (decompression bombs; default "
                   f"{DEFAULT_MAX_PIXELS:,})")
    c.add_argument("--layout", default="auto", choices=["auto", "imagefolder", "flat"],
                   help="auto: an ImageFolder tree when a sub-folder holds images (class folders "
                   "win; top-level images are skipped by name), else a flat folder")
    c.add_argument("--check", default="header", choices=["header", "decode"],
                   help="header: markers + end-of-image (fast); decode: full decode")
    c.add_argument("--strict", action="store_true", help="fail on the first bad or refused "
                   "input, and on a class left with no samples")
    c.add_argument("--val-fraction", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--overwrite", action="store_true")
    c.add_argument("--shard-size", default="256MB", type=size_arg,
                   help="wds: max bytes per shard")
    c.add_argument("--shard-count", type=int, default=10_000, help="wds: max samples per shard")
    c.add_argument("--compression", choices=["lzf", "gzip"], help="hdf5 chunk compression")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    g = c.add_argument_group("segmentation masks and targets")
    g.add_argument("--masks", type=Path, help="mask folder, matched to images by file name")
    g.add_argument("--mask-store", default="raw", choices=["png", "raw"],
                   help="lossless mask storage: raw (default, no decode when loading) or png "
                   "(smaller, ~0.4 ms to decode a 500x375 mask)")
    g.add_argument("--mask-dtype", default="uint8", choices=["uint8", "uint16"])
    g.add_argument("--num-classes", type=int, help="classes in the masks (default: max index+1)")
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
    g.add_argument("--distance-dtype", default="float16", choices=["float16", "uint8", "uint16"],
                   help="storage; uint8/uint16 need --distance-truncate or --distance-normalize")
    g.add_argument("--boundary-width", type=float, default=1.0)
    c.set_defaults(func=cmd_convert)

    i = sub.add_parser("info", help="print a dataset's manifest summary")
    i.add_argument("path", type=Path)
    i.add_argument("--json", action="store_true", help="print the whole manifest")
    i.set_defaults(func=cmd_info)

    v = sub.add_parser("verify", help="re-read every record; non-zero exit on damage")
    v.add_argument("path", type=Path)
    v.add_argument("--no-decode", action="store_true", help="skip decoding images")
    v.set_defaults(func=cmd_verify)

    m = sub.add_parser("demo", help="pack generated sample photos in every format and load them")
    m.add_argument("--out", type=Path, default=Path("demo-data"))
    m.add_argument("--images", type=int, default=600)
    m.set_defaults(func=lambda a: _demo(a.out, a.images))

    d = sub.add_parser("decoders", help="print which image decoders are active")
    d.set_defaults(func=lambda a: print(json.dumps(decoder_info(), indent=1)) or 0)
    if core_only:
        return p
    from . import bench, doctor, monitor
    monitor.register(sub)
    bench.register(sub)
    doctor.register(sub)
    from . import tune
    tune.register(sub)
    return p


_PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
                PermissionError)


def _user_error(exc: BaseException) -> bool:
    """Errors shown as one line: feedpipe's own, and OS errors about a named path. Anything else
    is a bug and keeps its traceback."""
    return isinstance(exc, FeedpipeError) or (isinstance(exc, OSError) and (
        exc.filename is not None or isinstance(exc, _PATH_ERRORS)))


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def speak_cli(message: str, option: str | None, parser: argparse.ArgumentParser) -> str:
    """A ConfigError's message in the command's terms: ``size=0`` becomes ``--size 0`` and
    ``size=(H, W)`` becomes ``--size HxW`` for every option the command has a flag for."""
    flags = {a.dest: next((s for s in a.option_strings if s.startswith("--")),
                          a.option_strings[0]) for a in parser._actions if a.option_strings}
    for name in {option, *re.findall(r"\b([a-z_]+)=", message)} - {None}:
        flag = flags.get(name) or flags.get(name.rstrip("s"))  # batch_sizes -> --batch-size
        if flag is None:
            continue
        if flag in message:  # the message names the flag already: drop the Python spelling
            message = re.sub(rf"\b{name}=('[^']*'|\S+?)(?=[:,;]|\s)( \({flag}\))?",
                             lambda m: f"{flag} {m[1].strip(chr(39))}", message)
            continue
        message = re.sub(rf"\b{name}=\(H, W\)", f"{flag} HxW", message)
        message = re.sub(rf"\b{name}='([^']*)'", rf"{flag} \1", message)
        message = re.sub(rf"\b{name}=", f"{flag} ", message)
    return message


def _broken_pipe() -> int:
    """The reader of stdout went away (``feedpipe info X | head``): stop quietly. stdout is
    pointed at /dev/null so the interpreter's final flush cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the closed pipe


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(core_only=command in CORE_COMMANDS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler, not at exit
        return code
    except BrokenPipeError:
        return _broken_pipe()
    except KeyboardInterrupt:
        print("interrupted; nothing was left that reads as a dataset", file=sys.stderr)
        return 130
    except Exception as exc:
        if not _user_error(exc):
            raise  # a bug: keep the traceback
        if args.debug:
            traceback.print_exc()
        message = str(exc)
        if isinstance(exc, ConfigError):
            message = speak_cli(message, exc.option, _subparser(parser, args.command))
        print(f"feedpipe {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
