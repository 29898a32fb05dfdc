"""The parallel, atomic packer behind ``feedpipe convert``.

Workers prepare samples (read, check, optionally decode/resize/re-encode); the main process writes
them in source order, so the output is the same whatever the worker count. Everything is written to
``.<out>.partial`` and renamed into place after the manifest, so an interrupted run leaves nothing
that reads as a dataset, and a re-run clears the leftover by itself.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from feedpipe.dataset.formats.base import sample_key
from feedpipe.dataset.manifest import Manifest, refuse_url
from feedpipe.dataset.registry import WRITERS, DatasetWriter
from feedpipe.errors import BadInputError, ConfigError
from feedpipe.schema.fields import Field, ImageField, JsonField, LabelField
from feedpipe.schema.imaging import DEFAULT_MAX_PIXELS
from feedpipe.schema.masks import MaskField
from feedpipe.schema.model import Schema

from .coco import scan_coco
from .columns import LabelColumns, apply_columns
from .images import image_codec, likely_jpeg
from .options import (
    PACK_DEFAULTS,
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
from .output import Output, abandon, empty_result
from .palette import resolve_palette
from .parts import Part, plan_part
from .remote_merge import refuse_merged
from .remote_output import RemoteOutput, is_remote
from .report import account, settle_codec, tally
from .sources import Source, attach_masks, scan
from .split_root import SplitClasses, SplitRoot, scan_split_root, split_of
from .targets import Target
from .worker import INFO_KEY, MASK_MAX_KEY, results

Progress = Callable[[int, int], None]


@dataclass
class ConvertResult:
    """What a conversion did, for the CLI summary and for callers."""

    out: Path | str  # a str for a URL output
    written: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    passthrough: int = 0
    reencoded: int = 0
    transcoded: int = 0  # progressive JPEGs stored as baseline, losslessly (jpeg="baseline")
    ignored: int = 0
    stored: dict[str, int] = field(default_factory=dict)  # "jpeg unchanged", "tiff→png"... → count
    ignored_files: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"}
    slow_jpegs: list[str] = field(default_factory=list)  # need the Pillow fallback decoder
    progressive_kept: list[dict[str, str]] = field(default_factory=list)  # not transcoded: why
    lossy: list[dict[str, str]] = field(default_factory=list)  # re-encoded unasked (CMYK, EXIF)
    channels_dropped: list[str] = field(default_factory=list)  # extra_channels="drop" did this
    empty_classes: list[str] = field(default_factory=list)
    image_codec: str = ""
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    splits: dict[str, int] = field(default_factory=dict)
    unmatched_masks: list[str] = field(default_factory=list)
    unlabeled: list[str] = field(default_factory=list)  # labelled manifest rows kept with -1
    mask_palette: tuple[tuple[int, int, int, int], ...] | None = None  # (r, g, b, class)
    palette_left_out: list[dict[str, Any]] = field(default_factory=list)  # auto's rare colours
    missing: dict[str, Any] = field(default_factory=dict)  # arrays: NaN per field (converters.arrays)

    @property
    def rate(self) -> float:
        return (self.written + len(self.skipped)) / self.seconds if self.seconds else 0.0


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
        fields.append(MaskField("mask", opts.mask_store, opts.mask_dtype, opts.num_classes, hw))
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


def split_indices(n: int, val_fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of validation items: a seeded permutation, deterministic for (n, seed)."""
    mask = np.zeros(n, dtype=bool)
    k = round(n * val_fraction)
    mask[np.random.default_rng(seed).permutation(n)[:k]] = True
    return mask


def convert(src: str | Path | Source, out: str | Path, *, to: Format,
            workers: int | None = None, store: Store = "passthrough",
            resize: int | tuple[int, int] | None = None, codec: Codec = "auto", quality: int = 90,
            check: Check = "header", strict: bool = False,
            val_fraction: float = 0.0, seed: int = 0, overwrite: bool = False,
            writer_options: dict[str, Any] | None = None,
            progress: Progress | None = None, masks: str | Path | None = None,
            mask_store: MaskStore = "raw", mask_dtype: MaskDtype = "uint8",
            num_classes: int | None = None,
            targets: Sequence[str | Target] | Mapping[str, Any] | None = None,
            extra_channels: ExtraChannels = "refuse",
            max_pixels: int | None = DEFAULT_MAX_PIXELS, layout: Layout = "auto",
            options: PackOptions | None = None,
            mask_palette: str | Path | None = None, split_root: SplitRoot | None = None,
            split_classes: SplitClasses = "agree", coco: str | Path | None = None,
            columns: LabelColumns | None = None,
            storage_options: Mapping[str, Any] | None = None,
            part: Part | None = None, labels: LabelsAs = "auto",
            unlabeled: Unlabeled = "refuse", jpeg: JpegStore = "baseline") -> ConvertResult:
    """Pack a source (folder, ImageFolder tree or CSV/JSONL manifest) into ``out`` as ``to``.

    Lossless inputs stay lossless unless ``codec`` asks otherwise (see :mod:`converters.images`).
    Progressive JPEGs are stored as baseline with the same DCT coefficients (the same decoded
    pixels, checked per file; ~3× faster to decode), counted in ``transcoded``; one that cannot
    be is stored as it is and named in ``progressive_kept``; ``jpeg="keep"`` stores every JPEG
    byte for byte (:mod:`converters.progressive`).
    Bad inputs are skipped and listed, and files not taken are listed with the reason
    (``strict=True`` raises on the first bad or refused input, and on a class left empty). With
    ``val_fraction`` > 0, ``out/train`` and ``out/val`` are written from a seeded split.
    Segmentation: ``masks`` (a folder matched by file name, or a manifest's ``mask`` column)
    adds a lossless ``mask`` field, and ``targets`` (e.g. ``["distance_map", "boundary"]``) are
    computed from each mask in the workers and stored as fields of the same names.
    ``resize``: an int is the shorter side (``store="raw"`` then crops the center square); a
    tuple is (height, width), the order of ``make_loader(size=)`` and ``--resize HxW``.
    Every option after ``out`` is keyword-only and checked by type and value (ConfigError).
    ``options``: the image options (``store`` ... ``max_pixels``, ``targets``) as one
    :class:`PackOptions`, instead of the separate keywords. ``mask_palette``: colour masks
    mapped to classes, ``"auto"`` or a palette JSON file (:mod:`converters.palette`).
    ``split_root``: ``src`` holds train/val(/test) ImageFolder trees, written as one dataset each
    or as one with a ``split`` field (:mod:`converters.split_root`).
    Labels that follow the image (docs/fields.md): ``coco`` (an ``instances.json`` whose images
    are in ``src``: boxes, categories, iscrowd) or ``columns`` (a manifest's keypoints, boxes,
    text and array columns, :class:`~converters.columns.LabelColumns`). A manifest's ``label``
    column: ``labels`` (``"auto"``, ``"ints"``, ``"names"``) says how to read it, a column that
    mixes integers and names is refused under ``"auto"``; ``unlabeled="keep"`` stores rows with
    an empty label as -1, counted in the result, instead of refusing them
    (:func:`converters.sources.manifest_labels`).
    A URL ``out`` (``s3://bucket/ds``; credentials and endpoint from the environment or
    ``storage_options``, as fsspec takes them) is packed in a local staging folder, uploaded shard
    by shard and committed by its manifest, uploaded last (:mod:`converters.remote_output`).
    ``part``: pack only that contiguous slice of the sorted source list, into
    ``out/parts/part-IIIII-of-NNNNN`` (see :mod:`converters.parts`); ``feedpipe merge`` joins them.
    """
    t0 = time.perf_counter()
    for where, what in ((src, "the source"), (out, "the output")):
        if not isinstance(where, Source) and not (where is out and is_remote(out)):
            refuse_url(where, what)
    if to not in WRITERS:
        raise ConfigError(f"to={to!r}: use one of {sorted(WRITERS)}", option="to")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction={val_fraction}: use a fraction in [0, 1)",
                          option="val_fraction")
    workers = workers if workers is not None else len(os.sched_getaffinity(0))
    if workers < 0:
        raise ConfigError(f"workers={workers}: use 0 or 1 for in-process, or a positive count",
                          option="workers")
    if coco is not None:
        source = scan_coco(src, coco) if not isinstance(src, Source) else src
    else:
        source = src if isinstance(src, Source) else scan_split_root(src, split_root, split_classes) \
            if split_root else scan(src, layout, labels, unlabeled)
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
                                        max_pixels)
    kept = {"store": store, "resize": resize, "codec": codec, "quality": quality, "check": check,
            "mask_store": mask_store, "mask_dtype": mask_dtype, "num_classes": num_classes,
            "extra_channels": extra_channels, "max_pixels": max_pixels, "mask_palette": palette,
            "jpeg": jpeg}
    if options is None:
        options = PackOptions(**kept, targets=resolve_targets(targets))  # type: ignore[arg-type]
    elif targets or any(v != PACK_DEFAULTS[k] for k, v in kept.items()):
        changed = [k for k, v in kept.items() if v != PACK_DEFAULTS[k]] + \
            (["targets"] if targets else [])
        raise ConfigError(f"options= holds the image options: set {', '.join(changed)} in "
                          "PackOptions(...), or pass them as keywords without options=",
                          option="options")
    if mask_palette is not None and not source.masked:
        raise ConfigError("mask_palette maps colour masks: pass masks=DIR (--masks) too")
    if options.targets and not source.masked:
        raise ConfigError("targets are computed from masks: pass masks=DIR (--masks) or a "
                          "manifest with a 'mask' column")
    opts = replace(options, masks=source.masked)
    if opts.resize is not None and any(f.kind in ("keypoints", "boxes") for f in source.typed):
        raise ConfigError("resize= with keypoints or boxes: their pixel coordinates refer to the "
                          "source images; convert without resize (the loader resizes both)",
                          option="resize")
    if strict and source.refused:
        raise BadInputError(f"{source.root / source.refused[0][0]}: {source.refused[0][1]}")
    remote = is_remote(out)
    out = out if remote else Path(out)
    sniff = to == "wds"  # WebDataset member names carry the codec: it is decided before writing
    schema = build_schema(source, opts, image_codec(source.items, opts, sniff))
    codec = schema["image"].codec  # type: ignore[attr-defined]
    guess = "jpeg" if codec == "mixed" and not sniff and likely_jpeg(source.items) else codec
    items, key0, part_info = list(source.items), 0, None
    if part is not None:
        if remote:  # a local output is checked by plan_part
            refuse_merged(str(out), storage_options)
        out, key0, stop, part_info = plan_part(part, source, out, to, opts, val_fraction)
        items = items[key0:stop]
    val_mask = split_indices(len(items), val_fraction, seed) if val_fraction else None
    output = RemoteOutput(str(out), overwrite, storage_options) if remote else \
        Output(Path(out), overwrite)
    tmp = output.claim(source)  # checks, locks and clears leftovers; see converters/output.py
    splits = {"train": tmp / "train", "val": tmp / "val"} if val_mask is not None else {"": tmp}
    if source.split_by == "separate":
        splits = {n: tmp / n for n in source.split_names}
    writers: dict[str, DatasetWriter] = {}
    skipped: dict[str, list[dict[str, str]]] = {name: [] for name in splits}
    labeled, has_extra = source.labeled, source.has_extra
    result = ConvertResult(out, ignored=len(source.not_taken), ignored_files=source.not_taken,
                           unmatched_masks=list(source.unmatched_masks), image_codec=codec,
                           mask_palette=opts.mask_palette, palette_left_out=list(left_out))
    mask_max = -1
    try:
        writers = {name: WRITERS[to](path, schema, **(writer_options or {}))
                   for name, path in splits.items()}
        for k, (values, how, nbytes) in enumerate(results(items, opts, workers, guess)):
            item = items[k]
            split = "" if val_mask is None else ("val" if val_mask[k] else "train")
            if source.split_by == "separate":
                split = split_of(item.rel)
            result.bytes_in += nbytes
            if values is not None and codec not in ("mixed", values[INFO_KEY].codec):
                values, how = None, f"changed while converting (now {values[INFO_KEY].codec})"
            if values is None:
                if strict:
                    raise BadInputError(f"{item.path}: {how}")
                skipped[split].append({"path": item.rel, "reason": how})
            else:
                tally(result, values.pop(INFO_KEY), item.rel)
                mask_max = max(mask_max, values.pop(MASK_MAX_KEY, -1))
                if labeled:
                    values["label"] = item.label
                values["path"] = item.rel
                if source.split_by == "field":
                    values["split"] = split_of(item.rel)
                values.update(item.fields or {})
                if has_extra:
                    values["meta"] = item.extra or {}
                if part_info is not None and to == "wds":  # keys stay unique once merged
                    writers[split].write(values, key=sample_key(key0 + writers[split].count))
                else:
                    writers[split].write(values)
                output.after_write(splits[split], writers[split])
            if progress is not None:
                progress(k + 1, len(items))
        empty = empty_result(source, {n: w.count for n, w in writers.items()},
                             [s for name in splits for s in skipped[name]])
        if empty is not None:
            raise empty
        conversion = {"source": str(source.root), "source_kind": source.kind,
                      "inputs": len(items), "ignored_non_images": len(source.ignored),
                      "val_fraction": val_fraction, "seed": seed,
                      **{f.name: getattr(opts, f.name) for f in dc_fields(opts)
                         if f.name != "targets"},
                      "targets": {t.name: {"target": t.spec or t.name, **t.params}
                                  for t in opts.targets},
                      **account(source, result, items, skipped, strict, whole=not part_info),
                      **({"part": part_info} if part_info else {}),
                      **({"labels": labels} if source.kind == "manifest" else {})}
        if source.masked:
            conversion["masks"] = str(masks) if masks is not None else "manifest column 'mask'"
            conversion["masks_without_images"] = list(source.unmatched_masks)
            conversion["mask_palette_left_out"] = result.palette_left_out
            if num_classes is None and mask_max >= 0:  # record what the masks hold
                schema = Schema(tuple(replace(f, num_classes=mask_max + 1)
                                      if isinstance(f, MaskField) else f for f in schema))
        if not sniff:
            schema = settle_codec(schema, result)
        for name, writer in writers.items():
            files, extra = writer.close()
            root = splits[name]
            entries = tuple(output.entry(root, f) for f in files)
            Manifest(to, writer.count, schema, source.classes, entries,
                     {**conversion, "split": name or None}, tuple(skipped[name]), extra
                     ).write(root)
            result.splits[name or "all"] = writer.count
            result.written += writer.count
            result.bytes_out += sum(e.size for e in entries)
        result.skipped = [s for name in splits for s in skipped[name]]
    except BaseException as exc:
        abandon(exc, writers.values(), output, Path(out), tmp)
    output.commit()
    result.seconds = time.perf_counter() - t0
    return result
