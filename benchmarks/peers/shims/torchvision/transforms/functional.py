"""Import-only: Mosaic's ``streaming.vision.base`` imports ``to_tensor``; the benchmark never calls it."""

from __future__ import annotations


def to_tensor(pic: object) -> object:
    raise NotImplementedError("torchvision shim: to_tensor is import-only here")
