"""feedpipe against its peers on the same files, side by side in one run.

Each contender (c_*.py) runs in its own process: it packs the source photos into its own format,
then loads epochs on command. Rounds are interleaved across contenders (the order rotates each
round), after one validating warm-up epoch each; while one runs, the others' process trees are
stopped (SIGSTOP), so no idle contender's threads or workers take its CPU. From outside, this
harness records per epoch the CPU time of the contender's whole process tree; the peak PSS
(sampled in a thread) is taken in untimed epochs only (the validating warm-up and one after the
rounds), as sampling costs CPU the kernel never pays. An epoch's images/s is its whole pass
(start-up included); the kernel's is every image over the span from its first process's start to
its last one's end, the same rule. The contender reports count, labels, shapes, dtypes and
per-label channel means, checked here against a reference decode of the same files. The bare
kernel (simplejpeg decode + centre crop + torch antialiased resize) runs in 1 and in 2 processes
(sharing the files, as workers share an epoch) after every round: the ceiling, its median round.

    make bench-peers                       # installs .venv-peers, then runs this with defaults
    .venv-peers/bin/python benchmarks/peers/run.py [--images 4000] [--large-images 1000]
        [--web-images 1000] [--rounds 3] [--only ffcv,feedpipe] [--json benchmarks/results/peers.json]

``--web-images N`` adds a set with the JPEG properties of web photo collections (40% progressive,
4:2:0 and 4:4:4, EXIF orientations, 640-4000 px, quality 75-95: converters.synth.make_web_photos,
mix in benchmarks/README.md); its measured mix is recorded with the set. Not run by default.
With it, the all-baseline control (``--no-web-control`` skips it): the same photos, the
progressive ones saved baseline (same pixels and sizes), loaded by the feedpipe contenders only;
the report gives each one's rate on the mix ÷ its rate on the control (the goal: ≥ 0.9).

``--recipe imagenet`` runs the standard ImageNet training recipe instead of the centre crop
(random-resized-crop, flip, ColorJitter(0.4, 0.4, 0.4), normalize, RandomErasing(0.25), float32
out) through the contenders that have it (r_*.py: the hand-tuned DataLoader with torchvision's
recipe, FFCV's nearest pipeline, feedpipe's built-in operations). Random crops have no reference
decode: those epochs are checked for count, labels, shapes and dtype only.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]

from measure import (  # noqa: E402
    PeakPss,
    kernel_ceiling,
    main_cpu_seconds,
    paused,
    reference_means,
    tree_cpu_seconds,
)

from feedpipe.tools.throughput import throughput  # noqa: E402

# name -> (script and its arguments, needs the torchvision shim)
CONTENDERS: dict[str, tuple[list[str], bool]] = {
    "hand-tuned DataLoader": (["c_dataloader.py"], False),
    "FFCV": (["c_ffcv.py"], False),
    "WebDataset": (["c_webdataset.py"], False),
    "LitData": (["c_litdata.py"], True),
    "Mosaic Streaming": (["c_mosaic.py"], True),
    "feedpipe LMDB": (["c_feedpipe.py", "--format", "lmdb"], False),
    "feedpipe WebDataset": (["c_feedpipe.py", "--format", "wds"], False),
    "feedpipe HDF5": (["c_feedpipe.py", "--format", "hdf5"], False),
}
# --recipe imagenet: the same names, the recipe's scripts (r_*.py)
RECIPE_CONTENDERS: dict[str, tuple[list[str], bool]] = {
    "hand-tuned DataLoader": (["r_dataloader.py"], False),
    "FFCV": (["r_ffcv.py"], False),
    "feedpipe LMDB": (["r_feedpipe.py", "--format", "lmdb"], False),
    "feedpipe WebDataset": (["r_feedpipe.py", "--format", "wds"], False),
    "feedpipe HDF5": (["r_feedpipe.py", "--format", "hdf5"], False),
}
BASELINE, FFCV = "hand-tuned DataLoader", "FFCV"
GOAL_X_FFCV = 1.5
PACKAGES = ("torch", "numpy", "pillow", "simplejpeg", "ffcv", "numba", "opencv-python",
            "webdataset", "litdata", "mosaicml-streaming", "feedpipe", "psutil")


class Contender:
    """One contender's process: started (and packing) on creation, then driven epoch by epoch."""

    def __init__(self, name: str, items: Path, work: Path, classes: int, args: argparse.Namespace,
                 log: Path) -> None:
        script, shim = args.table[name]
        path = [str(HERE), str(ROOT)] + ([str(HERE / "shims")] if shim else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.name, self.timeout, self.log = name, args.timeout, log
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / script[0]), *script[1:], "--items", str(items), "--work",
             str(work), "--classes", str(classes), "--size", str(args.size), "--batch",
             str(args.batch), "--workers", str(args.workers)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"), cwd=ROOT,
            env=env, text=True)

    def reply(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name}: no reply (exit {self.proc.poll()}); log "
                               f"{self.log}:\n{tail}")
        return json.loads(line)

    def epoch(self, validate: bool, pss: bool = False) -> dict:
        """One epoch, with the process tree's CPU seconds measured around it, and its peak PSS
        when ``pss``: sampling PSS walks every page table of the tree (~9 ms of system time a
        sample on a 2-core VM, a fifth of a core at 10 Hz), which the kernel ceiling never pays,
        so timed epochs run without it (the same rule for every contender and the kernel)."""
        pid = self.proc.pid
        cpu0, main0 = tree_cpu_seconds(pid), main_cpu_seconds(pid)
        with PeakPss(pid) if pss else nullcontext() as sampler:
            self.proc.stdin.write("epoch validate\n" if validate else "epoch\n")
            self.proc.stdin.flush()
            rep = self.reply()
        rep["cpu_s"] = tree_cpu_seconds(pid) - cpu0
        rep["main_cpu_s"] = main_cpu_seconds(pid) - main0  # the rest is its workers'
        rep["peak_pss"] = sampler.peak if pss else None
        return rep

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def check(rep: dict, n: int, labels: list[int], ref: list[list[float]] | None, size: int,
          tol: float, dtype: str = "uint8") -> tuple[list[str], float | None]:
    """What is wrong with one epoch's report (empty when nothing), and the largest per-label
    channel-mean difference from the reference decode (validating epochs only)."""
    bad = []
    if rep["n"] != n:
        bad.append(f"{rep['n']} samples, expected {n}")
    if rep["labels"] != labels:
        bad.append(f"label counts {rep['labels']}, expected {labels}")
    if rep["shapes"] != [str((3, size, size))]:
        bad.append(f"image shapes {rep['shapes']}, expected {[str((3, size, size))]}")
    if rep["dtypes"] != [dtype]:
        bad.append(f"dtypes {rep['dtypes']}, expected {[dtype]}")
    diff = None
    if ref is not None and "class_means" in rep:
        diff = max(abs(a - b) for ra, rb in zip(rep["class_means"], ref, strict=True)
                   for a, b in zip(ra, rb, strict=True))
        if diff > tol:
            bad.append(f"per-label channel means differ from the reference by {diff:.2f} > {tol}")
    return bad, diff


def run_set(label: str, photos: Path, args: argparse.Namespace) -> dict:
    """Everything for one photo set: reference, kernel ceiling, contenders, rounds."""
    from converters import scan

    src = scan(photos)
    items = [(str(i.path), i.label) for i in src.items]
    classes = len(src.classes)
    counts = [sum(1 for _, y in items if y == c) for c in range(classes)]
    work = args.data / f"{label}-{len(items)}"
    work.mkdir(parents=True, exist_ok=True)
    items_file = work / "items.json"
    items_file.write_text(json.dumps(items))
    print(f"\n== {label}: {len(items)} photos in {photos}, {classes} classes", flush=True)
    ref = reference_means(items, classes, args.size, args.workers)
    files = [p for p, _ in items]
    kern = {f"{p}p": kernel_ceiling(files, args.size, p) for p in (1, args.workers)}
    for k, v in kern.items():
        print(f"  bare kernel, {k}: {v['images_per_s']:,.0f} images/s, "
              f"{v['cpu_ms_per_image']:.2f} CPU ms/image", flush=True)
    out: dict = {"images": len(items), "classes": classes, "label_counts": counts,
                 "source_mib": sum(Path(f).stat().st_size for f in files) / 2 ** 20,
                 "kernel": kern, "reference_class_means": ref, "contenders": {}}
    kern_rounds: dict[str, list[dict[str, float]]] = {k: [] for k in kern}
    procs: dict[str, Contender] = {}
    for name in args.contenders:  # pack one at a time: packing is timed too
        slug = name.lower().replace(" ", "-").replace("-dataloader", "")
        c = Contender(name, items_file, work / slug, classes, args, work / f"{slug}.log")
        try:
            out["contenders"][name] = {"pack_s": c.reply()["pack_s"], "rounds": [], "errors": [],
                                       "packed_mib": _size(work / slug) / 2 ** 20}
            procs[name] = c
            print(f"  packed {name} in {out['contenders'][name]['pack_s']:.1f} s", flush=True)
        except RuntimeError as exc:
            out["contenders"][name] = {"failed": str(exc)}
            print(f"  FAILED {name}: {exc}", flush=True)
    try:
        for name, c in list(procs.items()):  # warm-up epoch: validates, and its startup time
            res = out["contenders"][name]
            try:
                with paused([o.proc.pid for o in procs.values() if o is not c]):
                    rep = c.epoch(validate=True, pss=True)
            except RuntimeError as exc:
                res["failed"] = str(exc)
                del procs[name]
                continue
            bad, diff = check(rep, len(items), counts, None if args.recipe else ref, args.size,
                              args.tol, "float32" if args.recipe else "uint8")
            res.update(startup_s=rep["first_batch_s"], warmup=rep, mean_diff=diff, errors=bad)
            shown = "-" if diff is None else f"{diff:.2f}"
            print(f"  warm-up {name}: {'OK' if not bad else 'INVALID: ' + '; '.join(bad)} "
                  f"(max channel-mean diff {shown})", flush=True)
        names = list(procs)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                if name not in procs:
                    continue
                res = out["contenders"][name]
                try:
                    with paused([o.proc.pid for n, o in procs.items() if n != name]):
                        rep = procs[name].epoch(validate=False)
                except RuntimeError as exc:
                    res["failed"] = str(exc)
                    del procs[name]
                    continue
                res["errors"] += check(rep, len(items), counts, None, args.size, args.tol,
                                       "float32" if args.recipe else "uint8")[0]
                th = throughput(rep["waits"], rep["steps"], rep["rows"], args.workers)
                res["rounds"].append({**{k: rep[k] for k in ("n", "seconds", "first_batch_s",
                                                              "cpu_s", "main_cpu_s")},
                                      "images_per_s": th.epoch_samples_per_s,
                                      "steady_images_per_s": th.samples_per_s})
            with paused([o.proc.pid for o in procs.values()]):
                for k in kern:  # the ceiling in every round too, beside the contenders
                    kern_rounds[k].append(kernel_ceiling(files, args.size, int(k[:-1])))
            print(f"  round {r + 1}/{args.rounds} done", flush=True)
        for name, c in procs.items():  # peak PSS after the timed rounds, in an untimed epoch
            with paused([o.proc.pid for o in procs.values() if o is not c]):
                out["contenders"][name]["memory_epoch"] = c.epoch(validate=False, pss=True)
    finally:
        for c in procs.values():
            c.close()
    for k, runs in kern_rounds.items():  # the median round, as for the contenders
        if runs:
            kern[k] = {m: statistics.median(r[m] for r in runs) for m in runs[0]}
    out["kernel_rounds"] = kern_rounds
    summarize(out)
    return out


def _size(path: Path) -> int:
    """Bytes on disk under ``path`` (0 when the contender packs nothing)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def summarize(out: dict) -> None:
    """Medians per contender, ratios to the hand-tuned DataLoader and to FFCV, and the table."""
    for res in out["contenders"].values():
        rounds = res.get("rounds") or []
        if not rounds:
            continue
        res["images_per_s"] = statistics.median(r["images_per_s"] for r in rounds)
        res["cpu_ms_per_image"] = statistics.median(1e3 * r["cpu_s"] / r["n"] for r in rounds)
        res["main_cpu_ms_per_image"] = statistics.median(1e3 * r["main_cpu_s"] / r["n"]
                                                         for r in rounds)
        res["first_batch_s"] = statistics.median(r["first_batch_s"] for r in rounds)
        res["peak_pss_mib"] = max(res[e]["peak_pss"] for e in ("warmup", "memory_epoch")
                                  if e in res) / 2 ** 20
        res["valid"] = not res["errors"]
    rate = {n: r.get("images_per_s") for n, r in out["contenders"].items()}
    ceil2 = out["kernel"][max(out["kernel"])]["images_per_s"]
    head = (f"  {'contender':<22} {'images/s':>9} {'x DL':>6} {'x FFCV':>7} {'% ceil':>7} "
            f"{'CPU ms/img':>10} {'PSS MiB':>8} {'startup s':>9} {'1st batch s':>11} "
            f"{'pack s':>7}  valid")
    print("\n" + head + "\n  " + "-" * (len(head) - 2))
    for name, res in out["contenders"].items():
        if "images_per_s" not in res:
            print(f"  {name:<22} failed: {res.get('failed', 'no rounds')[:200]}")
            continue
        r = res["images_per_s"]
        res["x_dataloader"] = r / rate[BASELINE] if rate.get(BASELINE) else None
        res["x_ffcv"] = r / rate[FFCV] if rate.get(FFCV) else None
        res["of_2p_ceiling"] = r / ceil2
        fmt = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        print(f"  {name:<22} {r:>9,.0f} {fmt(res['x_dataloader']):>6} {fmt(res['x_ffcv']):>7} "
              f"{100 * res['of_2p_ceiling']:>6.0f}% {res['cpu_ms_per_image']:>10.2f} "
              f"{res['peak_pss_mib']:>8.0f} {res['startup_s']:>9.2f} {res['first_batch_s']:>11.3f} "
              f"{res['pack_s']:>7.1f}  {'yes' if res['valid'] else 'NO: ' + res['errors'][0]}")
    for k, v in out["kernel"].items():
        print(f"  {'bare kernel ' + k:<22} {v['images_per_s']:>9,.0f} {'':>6} {'':>7} {'':>7} "
              f"{v['cpu_ms_per_image']:>10.2f}")
    ffcv = out["contenders"].get(FFCV, {})
    if "images_per_s" in ffcv:  # the goal: >= 1.5x FFCV at no more peak PSS than FFCV
        for name, res in out["contenders"].items():
            if name.startswith("feedpipe") and "images_per_s" in res:
                res["goal_met"] = (res["x_ffcv"] >= GOAL_X_FFCV
                                   and res["peak_pss_mib"] <= ffcv["peak_pss_mib"])
                # CPU per image holds up better than images/s when the machine is busy
                res["cpu_x_ffcv"] = ffcv["cpu_ms_per_image"] / res["cpu_ms_per_image"]
                print(f"  goal {name}: {res['x_ffcv']:.2f}x FFCV (want >= {GOAL_X_FFCV}; by CPU "
                      f"per image {res['cpu_x_ffcv']:.2f}x), PSS {res['peak_pss_mib']:.0f} vs "
                      f"FFCV {ffcv['peak_pss_mib']:.0f} MiB: "
                      f"{'met' if res['goal_met'] else 'not met'}")


def web_sets(args: argparse.Namespace) -> dict[str, dict]:
    """The web photo mix (``--web-images``) and its all-baseline control (``--web-control``:
    the same photos, the progressive ones saved baseline; the feedpipe contenders only), each
    with its measured JPEG mix."""
    from converters.synth import jpeg_mix, make_web_photos

    out: dict[str, dict] = {}
    n = args.web_images
    for label, progressive in (("web", True), ("web-baseline", False)):
        if n <= 0 or (not progressive and not args.web_control):
            continue
        photos = args.data / f"src-{label}-{n}"
        if not photos.exists():
            print(f"generating {n} web photos (640-4000 px, "
                  f"{'40% progressive' if progressive else 'all baseline'}) in {photos}",
                  flush=True)
            make_web_photos(photos, n, classes=10, seed=1, progressive=progressive)
        run_args = argparse.Namespace(**vars(args))
        if not progressive:
            run_args.contenders = [c for c in args.contenders if c.startswith("feedpipe")]
        out[label] = run_set(label, photos, run_args)
        out[label]["mix"] = jpeg_mix(sorted(photos.rglob("*.jpg")))
        print(f"  {label} photo mix: {out[label]['mix']}", flush=True)
    return out


def web_control(sets: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each feedpipe contender's images/s on the web mix ÷ on the all-baseline control, and
    the control's CPU per image ÷ the mix's (the goal: ≥ 0.9, within 10% of its own speed on
    all-baseline files of the same sizes); printed."""
    mix, ctl = (sets.get(k, {}).get("contenders", {}) for k in ("web", "web-baseline"))
    out = {}
    for name, r in mix.items():
        c = ctl.get(name, {})
        if "images_per_s" in r and "images_per_s" in c:
            out[name] = {"rate_ratio": r["images_per_s"] / c["images_per_s"],
                         "cpu_ratio": c["cpu_ms_per_image"] / r["cpu_ms_per_image"]}
            print(f"  {name} on the web mix vs all-baseline: {out[name]['rate_ratio']:.2f}x the "
                  f"rate ({r['images_per_s']:,.0f} vs {c['images_per_s']:,.0f} images/s), "
                  f"{out[name]['cpu_ratio']:.2f}x by CPU per image (want >= 0.9): "
                  f"{'met' if out[name]['rate_ratio'] >= 0.9 else 'not met'}", flush=True)
    return out


def versions() -> dict[str, str | None]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=4000, help="~450x340 photos (0: skip the set)")
    ap.add_argument("--large-images", type=int, default=1000,
                    help="~1392x928 photos, widths >= 1280 (0: skip the set)")
    ap.add_argument("--web-images", type=int, default=0,
                    help="web photo mix, 640-4000 px, 40%% progressive (0, the default: skip)")
    ap.add_argument("--web-control", action=argparse.BooleanOptionalAction, default=True,
                    help="with --web-images: the same photos all baseline, feedpipe only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated name parts, e.g. ffcv,feedpipe")
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data" / "peers")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "peers.json")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tol", type=float, default=2.0,
                    help="largest allowed per-label channel-mean difference from the reference")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for one reply")
    ap.add_argument("--recipe", choices=("imagenet",), default=None,
                    help="the ImageNet training recipe instead of the centre crop (r_*.py)")
    args = ap.parse_args()
    wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    args.table = RECIPE_CONTENDERS if args.recipe else CONTENDERS
    args.contenders = [n for n in args.table if not wanted or any(w in n.lower() for w in wanted)]
    from harness import machine

    from converters.synth import make_photos

    t0 = time.perf_counter()
    sets = {}
    for label, n, size in (("photos", args.images, (450, 340)),
                           ("large", args.large_images, (1392, 928))):
        if n <= 0:
            continue
        photos = args.data / f"src-{label}-{n}-{size[0]}x{size[1]}"
        if not photos.exists():
            print(f"generating {n} photos (~{size[0]}x{size[1]}, quality 90) in {photos}",
                  flush=True)
            make_photos(photos, n, size=size, classes=10, quality=90, seed=1)
        sets[label] = run_set(label, photos, args)
    sets.update(web_sets(args))
    control = web_control(sets)
    from feedpipe.paths import write_atomic

    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.json, json.dumps({
        "machine": machine(), "versions": versions(), "load_average": os.getloadavg(),
        "task": {"size": args.size, "batch": args.batch, "workers": args.workers,
                 "recipe": args.recipe,
                 "rounds": args.rounds, "tolerance": args.tol}, "sets": sets,
        "web_vs_all_baseline": control,
        "wall_s": time.perf_counter() - t0}, indent=1).encode())
    print(f"\nwrote {args.json} ({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
