"""The parallel, atomic packer behind ``feedpipe convert``: :func:`convert` of image files and of
record sources. Workers prepare the images (:mod:`converters.worker`); the main process writes
them in source order (:mod:`converters.packer`), so the output does not depend on the worker
count."""

from __future__ import annotations

import inspect
import logging
from dataclasses import fields as dc_fields
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from feedpipe.dataset.manifest import refuse_url
from feedpipe.errors import BadInputError, ConfigError
from feedpipe.schema.fields import Field, ImageField, JsonField, LabelField
from feedpipe.schema.imaging import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_PIXELS_PER_BYTE,
    DEFAULT_MAX_SCANS,
)
from feedpipe.schema.masks import MaskField
from feedpipe.schema.model import Schema
from feedpipe.system import usable_cores

from .coco import scan_coco
from .columns import KeypointCheck, LabelColumns, apply_columns
from .images import image_codec, likely_jpeg, planned_codec, store_image
from .options import (
    Check,
    Codec,
    ExtraChannels,
    Format,
    JpegStore,
    LabelsAs,
    Layout,
    MaskDtype,
    MaskStore,
    PackOptions,
    Store,
    Unlabeled,
    resolve_targets,
)
from .packer import PackTarget, Progress, Sample, is_remote, split_indices, why_empty, write_samples
from .palette import resolve_palette
from .parts import Part, plan_part
from .records import RecordSource
from .result import ConvertResult, Refused
from .sources import Source, attach_masks, scan
from .split_root import SplitClasses, SplitRoot, scan_split_root, split_of
from .swap import check_not_source
from .targets import Target
from .worker import INFO_KEY, MASK_MAX_KEY, results

__all__ = ["ConvertResult", "build_schema", "convert", "split_indices"]
log = logging.getLogger("feedpipe.convert")
#: the image options of every source, and the options of image files only
_IMAGE_OPTS = ("store", "resize", "codec", "quality", "check", "extra_channels", "max_pixels",
               "max_scans", "max_pixels_per_byte", "jpeg")
_FILES_ONLY = ("masks", "mask_store", "mask_dtype", "num_classes", "ignore_index", "targets",
               "mask_palette", "split_root", "split_classes", "coco", "columns", "part", "labels",
               "unlabeled", "layout", "contained")


def build_schema(opts: PackOptions, codec: str, labeled: bool, typed: Sequence[Field] = (),
                 split: bool = False, meta: bool = False) -> Schema:
    """image (+ label) (+ mask and targets) + typed fields + path (+ split) (+ meta)."""
    fields: list[Field] = [ImageField("image", codec, opts.raw_shape)]
    if labeled:
        fields.append(LabelField("label"))
    if opts.masks:
        hw = opts.raw_shape[:2] if opts.raw_shape else None
        fields.append(MaskField("mask", opts.mask_store, opts.mask_dtype, opts.num_classes, hw,
                                opts.ignore_index))
        for t in opts.targets:
            f = t.field()
            fields.append(f if hw is None else replace(f, shape=(*hw, *f.shape[2:])))
    fields.extend(typed)
    fields.append(JsonField("path"))
    if split:
        fields.append(JsonField("split"))
    if meta:
        fields.append(JsonField("meta"))
    return Schema(tuple(fields))


def convert(src: str | Path | Source | RecordSource, out: str | Path, *, to: Format,
            workers: int | None = None, store: Store = "passthrough",
            resize: int | tuple[int, int] | None = None, codec: Codec = "auto", quality: int = 90,
            check: Check = "decode", strict: bool = False,
            val_fraction: float = 0.0, seed: int = 0, overwrite: bool = False,
            writer_options: dict[str, Any] | None = None,
            progress: Progress | None = None, masks: str | Path | None = None,
            mask_store: MaskStore = "raw", mask_dtype: MaskDtype = "uint8",
            num_classes: int | None = None, ignore_index: int | None = None,
            targets: Sequence[str | Target] | Mapping[str, Any] | None = None,
            extra_channels: ExtraChannels = "refuse",
            max_pixels: int | None = DEFAULT_MAX_PIXELS,
            max_scans: int | None = DEFAULT_MAX_SCANS,
            max_pixels_per_byte: int | None = DEFAULT_MAX_PIXELS_PER_BYTE, layout: Layout = "auto",
            mask_palette: str | Path | None = None, split_root: SplitRoot | None = None,
            split_classes: SplitClasses = "agree", coco: str | Path | None = None,
            columns: LabelColumns | None = None,
            storage_options: Mapping[str, Any] | None = None,
            part: Part | None = None, labels: LabelsAs = "auto",
            unlabeled: Unlabeled = "refuse", jpeg: JpegStore = "baseline",
            contained: bool = False) -> ConvertResult:
    """Pack a source into ``out`` as ``to``, once: parallel, atomic (``.<out>.partial``, then
    one swap), lossless (docs/convert.md). ``feedpipe convert`` is this function.

    Bad inputs and files not taken are skipped and listed with the reason (``strict=True``
    raises instead). Every option after ``out`` is keyword-only and checked (a ``ConfigError``
    names it); those of image files only (masks, labels, part...) are refused for a record source.

    Args:
        src: A folder, an ImageFolder tree or a CSV/JSONL manifest of image files, or a
            ``RecordSource`` (foreign WebDataset shards, a Hugging Face dataset, arrays).
        out: The dataset folder to write, or a URL (``s3://bucket/ds``: staged locally,
            uploaded shard by shard, committed by its manifest, uploaded last).
        to: "lmdb", "hdf5" or "wds" (WebDataset).
        workers: Conversion processes; None: the usable cores.
        store: "passthrough" (encoded bytes kept), "reencode" or "raw" (decoded uint8 RGB).
        resize: An int is the shorter side (``store="raw"`` then crops the centre square); a
            tuple is (height, width), the order of ``make_loader(size=)``.
        codec: "auto" keeps lossless inputs lossless (JPEG and PNG byte for byte, other
            lossless formats as PNG); "jpeg", "png" or "webp" re-encode every other input.
        quality: For lossy (re-)encoding only.
        check: "decode" (every JPEG read whole, every scan at 1/8 scale: one cut short or
            damaged is refused by name) or "header" (markers and end of image only).
        strict: Raise on the first bad or refused input, and on a class left empty.
        val_fraction: > 0 writes ``out/train`` and ``out/val`` from a split seeded by ``seed``.
        seed: The split's seed.
        overwrite: Replace a dataset feedpipe wrote at ``out`` (nothing else).
        writer_options: The format's own (``shard_size``, ``shard_count``, ``compression``).
        progress: Called with (done, total) as samples are written.
        masks: A folder of segmentation masks matched to the images by file name (a manifest
            may give a ``mask`` column instead): a lossless ``mask`` field.
        mask_store: "raw" (no decode when loading) or "png" (smaller).
        mask_dtype: "uint8" or "uint16".
        num_classes: Classes in the masks; None: the largest index + 1 (not ``ignore_index``).
        ignore_index: A mask value of no class (e.g. 255, VOC's "void"): left out of
            ``num_classes``, background to the targets. A JPEG or lossy WebP mask is skipped.
        targets: Computed from each mask in the workers and stored as fields of their names:
            ``["distance_map", "boundary"]``, ``Target``s, or ``{"name": fn}``.
        extra_channels: Alpha, channels beyond RGB, 16-bit RGB: "refuse" (skip by name) or
            "drop" what 8-bit RGB cannot hold.
        max_pixels: Refuse images declaring more pixels (decompression bombs).
        layout: "auto" (an ImageFolder tree when a sub-folder holds images), "imagefolder" or
            "flat".
        mask_palette: Colour masks mapped to classes: "auto" or a palette JSON file.
        split_root: ``src`` holds train/val(/test) ImageFolder trees, written as one dataset
            each ("separate") or as one with a ``split`` field ("field").
        split_classes: A split root's class lists: "agree" (refuse differing ones) or "union".
        coco: A COCO ``instances.json`` whose images are in ``src``: boxes, categories,
            iscrowd.
        columns: A manifest's keypoints, boxes, text and array columns (``LabelColumns``).
        storage_options: For a URL ``out``'s fsspec filesystem (endpoint, credentials).
        part: Pack only this contiguous slice of the sorted sources into
            ``out/parts/part-IIIII-of-NNNNN``; ``feedpipe merge`` joins the parts.
        labels: A manifest's ``label`` column: "auto" (integers are indices, other values
            class names; a mix is refused), "ints" or "names".
        unlabeled: A labelled manifest's rows with an empty label: "refuse" or "keep" (-1).
        jpeg: Progressive JPEGs: "baseline" (the same DCT coefficients re-coded as baseline,
            checked per file; ~3× faster to decode) or "keep" (byte for byte).
        contained: Refuse, by name, every file a source names or links to outside its folder
            (for manifests from untrusted hands); by default files may lie anywhere.

    Returns:
        What was written, skipped and not taken, with the reasons.
    """
    args = dict(locals())  # the options by name, before any other local is made
    for where, what in ((src, "the source"), (out, "the output")):
        if not isinstance(where, (Source, RecordSource)) and \
                not (where is out and is_remote(out)):
            refuse_url(where, what)
    target = PackTarget(out, to, overwrite, storage_options, writer_options, strict, progress)
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction={val_fraction}: use a fraction in [0, 1)",
                          option="val_fraction")
    workers = workers if workers is not None else usable_cores()
    if workers < 0:
        raise ConfigError(f"workers={workers}: use 0 or 1 for in-process, or a positive count",
                          option="workers")
    image_opts = {k: args[k] for k in _IMAGE_OPTS}
    if isinstance(src, RecordSource):
        given = [k for k in _FILES_ONLY
                 if (bool(args[k]) if k == "targets" else args[k] != _DEFAULTS[k])]
        if given:
            flags = ", ".join(f"{k}= (--{k.replace('_', '-')})" for k in given)
            raise ConfigError(f"{flags}: for image folders and manifests, not for a {src.kind} "
                              "source", option=given[0])
        return _pack_records(src, target, PackOptions(**image_opts), val_fraction, seed)
    if not isinstance(contained, bool):
        raise ConfigError(f"contained={contained!r}: True or False", option="contained")
    options = PackOptions(**image_opts, mask_store=mask_store, mask_dtype=mask_dtype,
                          num_classes=num_classes, ignore_index=ignore_index,
                          targets=resolve_targets(targets))
    if coco is not None:
        source = scan_coco(src, coco, contained) if not isinstance(src, Source) else src
    else:
        source = src if isinstance(src, Source) else scan_split_root(
            src, split_root, split_classes, contained) \
            if split_root else scan(src, layout, labels, unlabeled, contained)
        source = apply_columns(source, columns) if source.kind == "manifest" or columns else source
    if (labels, unlabeled) != ("auto", "refuse") and source.kind != "manifest":
        raise ConfigError(f"labels={labels!r}, unlabeled={unlabeled!r}: these read a CSV/JSONL "
                          f"manifest's label column; {src} is a {source.kind} source",
                          option="labels")
    if source.split_by and val_fraction:
        raise ConfigError("val_fraction splits a dataset; a split root has its splits already")
    if masks is not None:
        source = attach_masks(source, masks)
    palette, left_out = resolve_palette(mask_palette, [i.mask for i in source.items if i.mask],
                                        options.max_pixels)
    for used, name, why in ((mask_palette is not None, "mask_palette", "maps colour masks"),
                            (options.ignore_index is not None, "ignore_index", "is a mask value"),
                            (options.targets, "targets", "are computed from masks")):
        if used and not source.masked:
            raise ConfigError(f"{name} {why}: pass masks=DIR (--masks) or a manifest with a "
                              "'mask' column", option=name)
    opts = replace(options, masks=source.masked, mask_palette=palette)
    if opts.resize is not None and any(f.kind in ("keypoints", "boxes") for f in source.typed):
        raise ConfigError("resize= with keypoints or boxes: their pixel coordinates refer to the "
                          "source images; convert without resize (the loader resizes both)",
                          option="resize")
    if target.strict and source.refused:
        raise BadInputError(f"{source.root / source.refused[0][0]}: {source.refused[0][1]}")
    info: dict[str, Any] = {"labels": labels} if source.kind == "manifest" else {}
    if source.masked:
        info["masks"] = str(masks) if masks is not None else "manifest column 'mask'"
    return _pack_files(source, target, opts, left_out, workers, val_fraction, seed, part, info)


_DEFAULTS = {k: v.default for k, v in inspect.signature(convert).parameters.items()}


def _pack_files(source: Source, target: PackTarget, opts: PackOptions,
                left_out: tuple[dict[str, Any], ...], workers: int, val_fraction: float,
                seed: int, part: Part | None, info: dict[str, Any]) -> ConvertResult:
    """:func:`convert` of a scanned source of image files; ``info``: entries for the manifest."""
    sniff = target.to == "wds"  # WebDataset member names carry the codec: it is decided first
    schema = build_schema(opts, image_codec(source.items, opts, sniff), source.labeled,
                          source.typed, source.split_by == "field", source.has_extra)
    codec = schema["image"].codec  # type: ignore[attr-defined]
    guess = "jpeg" if codec == "mixed" and not sniff and likely_jpeg(source.items) else codec
    items, part_info = list(source.items), None
    if part is not None:
        target.out, target.key0, stop, part_info = plan_part(
            part, source, target.out, target.to, opts, val_fraction, target.storage_options)
        items = items[target.key0:stop]
    val_mask = split_indices(len(items), val_fraction, seed) if val_fraction else None
    names = list(source.split_names) if source.split_by == "separate" else \
        ["train", "val"] if val_mask is not None else [""]
    result = ConvertResult(target.out, ignored=len(source.not_taken),
                           ignored_files=source.not_taken,
                           unmatched_masks=list(source.unmatched_masks), image_codec=codec,
                           mask_palette=opts.mask_palette, palette_left_out=list(left_out))
    mask_max = -1
    points = KeypointCheck(source.typed)
    labeled, has_extra = source.labeled, source.has_extra

    def samples() -> Iterator[Sample]:
        nonlocal mask_max
        for k, (values, how, nbytes) in enumerate(results(items, opts, workers, guess)):
            item = items[k]
            split = "" if val_mask is None else ("val" if val_mask[k] else "train")
            if source.split_by == "separate":
                split = split_of(item.rel)
            result.bytes_in += nbytes
            if values is not None and codec not in ("mixed", values[INFO_KEY].codec):
                values, how = None, f"changed while converting (now {values[INFO_KEY].codec})"
            if values is None:
                yield Sample(item.rel, split, None, how, shown=str(item.path))
                continue
            stored = values.pop(INFO_KEY)
            mask_max = max(mask_max, values.pop(MASK_MAX_KEY, -1))
            if labeled:
                values["label"] = item.label
            values["path"] = item.rel
            if source.split_by == "field":
                values["split"] = split_of(item.rel)
            values.update(item.fields or {})
            if points.fields:
                points.add(item.rel, values, stored.size)
            if has_extra:
                values["meta"] = item.extra or {}
            yield Sample(item.rel, split, values, stored=stored)

    def finish(skipped: dict[str, list[dict[str, str]]]) -> tuple[dict[str, Any], Schema]:
        gone = {s["path"] for v in skipped.values() for s in v}
        if labeled:  # COCO's classes name box categories, not sample labels
            have = {it.label for it in items if it.rel not in gone}
            result.empty_classes = [c for k, c in enumerate(source.classes) if k not in have]
            result.unlabeled = [it.rel for it in items if it.label < 0 and it.rel not in gone]
        if result.empty_classes and part_info is None:  # a part: the merge checks the classes
            msg = (f"{source.root}: class(es) with no samples: {', '.join(result.empty_classes)} "
                   "(their files were skipped or not images; see the manifest)")
            if target.strict:
                raise BadInputError(msg)
            log.warning(msg)
        conversion = {"source": str(source.root), "source_kind": source.kind,
                      "inputs": len(items), "ignored_non_images": len(source.ignored),
                      "val_fraction": val_fraction, "seed": seed,
                      **{f.name: getattr(opts, f.name) for f in dc_fields(opts)
                         if f.name != "targets"},
                      "targets": {t.name: {"target": t.spec or t.name, **t.params}
                                  for t in opts.targets},
                      **result.account(), "empty_classes": result.empty_classes,
                      "unlabeled": result.unlabeled,
                      **({"part": part_info} if part_info else {}), **info,
                      "contained": source.contained}
        settled = schema
        if source.masked:
            conversion["masks_without_images"] = list(source.unmatched_masks)
            conversion["mask_palette_left_out"] = result.palette_left_out
            if opts.num_classes is None and mask_max >= 0:  # record what the masks hold
                settled = Schema(tuple(replace(f, num_classes=mask_max + 1)
                                       if isinstance(f, MaskField) else f for f in settled))
        if not sniff:
            settled = settle_codec(settled, result)
        if points.fields:
            conversion["keypoint_warnings"] = points.warn(str(source.root))
        return conversion, settled

    return write_samples(target, result, claim=source, split_names=names, schema=schema,
                         classes=source.classes, samples=samples(), total=len(items),
                         finish=finish, where=str(source.root),
                         why_empty=lambda skipped: why_empty(source, skipped))


def _pack_records(src: RecordSource, target: PackTarget, opts: PackOptions,
                  val_fraction: float, seed: int) -> ConvertResult:
    """:func:`convert` of a record source (with ``val_fraction``: into ``train`` and ``val``)."""
    codec = "mixed"
    if target.to == "wds" and src.images:  # member names carry the codec: decide it first
        codecs = {planned_codec(r.image, opts) for r in src.records()
                  if r.problem is None and r.image}
        codecs.discard("unknown")
        codec = codecs.pop() if len(codecs) == 1 else "mixed"
    schema = build_schema(opts, codec, src.labeled, src.fields) if src.images else \
        Schema(src.fields)
    if not is_remote(target.out):
        for root in src.roots:
            check_not_source(Source(root, src.kind, ()), Path(target.out))
    val = split_indices(src.count, val_fraction, seed) if val_fraction else None
    result = ConvertResult(target.out, ignored=len(src.not_taken),
                           ignored_files=list(src.not_taken), image_codec=codec)

    def samples() -> Iterator[Sample]:
        for k, rec in enumerate(src.records()):
            split = "" if val is None else ("val" if k < len(val) and val[k] else "train")
            if rec.problem is not None or (src.images and not rec.image):
                yield Sample(rec.name, split, None, rec.problem or "no image")
                continue
            if not src.images:
                result.bytes_in += sum(getattr(v, "nbytes", 0) for v in rec.values.values())
                yield Sample(rec.name, split, rec.values)
                continue
            data = rec.image or b""
            result.bytes_in += len(data)
            try:
                stored = store_image(data, opts)
            except Refused as exc:
                yield Sample(rec.name, split, None, str(exc))
                continue
            if codec not in ("mixed", stored.codec):
                yield Sample(rec.name, split, None,
                             f"stored as {stored.codec}, the dataset's images are {codec}")
                continue
            values = {"image": stored.value, **rec.values, "path": rec.name}
            if src.labeled:
                values["label"] = rec.label
            yield Sample(rec.name, split, values, stored=stored)

    def finish(skipped: dict[str, list[dict[str, str]]]) -> tuple[dict[str, Any], Schema]:
        conversion = {"source": ", ".join(map(str, src.roots)), "source_kind": src.kind,
                      "inputs": src.count, "val_fraction": val_fraction, "seed": seed,
                      "ignored": result.ignored_files}
        if src.images:
            conversion.update({"store": opts.store, "codec": opts.codec, "jpeg": opts.jpeg,
                               **result.account()})
        conversion.update(src.conversion)
        settled = settle_codec(schema, result) if target.to != "wds" and src.images else schema
        return conversion, settled

    target.skip_bad_values = True
    return write_samples(
        target, result, claim=None, split_names=["train", "val"] if val is not None else [""],
        schema=schema, classes=src.classes, samples=samples(), total=src.count, finish=finish,
        where=str(src.roots[0] if src.roots else src.kind),
        why_empty=lambda skipped: "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:3])
        or "the source holds no samples")


def settle_codec(schema: Schema, result: ConvertResult) -> Schema:
    """Narrow a provisional "mixed" image codec to the one codec every written record has."""
    image = schema["image"]
    if getattr(image, "codec", None) != "mixed":
        return schema
    codecs = {how.split()[0] if how.endswith(" unchanged") else how.split("→")[1].split()[-1]
              for how in result.stored}
    if len(codecs) > 1:
        return schema
    result.image_codec = codecs.pop() if codecs else "jpeg"
    return Schema(tuple(replace(f, codec=result.image_codec) if f is image else f for f in schema))
