"""Measuring a contender from outside: CPU time and peak PSS of its whole process tree, and the
bare decode kernel (the ceiling) plus the reference decode the contenders are checked against."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import psutil
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


@contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """Stop these processes and their descendants (SIGSTOP) for the block, then let them go on:
    an idle contender's threads or workers must not take CPU from the one being timed."""
    stopped = []
    for pid in pids:
        for p in _tree(pid):
            try:
                p.suspend()
                stopped.append(p)
            except psutil.NoSuchProcess:
                pass
    try:
        yield
    finally:
        for p in stopped:
            try:
                p.resume()
            except psutil.NoSuchProcess:
                pass


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its descendants, live or already reaped.

    A reaped child's time moves into its parent's ``children_*`` fields, so summing all four fields
    over the live tree counts every process once, whenever it exited."""
    total = 0.0
    for p in _tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass  # exited between listing and reading: its time is in its parent's children_*
    return total


def main_cpu_seconds(pid: int) -> float:
    """User + system CPU of the process alone (a loader's main process, without its workers)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def tree_pss_bytes(pid: int) -> int:
    """Proportional set size of the process tree (shared pages split between their users)."""
    total = 0
    for p in _tree(pid):
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


class PeakPss:
    """Samples a process tree's PSS in a thread (every ``interval`` s) and keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, tree_pss_bytes(self.pid))
            except psutil.NoSuchProcess:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakPss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def center_box(h: int, w: int) -> tuple[int, int, int]:
    """The task's centre crop of a square output: (top, left, side) of the central square."""
    s = min(h, w)
    return (h - s) // 2, (w - s) // 2, s


def kernel(data: bytes, size: int, out: torch.Tensor) -> None:
    """The bare kernel: simplejpeg full decode, centre crop, torch's antialiased uint8 bilinear
    resize on a channels-last contiguous crop (its fast path), written into an H×W×3 slot."""
    rgb = simplejpeg.decode_jpeg(data, colorspace="RGB")
    top, left, s = center_box(*rgb.shape[:2])
    crop = torch.from_numpy(rgb[top: top + s, left: left + s]).permute(2, 0, 1).unsqueeze(0)
    crop = crop.contiguous(memory_format=torch.channels_last)
    y = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True,
                      align_corners=False)
    out.copy_(y[0].permute(1, 2, 0))


def _kernel_proc(args: tuple[list[bytes], int, object]) -> tuple[float, float, float]:
    """One process's share of the ceiling: (start, end) on the system-wide monotonic clock and
    CPU ms/image, over every blob once after a warm-up."""
    blobs, size, barrier = args
    torch.set_num_threads(1)
    out = torch.empty(size, size, 3, dtype=torch.uint8)
    for b in blobs[:32]:  # warm-up
        kernel(b, size, out)
    barrier.wait()  # type: ignore[attr-defined]
    t, c = time.monotonic(), time.process_time()
    for b in blobs:
        kernel(b, size, out)
    end, cpu = time.monotonic(), time.process_time() - c
    return t, end, 1e3 * cpu / len(blobs)


def kernel_ceiling(files: list[str], size: int, procs: int) -> dict[str, float]:
    """The kernel over ``files`` once, shared by ``procs`` processes at once (every
    ``procs``-th file each, as a loader's workers share an epoch): images/s over the whole pass
    (every image over the time from the first process's start to the last one's end: the rule a
    contender's epoch is rated by, not the sum of per-process rates, which credits a process that
    finished early with speed nobody got), and CPU ms/image."""
    blobs = [Path(f).read_bytes() for f in files]
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(procs)
        with ctx.Pool(procs) as pool:
            res = pool.map(_kernel_proc, [(blobs[p::procs], size, barrier)
                                          for p in range(procs)])
    span = max(r[1] for r in res) - min(r[0] for r in res)
    return {"images_per_s": len(blobs) / max(span, 1e-9), "images": len(blobs), "span_s": span,
            "cpu_ms_per_image": float(np.mean([r[2] for r in res]))}


def _reference_one(args: tuple[str, int]) -> np.ndarray:
    path, size = args
    with Image.open(path) as im:
        im = im.convert("RGB")
        top, left, s = center_box(im.height, im.width)
        im = im.resize((size, size), Image.BILINEAR, box=(left, top, left + s, top + s))
    return np.asarray(im, dtype=np.float64).mean(axis=(0, 1))


def reference_means(items: list[tuple[str, int]], classes: int, size: int,
                    procs: int) -> list[list[float]]:
    """Mean pixel per label and channel of a reference decode (PIL, full resolution, antialiased
    bilinear resize of the centre square) of every source file."""
    with mp.get_context("spawn").Pool(procs) as pool:
        means = pool.map(_reference_one, [(p, size) for p, _ in items], chunksize=32)
    sums, counts = np.zeros((classes, 3)), np.zeros(classes)
    for (_, y), m in zip(items, means, strict=True):
        sums[y] += m
        counts[y] += 1
    return (sums / np.maximum(counts, 1)[:, None]).tolist()
