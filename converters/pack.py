"""The parallel, atomic packer behind ``feedpipe convert``.

Workers prepare samples (read, check, optionally decode/resize/re-encode); the main process writes
them in source order, so the output is the same whatever the worker count. Everything is written to
``.<out>.partial`` and renamed into place after the manifest, so an interrupted run leaves nothing
that reads as a dataset, and a re-run clears the leftover by itself.
"""

from __future__ import annotations

import inspect
import time
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
from .images import image_codec, likely_jpeg
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
from .output import is_remote, why_empty
from .packer import PackTarget, Progress, Sample, split_indices, write_samples
from .palette import resolve_palette
from .parts import Part, plan_part
from .records import RecordSource, pack_record_source
from .report import account, settle_codec
from .result import ConvertResult
from .sources import Source, attach_masks, scan
from .split_root import SplitClasses, SplitRoot, scan_split_root, split_of
from .targets import Target
from .worker import INFO_KEY, MASK_MAX_KEY, results

__all__ = ["ConvertResult", "build_schema", "convert", "split_indices"]


# --- orchestration ------------------------------------------------------------------------------

def build_schema(source: Source, opts: PackOptions, codec: str | None = None) -> Schema:
    """image (+ label for labeled sources) (+ mask and targets) + path (+ meta for extras);
    ``codec`` defaults to :func:`image_codec` of the source's items."""
    codec = codec or image_codec(source.items, opts)
    fields: list[Field] = [ImageField("image", codec, opts.raw_shape)]
    if source.labeled:
        fields.append(LabelField("label"))
    if opts.masks:
        hw = opts.raw_shape[:2] if opts.raw_shape else None
        fields.append(MaskField("mask", opts.mask_store, opts.mask_dtype, opts.num_classes, hw,
                                opts.ignore_index))
        for t in opts.targets:
            f = t.field()
            if hw is not None:
                f = replace(f, shape=(*hw, *f.shape[2:]))
            fields.append(f)
    fields.extend(source.typed)
    fields.append(JsonField("path"))
    if source.split_by == "field":
        fields.append(JsonField("split"))
    if source.has_extra:
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

    Bad inputs are skipped and listed with the reason, and so are files not taken (``strict=True``
    raises instead). The options of image files only (masks, labels, part...) are refused for a
    record source. Every option after ``out`` is keyword-only and checked by type and value (a
    ``ConfigError`` names it).

    Args:
        src: A folder, an ImageFolder tree or a CSV/JSONL manifest of image files, or a
            ``RecordSource`` (foreign WebDataset shards, a Hugging Face dataset, arrays:
            ``converters.records``).
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
        check: "decode" (the default: every JPEG read whole, every scan at 1/8 scale, so one cut
            short or damaged is refused by name) or "header" (markers and end of image only).
        strict: Raise on the first bad or refused input, and on a class left empty.
        val_fraction: > 0 writes ``out/train`` and ``out/val`` from a seeded split.
        seed: The split's seed.
        overwrite: Replace a dataset feedpipe wrote at ``out`` (nothing else).
        writer_options: The format's own (``shard_size``, ``shard_count``, ``compression``).
        progress: Called with (done, total) as samples are written.
        masks: Segmentation masks: a folder matched to the images by file name (a manifest
            may give a ``mask`` column instead); adds a lossless ``mask`` field.
        mask_store: "raw" (no decode when loading) or "png" (smaller).
        mask_dtype: "uint8" or "uint16".
        num_classes: Classes in the masks; None: the largest index + 1 (``ignore_index``
            left out).
        ignore_index: A mask value of no class (e.g. 255, VOC's "void" band): left out of
            ``num_classes``, seen as background by the targets, recorded in the mask field.
            Masks must be lossless: a JPEG or lossy WebP mask is skipped, named.
        targets: Computed from each mask in the workers and stored as fields of their names:
            ``["distance_map", "boundary"]``, ``Target``s, or ``{"name": fn}``.
        extra_channels: Transparent alpha, channels beyond RGB, 16-bit RGB: "refuse" (skip
            by name) or "drop" what 8-bit RGB cannot hold.
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
        labels: How a manifest's ``label`` column is read: "auto" (integers are indices,
            other values class names; a column mixing both is refused), "ints" or "names".
        unlabeled: A labelled manifest's rows with an empty label: "refuse" or "keep" (as -1,
            counted).
        jpeg: Progressive JPEGs: "baseline" (the same DCT coefficients re-coded as baseline,
            checked per file; ~3× faster to decode) or "keep" (byte for byte).
        contained: Refuse, by name, every file a source names or links to outside its folder
            (a manifest's: its own folder): for manifests from untrusted hands. Default: files
            may lie anywhere the user can read (absolute paths, ``..``, symlinks).

    Returns:
        What was written, skipped and not taken, with the reasons.
    """
    t0 = time.perf_counter()
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
    image_opts = {"store": store, "resize": resize, "codec": codec, "quality": quality,
                  "check": check, "extra_channels": extra_channels, "max_pixels": max_pixels,
                  "max_scans": max_scans, "max_pixels_per_byte": max_pixels_per_byte,
                  "jpeg": jpeg}
    if isinstance(src, RecordSource):
        files_only = {"masks": masks, "mask_store": mask_store, "mask_dtype": mask_dtype,
                      "num_classes": num_classes, "ignore_index": ignore_index,
                      "targets": targets or None,
                      "mask_palette": mask_palette, "split_root": split_root,
                      "split_classes": split_classes, "coco": coco, "columns": columns,
                      "part": part, "labels": labels, "unlabeled": unlabeled, "layout": layout,
                      "contained": contained}
        given = [k for k, v in files_only.items() if v != _FILE_DEFAULTS[k]]
        if given:
            flags = ", ".join(f"{k}= (--{k.replace('_', '-')})" for k in given)
            raise ConfigError(f"{flags}: for image folders and manifests, not for a {src.kind} "
                              "source", option=given[0])
        result = pack_record_source(src, target, PackOptions(**image_opts),  # type: ignore
                                    val_fraction, seed)
    else:
        if not isinstance(contained, bool):
            raise ConfigError(f"contained={contained!r}: True or False", option="contained")
        result = _pack_files(src, target, workers, val_fraction, seed, masks, PackOptions(
            **image_opts, mask_store=mask_store, mask_dtype=mask_dtype,  # type: ignore[arg-type]
            num_classes=num_classes, ignore_index=ignore_index,
            targets=resolve_targets(targets)),
            mask_palette, split_root, split_classes, coco, columns, part, labels, unlabeled,
            layout, contained)
    result.seconds = time.perf_counter() - t0
    return result


_FILE_DEFAULTS = {k: v.default for k, v in inspect.signature(convert).parameters.items()}


def _pack_files(src: str | Path | Source, target: PackTarget, workers: int, val_fraction: float,
                seed: int, masks: str | Path | None, options: PackOptions,
                mask_palette: str | Path | None, split_root: SplitRoot | None,
                split_classes: SplitClasses, coco: str | Path | None,
                columns: LabelColumns | None, part: Part | None, labels: LabelsAs,
                unlabeled: Unlabeled, layout: Layout, contained: bool) -> ConvertResult:
    """:func:`convert` of a folder, ImageFolder tree or manifest of image files."""
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
    if mask_palette is not None and not source.masked:
        raise ConfigError("mask_palette maps colour masks: pass masks=DIR (--masks) too")
    if options.ignore_index is not None and not source.masked:
        raise ConfigError("ignore_index is a mask value: pass masks=DIR (--masks) or a "
                          "manifest with a 'mask' column", option="ignore_index")
    if options.targets and not source.masked:
        raise ConfigError("targets are computed from masks: pass masks=DIR (--masks) or a "
                          "manifest with a 'mask' column")
    opts = replace(options, masks=source.masked, mask_palette=palette)
    if opts.resize is not None and any(f.kind in ("keypoints", "boxes") for f in source.typed):
        raise ConfigError("resize= with keypoints or boxes: their pixel coordinates refer to the "
                          "source images; convert without resize (the loader resizes both)",
                          option="resize")
    if target.strict and source.refused:
        raise BadInputError(f"{source.root / source.refused[0][0]}: {source.refused[0][1]}")
    to = target.to
    sniff = to == "wds"  # WebDataset member names carry the codec: it is decided before writing
    schema = build_schema(source, opts, image_codec(source.items, opts, sniff))
    codec = schema["image"].codec  # type: ignore[attr-defined]
    guess = "jpeg" if codec == "mixed" and not sniff and likely_jpeg(source.items) else codec
    items, key0, part_info = list(source.items), 0, None
    if part is not None:
        target.out, key0, stop, part_info = plan_part(part, source, target.out, to, opts,
                                                      val_fraction, target.storage_options)
        target.key0 = key0
        items = items[key0:stop]
    val_mask = split_indices(len(items), val_fraction, seed) if val_fraction else None
    names: list[str] = ["train", "val"] if val_mask is not None else [""]
    if source.split_by == "separate":
        names = list(source.split_names)
    labeled, has_extra = source.labeled, source.has_extra
    result = ConvertResult(target.out, ignored=len(source.not_taken),
                           ignored_files=source.not_taken,
                           unmatched_masks=list(source.unmatched_masks), image_codec=codec,
                           mask_palette=opts.mask_palette, palette_left_out=list(left_out))
    mask_max = -1
    points = KeypointCheck(source.typed)

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
        conversion = {"source": str(source.root), "source_kind": source.kind,
                      "inputs": len(items), "ignored_non_images": len(source.ignored),
                      "val_fraction": val_fraction, "seed": seed,
                      **{f.name: getattr(opts, f.name) for f in dc_fields(opts)
                         if f.name != "targets"},
                      "targets": {t.name: {"target": t.spec or t.name, **t.params}
                                  for t in opts.targets},
                      **account(source, result, items, skipped, target.strict,
                                whole=not part_info),
                      **({"part": part_info} if part_info else {}),
                      **({"labels": labels} if source.kind == "manifest" else {}),
                      "contained": source.contained}
        settled = schema
        if source.masked:
            conversion["masks"] = str(masks) if masks is not None else "manifest column 'mask'"
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

    if part_info is None:
        target.key0 = None
    return write_samples(target, result, claim=source, split_names=names, schema=schema,
                         classes=source.classes, samples=samples(), total=len(items),
                         finish=finish, where=str(source.root),
                         why_empty=lambda skipped: why_empty(source, skipped))
