"""``feedpipe doctor URL``'s network check: is a job on this remote dataset network-bound?

Fetches the first data files (up to a byte budget) through a :class:`feedpipe.storage.Store`, which gives the
fetch bandwidth from here; decodes the images of the fetched WebDataset shards on one core, which
gives the decode rate; and compares the images/s the network delivers (bandwidth ÷ mean stored
sample size, from the manifest) with what the loader's workers could decode. A cold (first) epoch
runs at the lower of the two; a warm one reads the node-local cache.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from ..dataset.manifest import Manifest
from ..dataset.verify import read_manifest
from ..errors import BadInputError
from ..loader.config import auto_workers
from ..schema.imaging import decode_rgb
from ..storage import open_store
from ..system import usable_cores
from .findings import Finding

BUDGET = 64 << 20  # bytes fetched to measure the bandwidth
DECODE_SECONDS = 2.0


def _data_files(m: Manifest) -> list[tuple[str, int]]:
    """(name, size) of the files a loader streams: the shards of a WebDataset, else the biggest
    file (an LMDB or HDF5 file is fetched whole)."""
    sizes = {f.name: f.size for f in m.files}
    shards = [str(s) for s in m.extra.get("shards", []) if str(s) in sizes]
    if shards:
        return [(s, sizes[s]) for s in shards]
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:1]


def measure(url: str, storage_options: Mapping[str, Any] | None = None,
            budget: int = BUDGET) -> dict[str, Any]:
    """Fetch up to ``budget`` bytes of data files and decode the fetched shards' images: the
    bandwidth (bytes/s), decode rate (images/s on one core) and mean stored sample size."""
    store = open_store(url, storage_options)
    m = read_manifest(store)
    with tempfile.TemporaryDirectory(prefix="feedpipe-doctor-") as tmp:
        fetched, whole = 0, []
        t0 = time.perf_counter()
        for name, size in _data_files(m):
            take = min(size, budget - fetched)
            local = store.local(name, Path(tmp), take)
            fetched += take
            if take == size:
                whole.append(local)
            if fetched >= budget:
                break
        seconds = time.perf_counter() - t0
        decoded, decode_s = _decode_rate(whole, m)
    total = sum(f.size for f in m.files)
    return {"url": url, "format": m.format, "samples": m.num_samples, "dataset_bytes": total,
            "mean_sample_bytes": total / max(m.num_samples, 1), "fetched_bytes": fetched,
            "fetch_seconds": seconds, "bandwidth": fetched / seconds if seconds else 0.0,
            "decoded": decoded, "decode_per_s": decoded / decode_s if decode_s else None}


def _decode_rate(shards: list[Path], m: Manifest) -> tuple[int, float]:
    """Images decoded and seconds spent, on this core, from whole fetched tar shards."""
    image = m.schema["image"] if "image" in m.schema else None
    codec = getattr(image, "codec", None)
    if m.format != "wds" or codec in (None, "raw"):
        return 0, 0.0
    suffix = "." + image.wds_suffix  # type: ignore[union-attr]
    payloads = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            payloads += [tar.extractfile(t).read() for t in tar  # type: ignore[union-attr]
                         if t.isfile() and t.name.endswith(suffix)]
    n, t0 = 0, time.perf_counter()
    for data in payloads:
        try:
            decode_rgb(data, codec)
        except BadInputError:
            continue
        n += 1
        if time.perf_counter() - t0 > DECODE_SECONDS:
            break
    return n, time.perf_counter() - t0


def check_network(url: str, storage_options: Mapping[str, Any] | None = None,
                  workers: int | None = None) -> list[Finding]:
    """One finding: the measured bandwidth against the decode rate, and the verdict."""
    r = measure(url, storage_options)
    workers = workers or auto_workers(True, usable_cores())
    net = r["bandwidth"] / r["mean_sample_bytes"]
    facts = (f"fetched {r['fetched_bytes'] / 1e6:.1f} MB at {r['bandwidth'] / 1e6:.1f} MB/s; "
             f"mean stored sample {r['mean_sample_bytes'] / 1e3:.1f} kB, so the network "
             f"delivers ~{net:.0f} images/s")
    found = []
    if r["format"] != "wds":
        found.append(Finding("network", "medium", f"{url} is {r['format']}: a single file, "
                             "fetched whole into the cache before the first batch",
                             fix="convert with --to wds for remote data: shards stream, and "
                             "the first batch comes after one shard"))
    if r["decode_per_s"] is None:
        return [*found, Finding("network", "info", facts + "; no decode rate (not JPEG/PNG "
                                "WebDataset shards)")]
    cpu = r["decode_per_s"] * workers
    facts += f"; decoding runs ~{r['decode_per_s']:.0f} images/s per core, ~{cpu:.0f} on " \
             f"{workers} worker(s)"
    if net < cpu:
        found.append(Finding(
            "network", "high", f"network-bound: {facts}. A cold (first) epoch runs at about "
            f"{net:.0f} images/s", fix="keep the node-local cache between runs "
            "(Remote(url, cache_dir=..., cache_limit=...) at least the dataset size: warm "
            "epochs read it at local speed), or train nearer the bucket",
            gain=f"warm epochs up to {cpu / net:.1f}x faster"))
    else:
        found.append(Finding("network", "ok", f"not network-bound: {facts}"))
    return found

