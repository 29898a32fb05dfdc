"""Converters: sources (folders, manifests, mask pairs), targets computed from masks, the parallel
atomic packer, sample photo generation."""

from .pack import ConvertResult, PackOptions, convert, parse_resize
from .sources import IMAGE_EXTS, Source, SourceItem, attach_masks, scan
from .targets import BUILTINS, Target, boundary, distance_map, make_boundary, make_distance_map

__all__ = ["BUILTINS", "ConvertResult", "IMAGE_EXTS", "PackOptions", "Source", "SourceItem",
           "Target", "attach_masks", "boundary", "convert", "distance_map", "make_boundary",
           "make_distance_map", "parse_resize", "scan"]
