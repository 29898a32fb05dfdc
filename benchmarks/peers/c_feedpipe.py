"""Contender: feedpipe, packed with its converter (original JPEG bytes; progressive JPEGs stored as
baseline with the same DCT coefficients, the converter's default) and read by make_loader.

Usage as the project README shows it: ``feedpipe convert SRC OUT --to FORMAT`` (here the Python
``converters.convert`` the CLI calls, ``store="passthrough"``), then
``feedpipe.make_loader(OUT, batch_size, size=224, output=Output(dtype="uint8"), device="cpu")`` with the crop
left at its default (``"center_crop"``: the output's aspect cut from the centre, then resized).
``--format`` picks lmdb, wds or hdf5. ``num_workers`` is set to the task's 2 (feedpipe's "auto"
would pick from the machine).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from common import serve

import feedpipe
from converters import convert
from feedpipe import Output


def _fmt() -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", choices=("lmdb", "wds", "hdf5"), required=True)
    return ap.parse_known_args()[0].format


def pack(items: list[tuple[str, int]], work: Path, args: argparse.Namespace) -> None:
    src = Path(items[0][0]).parents[1]  # the ImageFolder root run.py scanned
    if work.exists():
        shutil.rmtree(work)
    convert(src, work, to=_fmt(), store="passthrough", workers=args.workers,
            writer_options={"shard_size": 32 << 20} if _fmt() == "wds" else None)


def epochs(loader):
    """The harness's epoch: (images, labels) per batch of ``loader``."""
    def epoch():
        for batch in loader:
            yield batch["image"], batch["label"]
    return epoch


def open_loader(work: Path, args: argparse.Namespace):
    return epochs(feedpipe.make_loader(work, args.batch, size=args.size, device="cpu",
                                       num_workers=args.workers, shuffle=True,
                                       output=Output(dtype="uint8")))


if __name__ == "__main__":
    serve(f"feedpipe {_fmt()}", pack, open_loader)
