"""The one set-up of a worker process, shared by the loader's DataLoader workers and the
converters' pool (lowest layer: it imports nothing of feedpipe and does not import torch)."""

from __future__ import annotations

import os
import signal
import sys


def single_threaded(*, ignore_sigint: bool = False) -> None:
    """One thread per worker (OpenMP's and torch's): the workers are the parallelism, nested
    threads only contend. ``ignore_sigint``: the main process handles the group's Ctrl-C, so the
    workers do not each print a KeyboardInterrupt traceback."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
