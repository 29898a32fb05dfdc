"""``feedpipe doctor [PATH|URL]``: what on this machine and in this dataset slows loading, and the fix.

Each check is a function of its inputs (cores, /dev/shm bytes, environment, dataset facts)
returning :class:`Finding` s, so tests can simulate bad setups; :func:`run_doctor` gathers the
inputs. Gains carry no figure measured elsewhere: computed from this machine's inputs, measured
by the short bench, or naming the command that measures them.
"""

from __future__ import annotations

import math
import os
import tarfile
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from converters import scan

from ..dataset.manifest import Manifest
from ..dataset.verify import read_manifest
from ..errors import BadInputError, ConfigError
from ..loader.config import PREFETCH_DECODE, auto_workers
from ..loader.memory import SHM_FLOOR, ring_bytes, shm_fits, shm_wanted
from ..schema.geometric import BoxesField, KeypointsField
from ..schema.imaging import decode_rgb
from ..storage import is_remote, open_store
from ..system import usable_cores
from . import machine, refuse, whole
from .bench import BenchConfig, is_packed, run_bench
from .findings import RANK, Finding, dali_hint, versus_baselines

SCHEMA_VERSION = 1
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "lustre", "gpfs", "beegfs")
GiB, MiB = 1 << 30, 1 << 20
NET_BUDGET = 64 << 20  # bytes fetched to measure the bandwidth
DECODE_SECONDS = 2.0
FOLDER_GAIN = ("`feedpipe bench PATH --baseline` measures it on this machine (the short bench "
               "does, unless --no-bench)")


def check_cores(usable: int, total: int, quota: float | None,
                images: bool = True) -> list[Finding]:
    """Cores this process may use (affinity / cpuset) and the cgroup CPU quota vs the machine
    (``images``: whether loading decodes images, which sets the workers 'auto' starts)."""
    out = []
    if usable < total:
        work = "JPEG decoding" if images else "loading"
        out.append(Finding("cores", "high" if usable == 1 else "medium",
                           f"this process may run on {usable} of the machine's {total} cores "
                           "(CPU affinity / cpuset)",
                           "run without taskset / docker --cpuset-cpus limits, or request more "
                           "cores from the scheduler",
                           f"{work} scales with cores: up to {total / usable:.1f}x"))
    if quota is not None and quota < auto_workers(images, usable) - 0.5:
        out.append(Finding("cores", "medium",
                           f"cgroup CPU quota is {quota:g} cores but {usable} are visible: "
                           f"num_workers='auto' starts {auto_workers(images, usable)} workers "
                           f"that share {quota:g} cores' time and get throttled",
                           f"`make_loader(..., num_workers={max(1, math.floor(quota))})`, or raise "
                           "the quota (docker --cpus, Kubernetes CPU limit)",
                           "no throttling pauses (they show as p99 batch waits)"))
    return out or [Finding("cores", "ok", f"{usable} usable cores"
                           + (f" (quota {quota:g})" if quota else ""))]


def check_shm(free: int | None, *, batch_size: int, size: int, workers: int,
              prefetch: int = PREFETCH_DECODE, images: bool = True) -> list[Finding]:
    """/dev/shm against what DataLoader workers need to hand batches over, and the slot ring
    (sized for ``size``² images; without images, only whether there is a /dev/shm)."""
    if workers == 0:
        return [Finding("shm", "ok", "no loader workers: /dev/shm is not used")]
    if not images:
        if free is None:
            return [Finding("shm", "high", "/dev/shm is missing: loader workers hand batches "
                            "over through it", "mount a tmpfs at /dev/shm (docker run "
                            "--shm-size=1g)", "loading with workers works at all")]
        return [Finding("shm", "ok", f"/dev/shm has {free / GiB:,.1f} GiB free")]
    batch = batch_size * size * size * 3  # uint8 RGB images: the ring's bulk
    ring = ring_bytes(batch, workers, prefetch)
    want = max(SHM_FLOOR, shm_wanted(ring))
    fix = (f"give /dev/shm at least {math.ceil(want / GiB)} GiB: docker run --shm-size="
           f"{math.ceil(want / GiB)}g (Kubernetes: an emptyDir with medium: Memory mounted at "
           "/dev/shm; or mount -o remount,size=... /dev/shm)")
    if free is None or free < workers * prefetch * batch:
        have = "missing" if free is None else f"{free / MiB:,.0f} MiB free"
        return [Finding("shm", "high", f"/dev/shm is {have}; {workers} workers × {prefetch} "
                        f"batches in flight need {workers * prefetch * batch / MiB:,.0f} MiB: "
                        "workers die with 'bus error' or 'No space left on device'", fix,
                        "loading with workers works at all")]
    if not shm_fits(ring, free):
        return [Finding("shm", "medium", f"/dev/shm has {free / MiB:,.0f} MiB free, under the "
                        f"{shm_wanted(ring) / MiB:,.0f} MiB the loader wants for its reusable slot ring "
                        f"(batch {batch_size}, {size}x{size}): each batch gets fresh shared "
                        "memory instead", fix,
                        f"no page faults on {batch / MiB:,.0f} MiB of fresh shared memory per "
                        "batch")]
    return [Finding("shm", "ok", f"/dev/shm has {free / GiB:,.1f} GiB free (slot ring "
                    f"{ring / MiB:,.0f} MiB)")]


def check_decoder(info: Mapping[str, Any]) -> list[Finding]:
    """Which JPEG decoder the loader uses: simplejpeg (libjpeg-turbo) or pillow-simd vs Pillow."""
    path = info.get("jpeg_loader_path")
    if path in ("simplejpeg+torch", "pillow-simd"):
        return [Finding("decoder", "ok", f"JPEG path {path} (decoder {info.get('jpeg_decoder')})")]
    return [Finding("decoder", "medium", f"JPEG is decoded and resized by stock Pillow "
                    f"({info.get('pil')} {info.get('pil_version')})",
                    "pip install simplejpeg (libjpeg-turbo wheel; feedpipe uses it automatically)",
                    "faster JPEG decode and resize per core (libjpeg-turbo, downscaling while "
                    "decoding); `feedpipe bench` before and after measures it here")]


def check_gpu(cuda: bool, gpu_names: list[str], dali_version: str | None,
              cuda_version: str | None = None) -> list[Finding]:
    """CUDA visible to torch, and DALI for decoding JPEG on the GPU (the wheel for
    ``cuda_version``, torch's CUDA build; None: the driver's, via NVML)."""
    if not cuda:
        return [Finding("gpu", "info", "no CUDA GPU visible to torch: batches stay on the CPU; "
                        "pinned memory and DALI do not apply")]
    if dali_version is None:
        return [Finding("gpu", "low", f"CUDA GPU(s) {', '.join(gpu_names)}; NVIDIA DALI is not "
                        "installed", dali_hint(cuda_version, installed=False),
                        "JPEG decode moves to the GPU when the CPU cores are the limit")]
    return [Finding("gpu", "ok", f"CUDA GPU(s) {', '.join(gpu_names)}; DALI {dali_version}")]


def probe_pinned() -> str | None:
    """Try a 1 MiB pinned host allocation; the error text, or None when it works."""
    import torch

    try:
        torch.empty(MiB, dtype=torch.uint8).pin_memory()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def check_pinned(cuda: bool, error: str | None) -> list[Finding]:
    """Pinned (page-locked) memory, which asynchronous host-to-GPU copies need."""
    if not cuda:
        return []
    if error:
        return [Finding("pinned", "high", f"pinned host memory cannot be allocated: {error}",
                        "raise the locked-memory limit (ulimit -l unlimited; docker --ulimit "
                        "memlock=-1), or `make_loader(..., workers=feedpipe.Workers(pin_memory=False))`",
                        "host-to-GPU copies overlap compute instead of blocking it")]
    return [Finding("pinned", "ok", "pinned host memory works")]


def check_threads(env: Mapping[str, str], torch_threads: int, usable: int, workers: int,
                  cuda: bool = False) -> list[Finding]:
    """Thread settings: OMP/MKL above the cores, or main-process threads + workers above them
    (low severity on CPU-only machines, where the training process computes on the CPU)."""
    out = []
    for var in machine.THREAD_ENV:
        value = env.get(var, "")
        if value.isdigit() and int(value) > usable:
            out.append(Finding("threads", "medium", f"{var}={value} exceeds the {usable} usable "
                               "cores: threads time-slice against each other and the workers",
                               f"export {var}={max(1, usable - workers) if workers else usable}",
                               "no oversubscription stalls in CPU ops"))
    if workers and torch_threads + workers > usable:
        out.append(Finding("threads", "info" if cuda else "low",
                           f"torch runs {torch_threads} intra-op threads in the "
                           f"training process next to {workers} loader workers on {usable} "
                           "cores: CPU work in the training process competes with decoding",
                           f"torch.set_num_threads({max(1, usable - workers)}) (or "
                           "OMP_NUM_THREADS) when the training process computes on the CPU; "
                           "workers already run one thread each",
                           "matters for CPU-side work only; a GPU step is unaffected"))
    return out or [Finding("threads", "ok", f"torch threads {torch_threads}, {workers} workers "
                           f"on {usable} cores")]


@dataclass(frozen=True)
class DatasetFacts:
    """What :func:`check_dataset` needs to know about a dataset; see :func:`dataset_facts`."""

    path: str
    kind: Literal["folder", "packed"]
    samples: int
    total_bytes: int
    format: str | None = None
    codec: str | None = None
    files: int = 0
    compression: str | None = None
    fs_type: str | None = None
    ram_bytes: int | None = None
    images: bool = True  # an image field (a time series or a table has none)
    geometric: tuple[str, ...] = ()  # keypoints / boxes fields (convert refuses --resize with them)


def dataset_facts(path: str | os.PathLike[str],
                  storage_options: Mapping[str, Any] | None = None) -> DatasetFacts:
    """Read the facts from a packed dataset's manifest (a folder, or a URL read through its
    :class:`~feedpipe.storage.Store`), or by listing an image folder."""
    ram = machine.memory()["total"]
    if is_remote(path):
        return _packed_facts(str(path), read_manifest(path, storage_options), None, ram)
    path = Path(path)
    fs = machine.fs_type(path)
    if is_packed(path):
        return _packed_facts(str(path), Manifest.read(path), fs, ram)
    items = scan(path).items
    if not items:
        raise ConfigError(f"{path}: neither a packed feedpipe dataset nor a folder with images; "
                          "pass a `feedpipe convert` output or an image folder")
    return DatasetFacts(str(path), "folder", len(items),
                        sum(i.path.stat().st_size for i in items), None, None, len(items),
                        None, fs, ram)


def _packed_facts(where: str, m: Manifest, fs: str | None, ram: int | None) -> DatasetFacts:
    """A packed dataset's facts from its manifest (a folder's or a URL's, the same checks)."""
    if m.num_samples == 0:
        raise BadInputError(f"{where}: the dataset holds 0 samples; its conversion wrote "
                            f"none (`feedpipe info {where}` lists skipped inputs). "
                            "Convert a source with readable images.", dataset=where)
    image = m.schema["image"] if "image" in m.schema else None
    geometric = tuple(f.name for f in m.schema if isinstance(f, (KeypointsField, BoxesField)))
    return DatasetFacts(where, "packed", m.num_samples, sum(f.size for f in m.files), m.format,
                        getattr(image, "codec", None), len(m.files), m.extra.get("compression"),
                        fs, ram, image is not None, geometric)


def check_dataset(f: DatasetFacts, *, size: int = 224) -> list[Finding]:
    """Storage choices: loose files vs packed, encoded vs raw vs RAM, compression, shards, fs."""
    out = []
    gb = f.total_bytes / GiB
    if f.kind == "folder":
        out.append(Finding("dataset", "high", f"{f.samples} loose image files ({gb:.2f} GiB): one "
                           "file open + read + decoder setup per sample",
                           f"feedpipe convert {f.path} --to lmdb -o packed/ (JPEG bytes kept "
                           f"unchanged, ~1.06x the size), then feedpipe.make_loader('packed/', "
                           f"256, size={size})",
                           FOLDER_GAIN))
    elif f.codec == "raw" and f.ram_bytes and f.total_bytes > 0.8 * f.ram_bytes:
        out.append(Finding("dataset", "medium", f"raw (decoded) images take {gb:.1f} GiB, more "
                           f"than 80% of the {f.ram_bytes / GiB:.0f} GiB RAM: every epoch reads "
                           "them from disk instead of the page cache",
                           "pack at the training resolution (--resize), or keep JPEG "
                           "(--store passthrough) and decode with workers",
                           "disk-bound epochs become memory-bound"))
    elif f.codec not in (None, "raw") and f.geometric:  # raw needs --resize: refused with them
        out.append(Finding("dataset", "info",
                           f"{f.format} with {f.codec} images: every sample is decoded at load "
                           f"time (CPU-bound); raw storage would need --resize, which convert "
                           f"refuses with {', '.join(f.geometric)} (their coordinates refer to "
                           "the source images)"))
    elif f.codec not in (None, "raw"):
        raw = f.samples * size * size * 3
        fits = bool(f.ram_bytes) and raw < 0.5 * f.ram_bytes  # type: ignore[operator]
        out.append(Finding("dataset", "low" if fits else "info",
                           f"{f.format} with {f.codec} images: every sample is decoded at load "
                           f"time (CPU-bound); raw {size}x{size} would take {raw / GiB:.1f} GiB"
                           + (" and fits in RAM" if fits else ", more than half the RAM"),
                           f"feedpipe convert SRC --to lmdb --store raw --resize {size} -o raw/ "
                           "(fixed-size training crops only)" if fits else "",
                           "no decode at load time, only reading and copying bytes; `feedpipe "
                           "bench` on both packings measures it here" if fits else ""))
    if f.compression:
        out.append(Finding("dataset", "medium", f"HDF5 chunks are {f.compression}-compressed: "
                           "every read decompresses on the loader's cores",
                           "re-convert without --compression", "the decompression CPU per sample"))
    if f.format == "wds" and f.files > 1 and f.total_bytes / f.files < 16 * MiB:
        mean = f.total_bytes / f.files / MiB
        out.append(Finding("dataset", "low", f"{f.files} shards of {mean:.1f} MiB on average: "
                           "per-shard open and seek cost, short sequential reads",
                           "re-convert with --shard-size 256MB (100 MB-1 GB shards)",
                           "fewer file opens; longer sequential reads on disks and object stores"))
    if f.fs_type and (f.fs_type in NETWORK_FS or f.fs_type.startswith("fuse")):
        out.append(Finding("dataset", "medium", f"the dataset is on a {f.fs_type} filesystem: "
                           "throughput and latency depend on the network",
                           "copy the packed dataset to a local disk (or RAM) before training",
                           "local read speed; no network stalls in the batch waits"))
    held = f"{f.codec} images" if f.images else "no images"
    return out or [Finding("dataset", "ok", f"packed {f.format}, {held}, {gb:.2f} GiB")]


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
    """Is a job on this remote dataset network-bound? The images/s the network delivers (the
    fetch bandwidth from here over the mean stored sample) against what the workers decode: a
    cold (first) epoch runs at the lower of the two; a warm one reads the node-local cache."""
    store = open_store(url, storage_options)
    m = read_manifest(store)
    sizes = {f.name: f.size for f in m.files}
    # the files a loader streams: a WebDataset's shards, else the biggest (an LMDB or HDF5 file)
    shards = [(str(s), sizes[str(s)]) for s in m.extra.get("shards", []) if str(s) in sizes]
    with tempfile.TemporaryDirectory(prefix="feedpipe-doctor-") as tmp:
        fetched, whole, t0 = 0, [], time.perf_counter()
        for name, size in shards or sorted(sizes.items(), key=lambda kv: -kv[1])[:1]:
            take = min(size, NET_BUDGET - fetched)
            local = store.local(name, Path(tmp), take)
            fetched += take
            if take == size:
                whole.append(local)
            if fetched >= NET_BUDGET:
                break
        seconds = time.perf_counter() - t0
        decoded, decode_s = _decode_rate(whole, m)
    bandwidth = fetched / seconds if seconds else 0.0
    mean = sum(sizes.values()) / max(m.num_samples, 1)
    workers = workers or auto_workers(True, usable_cores())
    net = bandwidth / mean
    facts = (f"fetched {fetched / 1e6:.1f} MB at {bandwidth / 1e6:.1f} MB/s; mean stored "
             f"sample {mean / 1e3:.1f} kB, so the network delivers ~{net:.0f} images/s")
    found = []
    if m.format != "wds":
        found.append(Finding("network", "medium", f"{url} is {m.format}: a single file, "
                             "fetched whole into the cache before the first batch",
                             fix="convert with --to wds for remote data: shards stream, and "
                             "the first batch comes after one shard"))
    if not decode_s:
        return [*found, Finding("network", "info", facts + "; no decode rate (not JPEG/PNG "
                                "WebDataset shards)")]
    cpu = decoded / decode_s * workers
    facts += f"; decoding runs ~{decoded / decode_s:.0f} images/s per core, ~{cpu:.0f} on " \
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


def measured_gain(findings: list[Finding], report: Any) -> list[Finding]:
    """The loose-files finding's gain as the short bench measured it on this machine: the
    packed loader against the DataLoaders on the same files."""
    if report is None or not report.speedup or report.baseline.source != "loose files":
        return findings
    gain = f"{versus_baselines(report)}, measured by the short bench"
    return [replace(f, gain=gain) if f.check == "dataset" and f.gain == FOLDER_GAIN else f
            for f in findings]


def check_bench(report: Any) -> list[Finding]:
    """The short bench's figures (a :class:`~feedpipe.tools.benchreport.BenchReport`), as information."""
    best = report.best
    if best is None:
        return [Finding("bench", "error", "no loader configuration ran")]
    title = (f"{best.batches} batches of {best.batch_size}: {best.samples_per_s:,.0f} samples/s "
             f"with {best.workers_requested} workers, first batch after {best.first_batch_s:.2f} s")
    if report.dataset["kind"] == "folder":
        title += f" (from {report.dataset['samples']} of the images packed to a temporary LMDB)"
    if versus := versus_baselines(report):
        title += f"; {versus}"
    return [Finding("bench", "info", title, f"feedpipe bench {report.dataset['path']} --baseline "
                    "--plot bench.png: the whole workers sweep, as a table and a plot")]


@dataclass(frozen=True)
class DoctorReport:
    """Findings sorted by severity, the machine, and the short bench's JSON (None if skipped)."""

    path: str | None
    findings: tuple[Finding, ...]
    machine: dict[str, Any]
    bench: dict[str, Any] | None

    @property
    def exit_code(self) -> int:
        """0 when every check ran; 1 when one of them failed."""
        return int(any(f.severity == "error" for f in self.findings))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "path": self.path, "exit_code": self.exit_code,
                "findings": [asdict(f) for f in self.findings], "machine": self.machine,
                "bench": self.bench}


def run_doctor(path: str | os.PathLike[str] | None = None, *, bench: bool = True,
               batches: int = 8, batch_size: int = 64, size: int = 224,
               env: Mapping[str, str] | None = None,
               storage_options: Mapping[str, Any] | None = None) -> DoctorReport:
    """Run every check on this machine, and on PATH (a folder, packed dataset or dataset URL,
    read with ``storage_options``) with a short bench unless ``bench=False``; a URL also gets the
    network check. A bad PATH or option raises; a check that fails becomes an "error" finding.
    """
    refuse(*((name, value, whole(value, least), f"use an integer of at least {least}")
             for name, value, least in (("batches", batches, 2), ("batch_size", batch_size, 1),
                                        ("size", size, 1))))
    m = machine.describe()
    usable, cuda = m["cores_usable"], m["cuda_available"]
    remote = path is not None and is_remote(path)
    facts = dataset_facts(path, storage_options) if path is not None else None
    images = facts is None or facts.images  # no image field: no decoder, no image bench
    decodes = images and (facts is None or facts.codec != "raw")
    workers = auto_workers(decodes, usable)  # what the loader's num_workers='auto' starts
    checks: list[tuple[str, Callable[[], list[Finding]]]] = [
        ("cores", lambda: check_cores(usable, m["cores_machine"], m["cgroup_cpu_limit"],
                                      decodes)),
        ("shm", lambda: check_shm((m["shm"] or {}).get("free"), batch_size=batch_size, size=size,
                                  workers=workers, images=images)),
        *([("decoder", lambda: check_decoder(m["decoders"]))] if images else []),
        ("gpu", lambda: check_gpu(cuda, [g["name"] for g in m["gpus"]], m["libraries"]["dali"],
                                  m["cuda_version"])),
        ("pinned", lambda: check_pinned(cuda, probe_pinned() if cuda else None)),
        ("threads", lambda: check_threads(os.environ if env is None else env, m["torch_threads"],
                                          usable, workers, cuda)),
    ]
    if facts is not None:
        checks.append(("dataset", lambda: check_dataset(facts, size=size)))
    if remote:
        checks.append(("network", lambda: check_network(str(path), storage_options, workers)))
    bench_reports: list[Any] = []
    if facts is not None and bench and not facts.images:
        checks.append(("bench", lambda: [Finding(
            "bench", "info", "no short bench: it measures image loading, and this dataset has "
            "no images", "time the batch waits in your own loop with "
            "feedpipe.StallMeter (docs/measure.md)")]))
    elif facts is not None and bench and remote and facts.format != "wds":
        checks.append(("bench", lambda: [Finding(
            "bench", "info", f"no short bench: a {facts.format} dataset at a URL is fetched whole "
            "before its first batch", f"feedpipe bench {path} (fetches it into the cache)")]))
    elif facts is not None and bench:
        cfg = BenchConfig(workers=("auto",), batch_sizes=(batch_size,), batches=batches,
                          size=size, baseline=True, limit=batches * batch_size,
                          device="cuda" if cuda else "cpu")

        def short_bench() -> list[Finding]:
            private = tempfile.TemporaryDirectory(prefix="feedpipe-doctor-") if remote \
                else nullcontext(None)  # a URL is read through a cache of doctor's own
            with private as cache:
                rep = run_bench(path, cfg, cache_dir=cache,  # type: ignore[arg-type]
                                storage_options=dict(storage_options or {}) or None)
            bench_reports.append(rep)
            return check_bench(rep)

        checks.append(("bench", short_bench))
    findings: list[Finding] = []
    for name, check in checks:
        try:
            findings += check()
        except Exception as exc:  # noqa: BLE001 - a failing check is reported; the rest still run
            findings.append(Finding(name, "error", f"check failed: {type(exc).__name__}: {exc}"))
    findings = measured_gain(findings, bench_reports[0] if bench_reports else None)
    findings.sort(key=lambda f: RANK[f.severity])
    return DoctorReport(None if path is None else str(path), tuple(findings), m,
                        bench_reports[0].to_json() if bench_reports else None)
