"""Import-only: Mosaic's ``streaming.vision`` subclasses ``VisionDataset`` at import time; the
benchmark never builds one (it uses ``streaming.StreamingDataset``)."""

from __future__ import annotations

from torch.utils.data import Dataset


class VisionDataset(Dataset):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError("torchvision shim: VisionDataset is import-only here")
