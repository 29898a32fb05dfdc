"""Print a packed dataset's summary from its manifest: format, samples, fields, classes, files and
how it was converted."""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..schema.masks import MaskField, TargetField
from .args import add_storage_args, human, some, storage_options

HELP = "print a dataset's manifest summary"
LISTS = ("ignored", "jpegs_needing_fallback_decoder", "channels_dropped", "empty_classes",
         "unlabeled", "mask_palette_left_out")  # conversion lists, counted here, listed by --json


def add_arguments(i: argparse.ArgumentParser) -> None:
    i.add_argument("path", help="dataset folder or URL (s3://bucket/ds/)")
    i.add_argument("--json", action="store_true", help="print the whole manifest")
    add_storage_args(i)


def run(args: argparse.Namespace) -> int:
    from ..dataset.verify import read_manifest  # a URL's filesystem: only when it runs

    m = read_manifest(args.path, storage_options(args))
    if args.json:
        print(json.dumps(m.to_json(), indent=1))
        return 0
    print(f"{args.path}: {m.format} (format v{m.format_version}), {m.num_samples} samples, "
          f"{len(m.files)} files, {human(sum(f.size for f in m.files))}")
    if m.format_version < 2:
        print("record checksums: none (format v1); re-convert to add a crc32 per record, "
              "checked on every read")
    print("fields: " + ", ".join(
        f"{f.name} ({', '.join(f'{k}={v}' for k, v in f.to_json().items() if k != 'name')})"
        for f in m.schema))
    if m.classes:
        print(f"classes ({len(m.classes)}): {some(m.classes, 10)}")
    for f in m.schema:
        if isinstance(f, MaskField):
            print(f"mask: {f.codec}, {np.dtype(f.dtype)}, {f.num_classes} classes"
                  + (f", ignore index {f.ignore_index}" if f.ignore_index is not None else ""))
        elif isinstance(f, TargetField):
            store = np.dtype(f.dtype).name + (f" (value = stored x {f.scale:.6g} + {f.offset:g})"
                                              if f.quantized else "")
            params = ", ".join(f"{k}={v}" for k, v in f.params if k != "dtype")
            print(f"target {f.name}: {f.target}({params}); stored {store}; resampled "
                  f"{f.interp}" + ("; values rescale with the geometry" if f.rescale == "distance"
                                   else ""))
    conv = m.conversion
    print("conversion: " + ", ".join(
        f"{k}={v}" for k, v in conv.items() if v not in (None, "", 0, 0.0, False)
        and k not in ("targets", "masks_without_images", *LISTS)))
    if conv.get("masks_without_images"):
        print(f"masks without an image: {len(conv['masks_without_images'])}")
    for key in LISTS:
        if conv.get(key):
            print(f"{key.replace('_', ' ')}: {len(conv[key])} (listed by --json)")
    print(f"skipped inputs: {len(m.skipped)}")
    for s in m.skipped[:10]:
        print(f"  {s.get('path')}: {s.get('reason')}")
    return 0
