"""Run one soak (tests/faults/test_fault_soak.py) and print what it measured as JSON.

``python soak_probe.py DATASET CONTEXT EPOCHS``: loads EPOCHS epochs with 2 persistent workers
started by CONTEXT, recording every process's RSS after each epoch, then deletes the loader and
reports the workers still alive and the shared memory left (/dev/shm entries, open fds, maps).
The test runs it in a private mount namespace with its own /dev/shm where it can, so that other
processes' segments on a shared machine cannot be mistaken for leaks.
"""

import gc
import json
import os
import sys
from pathlib import Path

import psutil

import feedpipe
from feedpipe import Output, Workers


def shm_in_use() -> dict[str, object]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd of the listing itself, closed by now
            continue
        if target.startswith("/dev/shm/"):
            fds.append(target)
    maps = [line.split(None, 5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if "/dev/shm/" in line]
    return {"listing": sorted(os.listdir("/dev/shm")), "fds": fds, "maps": maps}


def helper(me: psutil.Process, p: psutil.Process) -> bool:
    """multiprocessing's own resource tracker or fork server (one per interpreter, kept)."""
    cmd = " ".join(p.cmdline())
    return p.ppid() == me.pid and ("resource_tracker" in cmd or "forkserver" in cmd)


def main(data: str, context: str, epochs: int) -> dict[str, object]:
    me = psutil.Process()
    before = shm_in_use()
    loader = feedpipe.make_loader(data, 8, size=32, device="cpu", num_workers=2,
                                  seed=1, output=Output(dtype="uint8"),
                                  workers=Workers(multiprocessing_context=context))
    rss: dict[str, list[int]] = {}
    workers: list[list[int]] = []
    samples = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            samples += len(batch["label"])
        procs = me.children(recursive=True)
        workers.append(sorted(c.pid for c in procs if not helper(me, c)))
        for p in [me, *procs]:
            kind = "main" if p.pid == me.pid else "helper" if helper(me, p) else "worker"
            rss.setdefault(f"{kind} {p.pid}", []).append(p.memory_info().rss)
    procs = [psutil.Process(pid) for pid in workers[-1]]
    del loader, batch
    gc.collect()
    _, alive = psutil.wait_procs(procs, timeout=20)
    return {"samples": samples, "rss": rss, "workers": workers,
            "alive": [p.pid for p in alive], "before": before, "after": shm_in_use()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
