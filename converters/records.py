"""The packer for sources whose samples arrive as bytes in memory, not as image files: foreign
WebDataset shards (:mod:`converters.foreign_wds`), Hugging Face datasets (:mod:`converters.hf`)
and arrays or tables without images (:mod:`converters.arrays`).

Each source yields :class:`Record` objects; images go through the same
:func:`~converters.images.store_image` as files do (lossless in, lossless out), every other value
is stored as given, and the output is claimed, written and swapped in by
:class:`~converters.output.Output` exactly as :func:`converters.convert` does (atomic, locked, the
partial removed on any failure). Records that cannot be stored are skipped and named.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.dataset.registry import WRITERS, DatasetWriter
from feedpipe.errors import BadInputError, ConfigError, NothingConvertedError
from feedpipe.schema.fields import Field, ImageField, JsonField, LabelField
from feedpipe.schema.imaging import sniff_codec, webp_lossless
from feedpipe.schema.model import Schema

from .images import Refused, output_codec, store_image
from .options import Format, PackOptions
from .output import Output, abandon, check_not_source
from .pack import ConvertResult, split_indices
from .report import jpeg_account, settle_codec, tally
from .sources import Source

Progress = Callable[[int, int], None]


@dataclass
class Record:
    """One sample from an in-memory source: a display name (``shard.tar/key``, ``train[17]``),
    the encoded image, the label (-1: none), other stored values by field name, and a reason
    when it cannot be stored (it is then skipped and named)."""

    name: str
    image: bytes | None = None
    label: int = -1
    values: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


@dataclass(frozen=True)
class RecordSource:
    """What a record source knows before packing: its roots (the output may not lie inside
    them), the extra fields, class names, files or members not taken, and how to (re)iterate."""

    roots: tuple[Path, ...]
    kind: str
    fields: tuple[Field, ...]
    classes: tuple[str, ...]
    labeled: bool
    count: int
    records: Callable[[], Iterator[Record]]
    not_taken: tuple[dict[str, str], ...] = ()
    conversion: dict[str, Any] = field(default_factory=dict)
    images: bool = True  # False: samples are ``values`` only (arrays), stored as given


def planned_codec(data: bytes, opts: PackOptions) -> str:
    """The codec an encoded image will be stored as (what :func:`store_image` decides)."""
    if opts.store == "raw":
        return "raw"
    kind = sniff_codec(data)
    return output_codec(kind, kind == "webp" and webp_lossless(data), opts)


def pack_records(src: RecordSource, out: str | Path, *, to: Format, options: PackOptions,
                 strict: bool = False, overwrite: bool = False, val_fraction: float = 0.0,
                 seed: int = 0, writer_options: dict[str, Any] | None = None,
                 progress: Progress | None = None) -> ConvertResult:
    """Write every record of ``src`` to ``out`` as ``to`` (with ``val_fraction``: ``out/train``
    and ``out/val``); skipped records are listed in the result and the manifest."""
    t0 = time.perf_counter()
    if to not in WRITERS:
        raise ConfigError(f"to={to!r}: use one of {sorted(WRITERS)}", option="to")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction={val_fraction}: use a fraction in [0, 1)",
                          option="val_fraction")
    codec = "mixed"
    if to == "wds" and src.images:  # member names carry the codec: decide it first (cheap)
        codecs = {planned_codec(r.image, options) for r in src.records()
                  if r.problem is None and r.image}
        codecs.discard("unknown")
        codec = codecs.pop() if len(codecs) == 1 else "mixed"
    fields: list[Field] = [*src.fields]
    if src.images:
        fields = [ImageField("image", codec, options.raw_shape),
                  *([LabelField("label")] if src.labeled else []), *fields, JsonField("path")]
    schema = Schema(tuple(fields))
    out = Path(out)
    output = Output(out, overwrite)
    for root in src.roots[1:]:
        check_not_source(Source(root, src.kind, ()), out)
    tmp = output.claim(Source(src.roots[0], src.kind, ()) if src.roots else None)
    val = split_indices(src.count, val_fraction, seed) if val_fraction else None
    splits = {"train": tmp / "train", "val": tmp / "val"} if val is not None else {"": tmp}
    writers: dict[str, DatasetWriter] = {}
    skipped: dict[str, list[dict[str, str]]] = {name: [] for name in splits}
    result = ConvertResult(out, ignored=len(src.not_taken), ignored_files=list(src.not_taken),
                           image_codec=codec)
    try:
        writers = {n: WRITERS[to](p, schema, **(writer_options or {})) for n, p in splits.items()}
        for k, rec in enumerate(src.records()):
            split = "" if val is None else ("val" if k < len(val) and val[k] else "train")
            why = rec.problem or (
                _store(rec, writers[split], result, options, src.labeled, codec) if src.images
                else _put(rec, writers[split], result))
            if why is not None:
                if strict:
                    raise BadInputError(f"{rec.name}: {why}")
                skipped[split].append({"path": rec.name, "reason": why})
            if progress is not None:
                progress(k + 1, src.count)
        counts = {n: w.count for n, w in writers.items()}
        if not all(counts.values()):
            gone = [s for v in skipped.values() for s in v]
            where = src.roots[0] if src.roots else src.kind
            raise NothingConvertedError(
                f"{where}: wrote 0 samples" + (" to a split" if sum(counts.values()) else "")
                + ": " + ("; ".join(f"{s['path']}: {s['reason']}" for s in gone[:3])
                          or "the source holds no samples"))
        conversion = {"source": ", ".join(map(str, src.roots)), "source_kind": src.kind,
                      "inputs": src.count, "val_fraction": val_fraction, "seed": seed,
                      "ignored": result.ignored_files}
        if src.images:
            conversion.update({"store": options.store, "codec": options.codec,
                               "jpeg": options.jpeg, "stored": result.stored,
                               "jpegs_needing_fallback_decoder": result.slow_jpegs,
                               "channels_dropped": result.channels_dropped,
                               **jpeg_account(result)})
        conversion.update(src.conversion)
        if to != "wds" and src.images:
            schema = settle_codec(schema, result)
        for name, writer in writers.items():
            files, extra = writer.close()
            root = splits[name]
            Manifest(to, writer.count, schema, src.classes,
                     tuple(FileEntry.of(root, f) for f in files),
                     {**conversion, "split": name or None}, tuple(skipped[name]), extra
                     ).write(root)
            result.splits[name or "all"] = writer.count
            result.written += writer.count
            result.bytes_out += sum((root / f).stat().st_size for f in files)
        result.skipped = [s for name in splits for s in skipped[name]]
    except BaseException as exc:
        abandon(exc, writers.values(), output, out, tmp)
    output.commit()
    result.seconds = time.perf_counter() - t0
    return result


def _store(rec: Record, writer: DatasetWriter, result: ConvertResult, opts: PackOptions,
           labeled: bool, codec: str) -> str | None:
    """Store one record's image and write it; the reason it was skipped, or None."""
    if not rec.image:
        return "no image"
    result.bytes_in += len(rec.image)
    try:
        stored = store_image(rec.image, opts)
    except Refused as exc:
        return str(exc)
    if codec not in ("mixed", stored.codec):
        return f"stored as {stored.codec}, the dataset's images are {codec}"
    values = {"image": stored.value, **rec.values, "path": rec.name}
    if labeled:
        values["label"] = rec.label
    try:
        writer.write(values)
    except (TypeError, ValueError) as exc:  # a value the field cannot hold: name the record
        return f"cannot store: {exc}"
    tally(result, stored, rec.name)
    return None


def _put(rec: Record, writer: DatasetWriter, result: ConvertResult) -> str | None:
    """Write an image-less record's values as given; the reason it was skipped, or None."""
    try:
        writer.write(rec.values)
    except (TypeError, ValueError) as exc:  # a value the field cannot hold: name the record
        return f"cannot store: {exc}"
    result.bytes_in += sum(getattr(v, "nbytes", 0) for v in rec.values.values())
    return None


def field_name(suffix: str, taken: Sequence[str]) -> str:
    """A field name (an identifier) for a member suffix or column name: ``seg.png`` →
    ``seg_png``; one already ``taken`` gets ``_2``, ``_3``..."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in suffix) or "field"
    if name[0].isdigit():
        name = "f_" + name
    if name in ("image", "label", "path"):
        name += "_"
    base, n = name, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name
