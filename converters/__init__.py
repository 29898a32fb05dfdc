"""Converters: sources (folders, manifests), the parallel atomic packer, sample photo generation."""

from .pack import ConvertResult, PackOptions, convert, parse_resize
from .sources import IMAGE_EXTS, Source, SourceItem, scan

__all__ = ["ConvertResult", "IMAGE_EXTS", "PackOptions", "Source", "SourceItem", "convert",
           "parse_resize", "scan"]
