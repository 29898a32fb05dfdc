"""Converts and loads a small dataset as macOS and Windows would run it: started by
tests/test_platforms.py with ``tests/platform_site/`` first on PYTHONPATH, whose sitecustomize hides
from feedpipe what those systems lack (``fcntl``, ``resource``, ``os.sched_getaffinity``,
``signal.pthread_sigmask``) and leaves ``spawn`` the only start method, in this process and in every
worker it starts. Writes what it saw as JSON (argv[2]) for the test to compare."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path


def main(root: Path, report: Path) -> None:
    # imported here: the spawned conversion workers import this module, and need none of it
    import feedpipe
    from converters import convert
    from converters.synth import make_photos
    from feedpipe.errors import StorageError
    from feedpipe.loader.config import usable_cores
    from feedpipe.storage.cache import Cache

    assert not hasattr(os, "sched_getaffinity") and not hasattr(signal, "pthread_sigmask")
    assert mp.get_all_start_methods() == ["spawn"] and mp.get_start_method() == "spawn"
    src = make_photos(root / "src", 64, size=(64, 48), classes=3, seed=1)
    out: dict[str, object] = {"usable_cores": usable_cores()}
    for fmt, workers in (("lmdb", 2), ("hdf5", 0), ("wds", 0)):
        # check="decode" decodes every photo: with 2 workers, in the conversion's process pool
        res = convert(src, root / fmt, to=fmt, check="decode", workers=workers)
        loader = feedpipe.make_loader(  # one spawned DataLoader worker (each imports torch anew)
            root / fmt, 8, size=32, seed=3, device="cpu", fields=["image", "label", "path"],
            output=feedpipe.Output(dtype="uint8"), num_workers=min(workers, 1),
            workers=feedpipe.Workers(multiprocessing_context="spawn" if workers else None))
        batches = [(b["path"], b["label"].tolist(),
                    hashlib.sha256(b["image"].numpy().tobytes()).hexdigest()) for b in loader]
        out[fmt] = {"written": res.written, "batches": batches}
    try:
        Cache(root / "cache")
    except StorageError as exc:
        out["cache"] = str(exc)
    report.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
