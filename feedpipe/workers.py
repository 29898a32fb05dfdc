"""The one set-up of a worker process, shared by the loader's DataLoader workers and the
converters' pool (lowest layer: it imports nothing of feedpipe and does not import torch)."""

from __future__ import annotations

import os
import signal
import sys


def single_threaded(*, ignore_sigint: bool = False) -> None:
    """One thread per worker: the workers are the parallelism, nested threads only contend.

    Sets ``OMP_NUM_THREADS=1`` for libraries loaded later and, when torch is already imported
    (DataLoader workers), its intra-op threads to 1. ``ignore_sigint``: Ctrl-C reaches the whole
    process group and the main process handles it (a pool's owner ends the pool and cleans up),
    so the workers must not each print a KeyboardInterrupt traceback.
    """
    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
