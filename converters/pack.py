"""The parallel, atomic packer behind ``feedpipe convert``.

Workers prepare samples (read, check, optionally decode/resize/re-encode); the main process writes
them in source order, so the output is the same whatever the worker count. Everything is written to
``.<out>.partial`` and renamed into place after the manifest, so an interrupted run leaves nothing
that reads as a dataset, and a re-run clears the leftover by itself.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np
from PIL import Image, UnidentifiedImageError

from feedpipe.codecs import jpeg_complete, jpeg_info
from feedpipe.errors import BadInputError, ConfigError
from feedpipe.formats import WRITERS
from feedpipe.imaging import decode_rgb, encode_rgb, pil_to_rgb
from feedpipe.manifest import FileEntry, Manifest
from feedpipe.schema import Field, ImageField, JsonField, LabelField, Schema

from .sources import Source, SourceItem, scan

Store = Literal["passthrough", "reencode", "raw"]
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class PackOptions:
    """How each image is stored; validated up front by :func:`convert`."""

    store: Store = "passthrough"
    resize: tuple[int, int] | int | None = None
    codec: Literal["jpeg", "png", "webp"] = "jpeg"
    quality: int = 90
    check: Literal["header", "decode"] = "header"

    def __post_init__(self) -> None:
        if self.store not in ("passthrough", "reencode", "raw"):
            raise ConfigError(f"store={self.store!r}: use 'passthrough', 'reencode' or 'raw'")
        if self.codec not in ("jpeg", "png", "webp"):
            raise ConfigError(f"codec={self.codec!r}: use 'jpeg', 'png' or 'webp'")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality={self.quality}: use an integer in 1..100")
        if self.check not in ("header", "decode"):
            raise ConfigError(f"check={self.check!r}: use 'header' or 'decode'")
        if self.store == "raw" and self.resize is None:
            raise ConfigError("store='raw' needs a fixed size: pass resize=224 (shorter side then "
                              "center crop) or resize=(W, H)")
        sizes = [self.resize] if isinstance(self.resize, int) else list(self.resize or [])
        if any(int(s) <= 0 for s in sizes):
            raise ConfigError(f"resize={self.resize!r}: sizes must be positive")

    @property
    def raw_shape(self) -> tuple[int, int, int] | None:
        if self.store != "raw":
            return None
        w, h = (self.resize, self.resize) if isinstance(self.resize, int) else self.resize
        return (int(h), int(w), 3)


def parse_resize(text: str | None) -> tuple[int, int] | int | None:
    """'256' → 256 (shorter side); '320x240' → (320, 240) (width × height)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX×]\s*(\d+))?\s*", text)
    if not m:
        raise ConfigError(f"--resize {text!r}: use a shorter-side length like 256 or WxH like 320x240")
    return (int(m[1]), int(m[2])) if m[2] else int(m[1])


@dataclass
class ConvertResult:
    """What a conversion did, for the CLI summary and for callers."""

    out: Path
    written: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    passthrough: int = 0
    reencoded: int = 0
    ignored: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    splits: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return (self.written + len(self.skipped)) / self.seconds if self.seconds else 0.0


# --- per-image work (runs in worker processes) --------------------------------------------------

def _resized(img: Image.Image, opts: PackOptions) -> np.ndarray:
    arr = pil_to_rgb(img)
    if opts.resize is None:
        return arr
    h, w = arr.shape[:2]
    im = Image.fromarray(arr)
    if isinstance(opts.resize, tuple):
        return np.asarray(im.resize(opts.resize, Image.BILINEAR))
    s = opts.resize
    scale = s / min(w, h)
    nw, nh = max(s, round(w * scale)), max(s, round(h * scale))
    if opts.store == "raw":  # fixed size: shorter side to s, then the center s×s crop
        left, top = (w - min(w, h)) / 2, (h - min(w, h)) / 2
        return np.asarray(im.resize((s, s), Image.BILINEAR,
                                    box=(left, top, left + min(w, h), top + min(w, h))))
    return np.asarray(im.resize((nw, nh), Image.BILINEAR))


def prepare(item: SourceItem, opts: PackOptions) -> tuple[dict[str, Any] | None, str, int]:
    """Read and check one image; returns (stored values or None, reason or how, input bytes)."""
    try:
        data = item.path.read_bytes()
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}", 0
    if not data:
        return None, "empty file", 0
    passthrough = opts.store == "passthrough" and opts.resize is None and opts.codec == "jpeg"
    info = jpeg_info(data) if passthrough else None
    # plain RGB/grayscale JPEGs in upright orientation are stored byte for byte
    if info is not None and info[2] in (1, 3) and info[3] in (0, 1):
        if not jpeg_complete(data):
            return None, "truncated JPEG (no end-of-image marker)", len(data)
        if opts.check == "decode":
            try:
                decode_rgb(data, "jpeg")
            except BadInputError as exc:
                return None, f"corrupt image: {exc.__cause__ or exc}", len(data)
        return {"image": data}, "passthrough", len(data)
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            arr = _resized(img, opts)
    except UnidentifiedImageError:
        return None, "not an image (unrecognized format)", len(data)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return None, f"corrupt image: {exc}", len(data)
    if opts.store == "raw":
        return {"image": np.ascontiguousarray(arr)}, "raw", len(data)
    return {"image": encode_rgb(arr, opts.codec, opts.quality)}, "reencoded", len(data)


def _prepare_star(args: tuple[SourceItem, PackOptions]) -> tuple[dict[str, Any] | None, str, int]:
    return prepare(*args)


def _worker_init() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"


# --- orchestration ------------------------------------------------------------------------------

def build_schema(source: Source, opts: PackOptions) -> Schema:
    """image (+ label for labeled sources) + path (+ meta for manifest extras)."""
    codec = "raw" if opts.store == "raw" else opts.codec
    fields: list[Field] = [ImageField("image", codec, opts.raw_shape)]
    if source.labeled:
        fields.append(LabelField("label"))
    fields.append(JsonField("path"))
    if source.has_extra:
        fields.append(JsonField("meta"))
    return Schema(tuple(fields))


def split_indices(n: int, val_fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of validation items: a seeded permutation, deterministic for (n, seed)."""
    mask = np.zeros(n, dtype=bool)
    k = round(n * val_fraction)
    mask[np.random.default_rng(seed).permutation(n)[:k]] = True
    return mask


def _results(items: list[SourceItem], opts: PackOptions, workers: int
             ) -> Iterator[tuple[dict[str, Any] | None, str, int]]:
    # Passthrough with header checks is I/O-bound (~6000 images/s in one process here); shipping
    # the bytes through worker pipes costs more than it saves, so only decoding work fans out.
    decodes = opts.store != "passthrough" or opts.resize is not None or opts.codec != "jpeg" \
        or opts.check == "decode"
    if workers <= 1 or len(items) < 64 or not decodes:
        yield from (prepare(it, opts) for it in items)
        return
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_worker_init) as pool:
        chunk = max(1, min(64, len(items) // (workers * 8)))
        yield from pool.imap(_prepare_star, ((it, opts) for it in items), chunksize=chunk)


def convert(src: str | Path | Source, out: str | Path, *, to: str, workers: int | None = None,
            store: Store = "passthrough", resize: tuple[int, int] | int | None = None,
            codec: Literal["jpeg", "png", "webp"] = "jpeg", quality: int = 90,
            check: Literal["header", "decode"] = "header", strict: bool = False,
            val_fraction: float = 0.0, seed: int = 0, overwrite: bool = False,
            writer_options: dict[str, Any] | None = None,
            progress: Progress | None = None) -> ConvertResult:
    """Pack a source (folder, ImageFolder tree or CSV/JSONL manifest) into ``out`` as ``to``.

    Bad inputs are skipped and listed (``strict=True`` raises on the first). With
    ``val_fraction`` > 0, ``out/train`` and ``out/val`` are written from a seeded split.
    """
    t0 = time.perf_counter()
    if to not in WRITERS:
        raise ConfigError(f"to={to!r}: use one of {sorted(WRITERS)}")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction={val_fraction}: use a fraction in [0, 1)")
    opts = PackOptions(store, resize, codec, quality, check)
    workers = workers if workers is not None else len(os.sched_getaffinity(0))
    if workers < 0:
        raise ConfigError(f"workers={workers}: use 0 or 1 for in-process, or a positive count")
    source = src if isinstance(src, Source) else scan(src)
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    tmp = out.parent / f".{out.name}.partial"
    if tmp.exists():  # left by an interrupted run
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)

    schema = build_schema(source, opts)
    items = list(source.items)
    val_mask = split_indices(len(items), val_fraction, seed) if val_fraction else None
    splits = {"train": tmp / "train", "val": tmp / "val"} if val_mask is not None else {"": tmp}
    writers = {name: WRITERS[to](path, schema, **(writer_options or {}))
               for name, path in splits.items()}
    skipped: dict[str, list[dict[str, str]]] = {name: [] for name in splits}
    labeled, has_extra = source.labeled, source.has_extra
    result = ConvertResult(out, ignored=len(source.ignored))
    try:
        for k, (values, how, nbytes) in enumerate(_results(items, opts, workers)):
            item = items[k]
            split = "" if val_mask is None else ("val" if val_mask[k] else "train")
            result.bytes_in += nbytes
            if values is None:
                if strict:
                    raise BadInputError(f"{item.path}: {how}")
                skipped[split].append({"path": item.rel, "reason": how})
            else:
                if labeled:
                    values["label"] = item.label
                values["path"] = item.rel
                if has_extra:
                    values["meta"] = item.extra or {}
                writers[split].write(values)
                result.passthrough += how == "passthrough"
                result.reencoded += how != "passthrough"
            if progress is not None:
                progress(k + 1, len(items))
        conversion = {"source": str(source.root), "source_kind": source.kind,
                      "inputs": len(items), "ignored_non_images": len(source.ignored),
                      "val_fraction": val_fraction, "seed": seed, **asdict(opts)}
        for name, writer in writers.items():
            files, extra = writer.close()
            root = splits[name]
            Manifest(to, writer.count, schema, source.classes,
                     tuple(FileEntry.of(root, f) for f in files),
                     {**conversion, "split": name or None}, tuple(skipped[name]), extra
                     ).write(root)
            result.splits[name or "all"] = writer.count
            result.written += writer.count
            result.bytes_out += sum((root / f).stat().st_size for f in files)
        result.skipped = [s for name in splits for s in skipped[name]]
    except BaseException:
        for writer in writers.values():
            try:
                writer.close()
            except Exception:  # the original error matters more than a failed cleanup
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(tmp)
    if out.exists():
        old = out.parent / f".{out.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old)
    else:
        os.rename(tmp, out)
    _fsync_dir(out.parent)
    result.seconds = time.perf_counter() - t0
    return result


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
