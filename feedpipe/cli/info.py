"""``feedpipe info PATH``: a dataset's manifest summary (reads only the manifest)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from ..schema.masks import MaskField, TargetField
from .args import human
from .remote_args import add_storage_args, storage_options


def register(sub: Any) -> None:
    """Add the ``info`` subcommand to the ``feedpipe`` CLI's subparsers."""
    i = sub.add_parser("info", help="print a dataset's manifest summary",
        description=("Print a packed dataset's summary from its manifest: format, samples, fields, "
                     "classes, files and how it was converted."))
    i.add_argument("path", help="dataset folder or URL (s3://bucket/ds/)")
    i.add_argument("--json", action="store_true", help="print the whole manifest")
    add_storage_args(i)
    i.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    from ..dataset.verify import read_manifest  # a URL's filesystem: only when it runs

    m = read_manifest(args.path, storage_options(args))
    if args.json:
        print(json.dumps(m.to_json(), indent=1))
        return 0
    total = sum(f.size for f in m.files)
    print(f"{args.path}: {m.format} (format v{m.format_version}), {m.num_samples} samples, "
          f"{len(m.files)} files, {human(total)}")
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
            print(f"mask: {f.codec}, {np.dtype(f.dtype)}, {f.num_classes} classes"
                  + (f", ignore index {f.ignore_index}" if f.ignore_index is not None else ""))
        elif isinstance(f, TargetField):
            store = np.dtype(f.dtype).name + (f" (value = stored x {f.scale:.6g} + {f.offset:g})"
                                              if f.quantized else "")
            params = ", ".join(f"{k}={v}" for k, v in f.params if k != "dtype")
            print(f"target {f.name}: {f.target}({params}); stored {store}; resampled "
                  f"{f.interp}" + ("; values rescale with the geometry" if f.rescale == "distance"
                                   else ""))
    lists = ("ignored", "jpegs_needing_fallback_decoder", "channels_dropped", "empty_classes",
             "unlabeled", "mask_palette_left_out")
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
