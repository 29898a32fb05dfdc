"""Loads a dataset with 2 workers in a container-sized /dev/shm: started by tests/test_platforms.py
inside its own mount namespace (``unshare -m``) with an 8 MiB tmpfs mounted on /dev/shm, too small
for the loader's batch ring. Writes the batches, the warnings and the /dev/shm size as JSON."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from itertools import islice
from pathlib import Path

import feedpipe


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def batches(dataset: Path, workers: int) -> list[list[object]]:
    """The first 4 batches, of 0.9 MB each (8 × 192×192×3 uint8, as the workers make them): a
    ring of 6 wants 10.6 MB of /dev/shm."""
    loader = feedpipe.make_loader(dataset, 8, size=192, seed=7, device="cpu", num_workers=workers,
                                  workers=feedpipe.Workers(prefetch_factor=2),
                                  fields=["image", "label"])
    return [[b["label"].tolist(), hashlib.sha256(b["image"].numpy().tobytes()).hexdigest()]
            for b in islice(loader, 4)]


if __name__ == "__main__":
    kept = Kept()
    logging.getLogger("feedpipe").addHandler(kept)
    got = batches(Path(sys.argv[1]), 2)
    Path(sys.argv[2]).write_text(json.dumps({"shm": shutil.disk_usage("/dev/shm").total,
                                             "batches": got, "warnings": kept.messages}))
