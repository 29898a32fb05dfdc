"""The packer for sources whose samples arrive as bytes in memory, not as image files: foreign
WebDataset shards (:mod:`converters.foreign_wds`), Hugging Face datasets (:mod:`converters.hf`)
and arrays or tables without images (:mod:`converters.arrays`).

Each source yields :class:`Record` objects; images go through the same
:func:`~converters.images.store_image` as files do (lossless in, lossless out), every other value
is stored as given, and :func:`converters.convert` packs them with the one packer of every source
(:mod:`converters.packer`: atomic, locked, the partial removed on any failure, a local folder or
an object-store URL). Records that cannot be stored are skipped and named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from feedpipe.schema.fields import Field, ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema

from .images import Refused, planned_codec, store_image
from .options import PackOptions
from .output import check_not_source, is_remote
from .packer import PackTarget, Progress, Sample, split_indices, write_samples
from .report import jpeg_account, settle_codec
from .result import ConvertResult
from .sources import Source

__all__ = ["Progress", "Record", "RecordSource", "field_name", "pack_record_source"]


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


def pack_record_source(src: RecordSource, target: PackTarget, opts: PackOptions,
                       val_fraction: float, seed: int) -> ConvertResult:
    """Write every record of ``src`` (with ``val_fraction``: into ``train`` and ``val``) through
    :func:`~converters.packer.write_samples`; :func:`converters.convert` calls it."""
    codec = "mixed"
    if target.to == "wds" and src.images:  # member names carry the codec: decide it first
        codecs = {planned_codec(r.image, opts) for r in src.records()
                  if r.problem is None and r.image}
        codecs.discard("unknown")
        codec = codecs.pop() if len(codecs) == 1 else "mixed"
    fields: list[Field] = [*src.fields]
    if src.images:
        fields = [ImageField("image", codec, opts.raw_shape),
                  *([LabelField("label")] if src.labeled else []), *fields, JsonField("path")]
    schema = Schema(tuple(fields))
    if not is_remote(target.out):
        for root in src.roots[1:]:
            check_not_source(Source(root, src.kind, ()), Path(target.out))
    val = split_indices(src.count, val_fraction, seed) if val_fraction else None
    result = ConvertResult(target.out, ignored=len(src.not_taken),
                           ignored_files=list(src.not_taken), image_codec=codec)

    def samples() -> Iterator[Sample]:
        for k, rec in enumerate(src.records()):
            split = "" if val is None else ("val" if k < len(val) and val[k] else "train")
            if rec.problem is not None:
                yield Sample(rec.name, split, None, rec.problem)
            elif not src.images:
                result.bytes_in += sum(getattr(v, "nbytes", 0) for v in rec.values.values())
                yield Sample(rec.name, split, rec.values)
            else:
                yield _image_sample(rec, split, result, opts, src.labeled, codec)

    def finish(skipped: dict[str, list[dict[str, str]]]) -> tuple[dict[str, Any], Schema]:
        conversion = {"source": ", ".join(map(str, src.roots)), "source_kind": src.kind,
                      "inputs": src.count, "val_fraction": val_fraction, "seed": seed,
                      "ignored": result.ignored_files}
        if src.images:
            conversion.update({"store": opts.store, "codec": opts.codec, "jpeg": opts.jpeg,
                               "stored": result.stored,
                               "jpegs_needing_fallback_decoder": result.slow_jpegs,
                               "channels_dropped": result.channels_dropped,
                               **jpeg_account(result)})
        conversion.update(src.conversion)
        settled = settle_codec(schema, result) if target.to != "wds" and src.images else schema
        return conversion, settled

    def why(skipped: list[dict[str, str]]) -> str:
        return "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:3]) \
            or "the source holds no samples"

    target.skip_bad_values = True
    return write_samples(
        target, result, claim=Source(src.roots[0], src.kind, ()) if src.roots else None,
        split_names=["train", "val"] if val is not None else [""], schema=schema,
        classes=src.classes, samples=samples(), total=src.count, finish=finish,
        where=str(src.roots[0] if src.roots else src.kind), why_empty=why)


def _image_sample(rec: Record, split: str, result: ConvertResult, opts: PackOptions,
                  labeled: bool, codec: str) -> Sample:
    """One record's image stored (:func:`store_image`) with its values, or the skip reason."""
    if not rec.image:
        return Sample(rec.name, split, None, "no image")
    result.bytes_in += len(rec.image)
    try:
        stored = store_image(rec.image, opts)
    except Refused as exc:
        return Sample(rec.name, split, None, str(exc))
    if codec not in ("mixed", stored.codec):
        return Sample(rec.name, split, None,
                      f"stored as {stored.codec}, the dataset's images are {codec}")
    values = {"image": stored.value, **rec.values, "path": rec.name}
    if labeled:
        values["label"] = rec.label
    return Sample(rec.name, split, values, stored=stored)


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
