"""The per-image work of a conversion (read, check and store one image, its mask and targets),
in this process or in a pool of worker processes, in source order."""

from __future__ import annotations

import time
from collections import deque
from contextlib import ExitStack, closing, contextmanager
from functools import partial
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from PIL import Image

from feedpipe.errors import CorruptRecordError, NotRegularFileError
from feedpipe.schema.imaging import DEFAULT_MAX_PIXELS, decode_mask_png, encode_mask_png
from feedpipe.schema.masks import largest_class
from feedpipe.system import block_sigint, restore_sigmask
from feedpipe.workers import single_threaded

from .images import geometry, store_image
from .options import PackOptions
from .palette import Palette, colour_mask, refuse_lossy
from .pool import WorkerPool
from .progressive import transcoded
from .result import Refused, Stored
from .sources import SourceItem, read_regular

MASK_MAX_KEY = "_mask_max"  # a prepared sample's largest mask index (for num_classes), not stored
INFO_KEY = "_info"  # a prepared sample's stored codec and notes for the summary, not stored
Prepared = tuple[dict[str, Any] | None, str, int]  # (stored values or None, how or why, bytes in)


def read_mask(path: Path, dtype: str, palette: Palette | None = None,
              max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A lossless mask file → H×W index array, colour masks through ``palette``; a
    CorruptRecordError names the file, a JPEG or lossy WebP is a ValueError."""
    data = read_regular(path)
    refuse_lossy(data)
    arr = colour_mask(path, palette, max_pixels) if palette is not None else None
    if arr is None:
        try:
            arr = decode_mask_png(data, f"mask {path.name}", png_only=False,
                                  max_pixels=max_pixels)
        except CorruptRecordError as exc:
            if "mode RGB" in str(exc):  # say what to do about a colour mask
                raise CorruptRecordError(f"mask {path.name} is an RGB colour mask: map its "
                                         "colours to classes with mask_palette='auto' or a "
                                         "palette file (--mask-palette)") from exc
            raise
    if arr.size and int(arr.max()) > np.iinfo(dtype).max:
        raise ValueError(f"mask index {int(arr.max())} does not fit {dtype}; pass "
                         "mask_dtype='uint16' (--mask-dtype uint16)")
    return np.ascontiguousarray(arr.astype(dtype))


def _with_mask(item: SourceItem, values: dict[str, Any], size: tuple[int, int],
               opts: PackOptions) -> str | None:
    """Add the mask (resized like the image, so targets are computed at the stored resolution)
    and its targets to ``values``; a reason if it fails. ``size``: the upright image's (W, H)."""
    if item.mask is None:
        return "no mask file matches this image"
    try:
        mask = read_mask(item.mask, opts.mask_dtype, opts.mask_palette, opts.max_pixels)
    except CorruptRecordError as exc:  # already names the mask file
        return str(exc)
    except NotRegularFileError as exc:
        return f"mask {item.mask.name}: {exc.kind}, not a regular file (refused unread)"
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        return f"mask {item.mask.name}: {exc}"
    if (mask.shape[1], mask.shape[0]) != size:
        return (f"mask {item.mask.name} is {mask.shape[1]}x{mask.shape[0]}, image is "
                f"{size[0]}x{size[1]}")
    geo = geometry(size[0], size[1], opts)
    if geo is not None:
        mask = np.asarray(Image.fromarray(mask).resize(geo[0], Image.NEAREST, box=geo[1]),
                          dtype=mask.dtype)
    top = largest_class(mask, opts.ignore_index)
    if opts.num_classes is not None and top >= opts.num_classes:
        void = opts.ignore_index is None and top in (255, np.iinfo(mask.dtype).max)
        return f"mask {item.mask.name}: index {top} >= num_classes {opts.num_classes}" + (
            f"; if {top} marks pixels of no class (VOC's void), pass ignore_index={top} "
            f"(--ignore-index {top})" if void else "")
    if opts.targets:  # ignored pixels are background to the targets: never an object or an edge
        seen = mask if opts.ignore_index is None else \
            np.where(mask == opts.ignore_index, 0, mask).astype(mask.dtype)
        for t in opts.targets:
            values[t.name] = t.compute(seen, item.rel)  # a failing user target is a bug: raises
    values["mask"] = encode_mask_png(mask) if opts.mask_store == "png" else mask
    values[MASK_MAX_KEY] = max(top, 0)
    return None


def prepare(item: SourceItem, opts: PackOptions, transcode: bool = True) -> Prepared:
    """Read and check one image, its mask and targets: (stored values or None, how it was stored
    or why not, input bytes); ``transcode=False`` as for :func:`store_image`."""
    try:
        data = read_regular(item.path)
    except NotRegularFileError as exc:  # a manifest row naming a FIFO or /dev/zero
        return None, f"{exc.kind}, not a regular file (refused unread)", 0
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}", 0
    if not data:
        return None, "empty file", 0
    try:
        stored = store_image(data, opts, transcode)
    except Refused as exc:
        return None, str(exc), len(data)
    values: dict[str, Any] = {"image": stored.value, INFO_KEY: stored}
    if opts.masks:
        reason = _with_mask(item, values, stored.size, opts)
        if reason is not None:
            return None, reason, len(data)
    return values, stored.how, len(data)


@contextmanager
def _pool(workers: int) -> Iterator[WorkerPool]:
    """A pool of ``workers`` single-threaded processes that leave Ctrl-C to this one (it ends the
    pool and removes the partial output)."""
    # SIGINT is blocked while the pool starts, so a worker or forkserver still importing cannot
    # print a KeyboardInterrupt traceback, and unblocked inside the pool's `with`, whose exit ends
    # the pool. The resource tracker starts first: its start unblocks SIGINT.
    resource_tracker.ensure_running()
    mask = block_sigint()
    try:
        pool = WorkerPool(workers, partial(single_threaded, ignore_sigint=True))
    except BaseException:
        restore_sigmask(mask)
        raise
    with closing(pool):  # ends every worker, after an error or Ctrl-C too
        restore_sigmask(mask)
        yield pool


def results(items: list[SourceItem], opts: PackOptions, workers: int, codec: str
            ) -> Iterator[Prepared]:
    """Each item prepared, in order: decoding work by a worker pool; JPEG passthrough with header
    checks in this process, being I/O-bound (a pool was slower: benchmarks/RESULTS.md)."""
    decodes = opts.store != "passthrough" or opts.resize is not None or codec != "jpeg" \
        or opts.check == "decode" or opts.masks
    if workers <= 1 or len(items) < 64:
        yield from (prepare(it, opts) for it in items)
    elif decodes:
        with _pool(workers) as pool:
            chunk = max(1, min(64, len(items) // (workers * 8)))
            yield from pool.imap(prepare, ((str(it.path), (it, opts)) for it in items), chunk)
    else:
        yield from _passthrough(items, opts, workers)


_AHEAD, _AHEAD_BYTES = 256, 128 << 20  # read-ahead past a transcode not yet done: items, bytes
_INLINE_S = 0.5  # transcodes done in this process before a pool is worth starting (~0.5 s)


def _passthrough(items: list[SourceItem], opts: PackOptions, workers: int) -> Iterator[Prepared]:
    """Passthrough in this process, in order; progressive JPEGs are transcoded here for the first
    :data:`_INLINE_S`, then by a worker pool while the files after them are read."""
    queue: deque[tuple[Prepared, int | None]] = deque()  # with its transcode's job, if any
    busy = ahead = 0  # transcodes in flight; bytes held in the queue
    inline = 0.0  # seconds spent transcoding in this process
    with ExitStack() as stack:
        pool: WorkerPool | None = None
        for it in items:
            values, how, nbytes = prepare(it, opts, transcode=False)
            job = None
            # with transcode=False a progressive JPEG comes back unconverted, with no `kept`
            if values is not None and opts.jpeg == "baseline" and values[INFO_KEY].progressive:
                if pool is None and inline < _INLINE_S:  # a few: not worth starting a pool
                    t0 = time.perf_counter()
                    values, how = _done(values, partial(transcoded, values[INFO_KEY]))
                    inline += time.perf_counter() - t0
                else:
                    pool = pool or stack.enter_context(_pool(workers))
                    job = pool.submit(transcoded, [(str(it.path), (values[INFO_KEY],))])[0]
                    busy += 1
            queue.append(((values, how, nbytes), job))
            ahead += nbytes
            while queue and (queue[0][1] is None or pool is None or pool.ready(queue[0][1])
                             or busy > 4 * workers or len(queue) > _AHEAD
                             or ahead > _AHEAD_BYTES):
                busy -= queue[0][1] is not None
                ahead -= queue[0][0][2]
                yield _finish(queue.popleft(), pool)
        while queue:
            yield _finish(queue.popleft(), pool)


def _finish(entry: tuple[Prepared, int | None], pool: WorkerPool | None) -> Prepared:
    """A queued image, with its transcode's result (waited for) when it had one."""
    (values, how, nbytes), job = entry
    if job is not None and pool is not None and values is not None:
        values, how = _done(values, partial(pool.result, job))
    return values, how, nbytes


def _done(values: dict[str, Any], get: Callable[[], Stored]) -> tuple[dict[str, Any] | None, str]:
    """A prepared sample's values with its transcode's result (``get()``) put in, and how it was
    stored; (None, the reason) when the transcode refused it (damaged data)."""
    try:
        stored = get()
    except Refused as exc:
        return None, str(exc)
    values.update({"image": stored.value, INFO_KEY: stored})
    return values, stored.how
