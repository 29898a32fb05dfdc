"""feedpipe's hot path against the bare decode kernel, side by side in one run.

For ~500×375 and ≥1280 px photos × centre / random-resized crop, on the same files: the bare
kernel (``simplejpeg.decode_jpeg`` + crop + torch's antialiased uint8 bilinear resize + copy into
a batch slot; one process, and one process per core sharing the epoch's files = the parallel
ceiling) against ``make_loader`` from LMDB, WebDataset and HDF5, in-process and with 2 workers;
plus raw uint8 data in-process against workers. The kernel is timed twice: at full decode size (the issue's
definition) and at the DCT scale feedpipe picks for the same crop (the same work feedpipe does).
The "web" groups (not run by default: ``--groups "web center_crop"``) use photos with the JPEG
properties of web collections (``converters.synth.make_web_photos``, mix in benchmarks/README.md:
40% progressive, 4:2:0 and 4:4:4, EXIF orientations, 640-4000 px, quality 75-95): the kernel
decodes the files as they are, feedpipe reads them converted (progressive ones stored as
baseline) and, for LMDB, converted with ``jpeg="keep"`` (progressive bytes as they are) and
the all-baseline control (the same photos, the progressive ones saved baseline, as LMDB).
Every configuration of a group runs in interleaved rounds (benchmarks/harness.py), and each
ratio is the median of the rounds' own ratios, so ratios hold on a busy machine. 224² uint8
output, batch 64, one epoch per round.

    python benchmarks/bench_kernel.py [--images 1024] [--large-images 512] [--rounds 7]
                                      [--data bench-data] [--json results/kernel.json]
                                      [--groups "500x375 random_resized_crop" raw ...]
                                      [--web-images 512]  (with --groups "web center_crop" ...)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import psutil
import simplejpeg
import torch
import torch.nn.functional as F

from feedpipe import Output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Items, drain, machine, measure_side_by_side, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import jpeg_mix, make_photos, make_web_photos  # noqa: E402
from feedpipe.loader.transforms import ImageOp  # noqa: E402

SIZE, BATCH, WORKERS = 224, 64, 2
PHOTOS = {"500x375": (500, 375), "1280x853": (1280, 853)}
FORMATS = ("lmdb", "wds", "hdf5")
CROPS = ("center_crop", "random_resized_crop")
GROUPS = (*(f"{p} {c}" for p in PHOTOS for c in CROPS), "raw")  # the default run
WEB_GROUPS = tuple(f"web {c}" for c in CROPS)  # web photo mix: asked for by name


def plan(blobs: list[bytes], crop: str, seed: int = 0) -> list[tuple[int, int, int, int, int]]:
    """Per file: the crop box (feedpipe's own box policy, seeded) and the DCT factor feedpipe's
    current margin picks for it — fixed up front so the kernel times only decode/crop/resize."""
    op, rng = ImageOp((SIZE, SIZE), crop), np.random.default_rng(seed)  # type: ignore[arg-type]
    out = []
    for b in blobs:
        h, w = simplejpeg.decode_jpeg_header(b)[:2]
        geo = op.plan(h, w, rng)  # feedpipe's one plan: box and DCT scale (no flip here)
        out.append((*geo[:4], geo.dct))
    return out


def kernel_one(blob: bytes, box: tuple[int, ...], scaled: bool) -> torch.Tensor:
    """The bare kernel on one file: decode (full size, or at the planned 1/f when ``scaled``),
    crop, channels-last antialiased uint8 resize; returns the 224² image as H×W×3 (a view)."""
    top, left, ch, cw, f = box
    f = f if scaled else 1
    if f > 1:  # min_factor alone does not scale: the minimum size must allow it too
        h, w = simplejpeg.decode_jpeg_header(blob)[:2]
        img = simplejpeg.decode_jpeg(blob, colorspace="RGB", min_factor=f,
                                     min_height=-(-h // f), min_width=-(-w // f))
    else:
        img = simplejpeg.decode_jpeg(blob, colorspace="RGB")
    top, left = top // f, left // f  # the box snapped to the scaled grid, as feedpipe does
    x = torch.from_numpy(img[top: top + ch // f, left: left + cw // f])
    x = x.permute(2, 0, 1).unsqueeze(0).contiguous(memory_format=torch.channels_last)
    y = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", antialias=True, align_corners=False)
    return y[0].permute(1, 2, 0)


def kernel(blobs: list[bytes], boxes: list[tuple[int, ...]], scaled: bool) -> int:
    """:func:`kernel_one` over every file, each copied into a slot of one HWC batch."""
    batch = torch.empty((BATCH, SIZE, SIZE, 3), dtype=torch.uint8)
    for i, (b, box) in enumerate(zip(blobs, boxes, strict=True)):
        batch[i % BATCH].copy_(kernel_one(b, box, scaled))
    return len(blobs)


_STATE: dict[str, object] = {}


def _init(blobs: list[bytes], boxes: list[tuple[int, ...]]) -> None:
    torch.set_num_threads(1)
    _STATE.update(blobs=blobs, boxes=boxes)


def _pool_kernel(scaled: bool, part: int) -> int:
    """Every ``WORKERS``-th file from ``part``: the processes share one epoch's files, as the
    loader's workers do, so both sides of the ratio do the same work a round."""
    blobs, boxes = _STATE["blobs"], _STATE["boxes"]
    return kernel(blobs[part::WORKERS], boxes[part::WORKERS], scaled)  # type: ignore[index]


def _cpu_of(p: psutil.Process) -> float:
    """CPU seconds of a process's live threads, in nanoseconds from the scheduler
    (``/proc/PID/task/*/schedstat``); psutil's user + system times tick in 10 ms steps, too coarse
    for a round of a few hundred ms summed over several processes."""
    total = 0
    for task in Path(f"/proc/{p.pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that exited meanwhile
            pass
    return total / 1e9


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process (``getrusage``: exact, and it keeps the time of threads that
    have exited, which a sum over live threads would drop), and of it plus all its live
    children (workers, pool)."""
    me = psutil.Process()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    own = usage.ru_utime + usage.ru_stime
    kids = 0.0
    for p in me.children(recursive=True):
        try:
            kids += _cpu_of(p)
        except (psutil.Error, FileNotFoundError):  # exited meanwhile
            pass
    return own, own + kids


class Timed:
    """Wraps a run to also record CPU seconds per item: the main process's, and all processes'
    (main + workers / pool). On a loaded machine wall-clock rates move with the neighbours'
    load; CPU per image is what the configuration itself costs."""

    def __init__(self, run: Callable[[], Items]) -> None:
        self.run = run
        self.cpu: list[float] = []   # per call: the main process's CPU seconds per item
        self.tree: list[float] = []  # per call: all processes' CPU seconds per item

    def __call__(self) -> Items:
        own0, tree0 = _cpu()
        n = self.run()
        own1, tree1 = _cpu()
        items = n if isinstance(n, int) else n.samples
        self.cpu.append((own1 - own0) / items)
        self.tree.append((tree1 - tree0) / items)
        return n


def packed(data: Path, label: str, n: int, store: str = "passthrough") -> dict[str, Path]:
    """The photos and their LMDB / WebDataset / HDF5 packings (made once, reused); web photos
    also as LMDB with ``jpeg="keep"`` (key ``lmdb jpeg=keep``) and their all-baseline control
    as LMDB (key ``lmdb all-baseline``)."""
    photos = data / f"kernel-photos-{label}-{n}"
    if not photos.exists():
        print(f"generating {n} photos ({label}) in {photos}", flush=True)
        if label == "web":
            make_web_photos(photos, n, classes=7, seed=1)
        else:
            make_photos(photos, n, size=PHOTOS[label], classes=7, seed=1)
    out = {"photos": photos}
    packings = [(f, "baseline") for f in (FORMATS if store == "passthrough" else ("lmdb",))]
    for fmt, jpeg in packings + ([("lmdb", "keep")] if label == "web" else []):
        keep = "-keep" if jpeg == "keep" else ""
        dst = data / f"kernel-{fmt}-{store}{keep}-{label}-{n}"
        if not dst.exists():
            convert(photos, dst, to=fmt, store=store, workers=0, jpeg=jpeg,
                    resize=SIZE if store == "raw" else None,
                    writer_options={"shard_size": 32 << 20} if fmt == "wds" else None)
        out[fmt + (" jpeg=keep" if keep else "")] = dst
    if label == "web":
        out["lmdb all-baseline"] = web_control(data, n)
    return out


def web_control(data: Path, n: int) -> Path:
    """The web photos' all-baseline control (``make_web_photos(progressive=False)``: the same
    pixels, sizes and EXIF, no progressive file) packed as LMDB (made once, reused)."""
    photos = data / f"kernel-photos-web-baseline-{n}"
    if not photos.exists():
        print(f"generating the {n} web photos all baseline in {photos}", flush=True)
        make_web_photos(photos, n, classes=7, seed=1, progressive=False)
    dst = data / f"kernel-lmdb-passthrough-web-baseline-{n}"
    if not dst.exists():
        convert(photos, dst, to="lmdb", workers=0)
    return dst


def loader(path: Path, crop: str, workers: int) -> object:
    return feedpipe.make_loader(path, BATCH, size=SIZE, crop=crop, device="cpu",
                                num_workers=workers, seed=0, output=Output(dtype="uint8"))


def group(name: str, runs: dict[str, Callable[[], Items]], rounds: int) -> dict[str, dict]:
    print(f"\n{name}:", flush=True)
    timed = {k: Timed(v) for k, v in runs.items()}
    results = measure_side_by_side(timed, repeats=rounds)  # type: ignore[arg-type]
    out = {}
    for r in results:
        t = timed[r.name]
        cpu, tree = (1e3 * np.array(v[-rounds:]) for v in (t.cpu, t.tree))  # not the warm-up
        rates = r.rates or [r.items / s for s in r.seconds]
        out[r.name] = {"rate": r.rate, "seconds": r.seconds, "items": r.items,
                       "main_cpu_ms_per_image": float(np.median(cpu)),
                       "cpu_ms_per_image": float(np.median(tree)),
                       "rounds": {"rate": rates, "cpu_ms_per_image": tree.tolist()}}
    return out


def photo_group(data: Path, label: str, n: int, crop: str, rounds: int) -> dict[str, dict]:
    paths = packed(data, label, n)
    blobs = [p.read_bytes() for p in sorted(paths["photos"].rglob("*.jpg"))]
    boxes = plan(blobs, crop)
    ctx = mp.get_context("spawn")
    with ctx.Pool(WORKERS, initializer=_init, initargs=(blobs, boxes)) as pool:
        runs: dict[str, Callable[[], Items]] = {
            "kernel full-decode 1p": lambda: kernel(blobs, boxes, False),
            "kernel 1p": lambda: kernel(blobs, boxes, True),
            f"kernel {WORKERS}p": lambda: sum(pool.starmap(_pool_kernel,
                                                           [(True, p) for p in range(WORKERS)])),
        }
        loaders = {}
        for fmt in (k for k in paths if k != "photos"):
            for w in (0, WORKERS):
                ld = loaders[f"{fmt} w{w}"] = loader(paths[fmt], crop, w)
                runs[f"feedpipe {fmt} workers={w}"] = lambda ld=ld: drain(ld)
        res = group(f"{label} photos, {crop}, {n} images", runs, rounds)
        del loaders
    if label == "web":
        res["mix"] = jpeg_mix(sorted(paths["photos"].rglob("*.jpg")))
        print(f"web photo mix: {res['mix']}", flush=True)
    return res


def raw_group(data: Path, n: int, rounds: int) -> dict[str, dict]:
    paths = packed(data, "500x375", n, store="raw")
    runs = {f"raw lmdb workers={w}": (lambda ld=loader(paths["lmdb"], "center_crop", w):  # noqa: B008
                                      drain(ld)) for w in (0, WORKERS)}
    auto = feedpipe.make_loader(paths["lmdb"], BATCH, size=SIZE, device="cpu",
                                output=Output(dtype="uint8"))
    res = group(f"raw uint8 LMDB (stored {SIZE}px), {n} images", runs, rounds)
    res["auto_workers"] = {"num_workers": auto.config.num_workers}  # type: ignore[attr-defined]
    return res


def paired(a: dict, b: dict, key: str, invert: bool = False) -> float:
    """The median over rounds of ``a``'s figure ÷ ``b``'s in the same round (``b`` ÷ ``a`` with
    ``invert``): each ratio is taken seconds apart, so a slow spell of the VM between rounds
    moves both sides of it alike."""
    num, den = np.array(a["rounds"][key]), np.array(b["rounds"][key])
    return float(np.median(den / num if invert else num / den))


def ratios(res: dict[str, dict]) -> dict[str, float]:
    """In-process: CPU per image over the kernel's (and wall-clock cost); workers: rate over
    the 2-process ceiling's, by wall clock and by CPU per image (all processes). Each is the
    median of the rounds' own ratios (:func:`paired`)."""
    k1, kf, kp = (res[f"kernel {s}"] for s in ("1p", "full-decode 1p", f"{WORKERS}p"))
    cpu, rate = "cpu_ms_per_image", "rate"
    out = {}
    for name, r in res.items():
        if name.startswith("feedpipe") and name.endswith("workers=0"):
            out[f"{name}: CPU/img vs kernel"] = paired(r, k1, cpu)
            out[f"{name}: CPU/img vs full-decode kernel"] = paired(r, kf, cpu)
            out[f"{name}: wall cost vs kernel"] = paired(r, k1, rate, invert=True)
        elif name.startswith("feedpipe"):
            out[f"{name}: wall share of {WORKERS}p ceiling"] = paired(r, kp, rate)
            out[f"{name}: CPU share of {WORKERS}p ceiling"] = paired(r, kp, cpu, invert=True)
    for w in (0, WORKERS):  # web photos: what storing progressive JPEGs as baseline gains,
        keep = res.get(f"feedpipe lmdb jpeg=keep workers={w}")  # and how near the all-baseline
        if keep is not None:  # control it comes (the goal: within 10%)
            out[f"feedpipe lmdb workers={w}: rate vs jpeg=keep"] = \
                paired(res[f"feedpipe lmdb workers={w}"], keep, rate)
        control = res.get(f"feedpipe lmdb all-baseline workers={w}")
        if control is not None:
            out[f"feedpipe lmdb workers={w}: rate vs all-baseline control"] = \
                paired(res[f"feedpipe lmdb workers={w}"], control, rate)
            out[f"feedpipe lmdb workers={w}: CPU/img vs all-baseline control"] = \
                paired(res[f"feedpipe lmdb workers={w}"], control, cpu)
    return out


def raw_ratios(res: dict[str, dict]) -> dict[str, float]:
    w0, w2 = res["raw lmdb workers=0"], res[f"raw lmdb workers={WORKERS}"]
    return {f"raw lmdb workers={WORKERS}: in-process rate / workers rate":
                paired(w0, w2, "rate"),
            f"raw lmdb workers={WORKERS}: CPU/img vs in-process":
                paired(w2, w0, "cpu_ms_per_image")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=1024,
                    help="~500x375 photos (16 batches: an epoch of ~0.5 s with 2 workers)")
    ap.add_argument("--large-images", type=int, default=512,
                    help="1280x853 photos (8 batches: 4 a worker, so an epoch is not all fill)")
    ap.add_argument("--raw-images", type=int, default=2048)
    ap.add_argument("--web-images", type=int, default=512,
                    help="web photo mix (the web groups only; 640-4000 px, 40%% progressive)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/kernel.json"))
    ap.add_argument("--groups", nargs="+", choices=GROUPS + WEB_GROUPS, default=list(GROUPS),
                    help="run only these groups (default: all but the web photo groups)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the bare kernel's setting; feedpipe must not need more
    m = machine()
    print(f"machine: {m['cpu']}, {m['usable_cores']} usable cores, torch {m['torch']}, "
          f"simplejpeg {m['simplejpeg']}; {SIZE}² uint8, batch {BATCH}", flush=True)
    groups: dict[str, dict] = {}
    for label, n in (("500x375", args.images), ("1280x853", args.large_images),
                     ("web", args.web_images)):
        for crop in CROPS:
            if f"{label} {crop}" in args.groups:
                groups[f"{label} {crop}"] = photo_group(args.data, label, n, crop, args.rounds)
    if "raw" in args.groups:
        groups["raw"] = raw_group(args.data, args.raw_images, args.rounds)

    print("\n| group | configuration | images/s | CPU ms/img (all processes) | main CPU ms/img | "
          "ratios |\n|---|---|---|---|---|---|")
    table = {}
    for g, res in groups.items():
        rat = ratios(res) if g != "raw" else raw_ratios(res)
        table[g] = rat
        for name, r in res.items():
            if "rate" not in r:
                continue
            rs = [f"{k.split(': ')[1]} {v:.2f}" for k, v in rat.items() if k.startswith(name + ":")]
            print(f"| {g} | {name} | {r['rate']:,.0f} | {r['cpu_ms_per_image']:.3f} | "
                  f"{r['main_cpu_ms_per_image']:.3f} | {'; '.join(rs)} |")
    print(f"load average during the run (1/5/15 min): {psutil.getloadavg()}")
    if "raw" in groups:
        print(f"\nraw: num_workers='auto' picks {groups['raw']['auto_workers']['num_workers']}")
    save(args.json, [], {"groups": groups, "ratios": table, "args": {
        k: str(v) for k, v in vars(args).items()}, "size": SIZE, "batch": BATCH})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
