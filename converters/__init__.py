"""Converters: sources, targets computed from masks, the parallel atomic packer, arrays and tables
(``pack_arrays``), sample photos. Exports load on first use (PEP 562), so ``converters.options``
(for the CLI's parser) imports without numpy or Pillow."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ConvertResult": "pack", "convert": "pack", "PackOptions": "options", "parse_resize": "options",
    "pack_arrays": "arrays",
    "IMAGE_EXTS": "sources", "Source": "sources", "SourceItem": "sources",
    "attach_masks": "sources", "scan": "sources",
    "LabelColumns": "columns", "apply_columns": "columns", "scan_coco": "coco",
    "BUILTINS": "targets", "Target": "targets", "boundary": "targets",
    "distance_map": "targets", "make_boundary": "targets", "make_distance_map": "targets",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and the API reference (docs/reference/convert.md)
    from .arrays import pack_arrays
    from .coco import scan_coco
    from .columns import LabelColumns, apply_columns
    from .options import PackOptions, parse_resize
    from .pack import ConvertResult, convert
    from .sources import IMAGE_EXTS, Source, SourceItem, attach_masks, scan
    from .targets import BUILTINS, Target, boundary, distance_map, make_boundary, make_distance_map


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'converters' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
