"""Whole-CLI conversion throughput and output size per format (passthrough JPEG), against the I/O
ceiling timed in the same run.

Each round runs the real command, process start to exit, for every format in turn (interleaved, so
a slow spell on a shared machine hits all alike):

    python -m feedpipe.cli convert SRC --to FMT -o OUT --store passthrough -q

and, as the ceiling, two bare loops over the same files: open+read every file, and read + append
the same bytes into one file (fsync'd once at the end, as the LMDB writer and the manifest are).

    python benchmarks/bench_convert.py [--images 20000] [--size 500x375] [--rounds 3]
                                       [--baseline /path/to/other/checkout] [--mix web]
                                       [--also '--check header']

``--also OPTIONS`` runs this checkout once more with those convert options in the same rounds
(e.g. the markers-only JPEG check against the default, which reads every JPEG whole).

``--mix web`` converts web-like photos instead (``converters.synth.make_web_photos``: ~40%
progressive, 4:2:0 and 4:4:4, EXIF orientations, 640-4000 px times ``--web-scale``), so the
progressive->baseline transcode is in the path; each format then also runs with ``--jpeg keep``
(no transcode) in the same rounds, and the difference is the transcode's cost.

The generated photos are cached in ``--data`` (``photos-<N>-<W>x<H>``, ``web-<N>-s<scale>``), so
reruns reuse them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import measure_side_by_side, save  # noqa: E402

FORMATS = ("lmdb", "hdf5", "wds")


def photos(data: Path, n: int, size: tuple[int, int]) -> Path:
    """The cached folder of ``n`` photos, made once (in a temporary folder renamed into place)."""
    from converters.synth import make_photos

    out = data / f"photos-{n}-{size[0]}x{size[1]}"
    if not out.exists():
        tmp = data / f".{out.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        t = time.perf_counter()
        make_photos(tmp, n, size=size, classes=7, seed=1)
        tmp.rename(out)
        print(f"  made {n} photos in {out} ({time.perf_counter() - t:.0f} s)")
    return out


def web_photos(data: Path, n: int, scale: float) -> Path:
    """The cached folder of ``n`` web-like photos (see the module docstring)."""
    from converters.synth import make_web_photos

    out = data / f"web-{n}-s{scale:g}"
    if not out.exists():
        tmp = data / f".{out.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        t = time.perf_counter()
        make_web_photos(tmp, n, classes=7, seed=1, scale=scale)
        tmp.rename(out)
        print(f"  made {n} web photos in {out} ({time.perf_counter() - t:.0f} s)")
    return out


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in files_of(folder))


def cli(src: Path, fmt: str, out: Path, n: int, extra: list[str], code: Path | None = None):
    """A run of the real CLI (a fresh process each time) converting ``src`` to ``out``, with
    feedpipe imported from ``code`` (a checkout) when given."""
    cmd = [sys.executable, "-m", "feedpipe.cli", "convert", str(src.resolve()), "--to", fmt,
           "-o", str(out.resolve()), "--store", "passthrough", "-q", *extra]
    # ``python -m`` puts the working directory first on sys.path: run in the checkout itself
    env = {**os.environ, "PYTHONPATH": str(code.resolve())} if code else None
    cwd = code.resolve() if code else None

    def run() -> int:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
        return n

    return run


def read_all(files: list[Path]):
    def run() -> int:
        for p in files:
            with open(p, "rb") as fh:
                fh.read()
        return len(files)

    return run


def read_write_all(files: list[Path], dest: Path):
    def run() -> int:
        with open(dest, "wb") as out:
            for p in files:
                with open(p, "rb") as fh:
                    out.write(fh.read())
            out.flush()
            os.fsync(out.fileno())
        return len(files)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--size", default="500x375", help="photo size W×H (default 500x375)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mix", choices=("photos", "web"), default="photos",
                    help="photos: all-baseline ~--size photos; web: the web photo mix "
                    "(progressive share transcoded), also run with --jpeg keep")
    ap.add_argument("--web-scale", type=float, default=0.5,
                    help="--mix web: photo sides times this (1.0: 640-4000 px)")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--cli-args", default="", help="extra convert options, e.g. '--workers 2'")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. main) whose CLI runs in "
                    "the same rounds, for a before/after ratio from one run")
    ap.add_argument("--also", action="append", default=[], metavar="OPTIONS",
                    help="convert options run as one more configuration of this checkout in the "
                    "same rounds (repeatable), e.g. --also='--check header'")
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/convert.json"))
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.lower().split("x"))
    web = args.mix == "web"
    src = web_photos(args.data, args.images, args.web_scale) if web else \
        photos(args.data, args.images, (w, h))
    files = files_of(src)
    bytes_in = sum(p.stat().st_size for p in files)
    print(f"{len(files)} files, {bytes_in / len(files) / 1e3:.1f} kB mean, "
          f"{bytes_in / 1e6:.0f} MB; {args.rounds} interleaved rounds")
    mix = None
    if web:
        from converters.synth import jpeg_mix

        mix = jpeg_mix(files)
        print(f"  web mix: {mix}")
    runs = {"ceiling: open+read every file": read_all(files),
            "ceiling: read + write into one file": read_write_all(files, args.data / "ceiling.bin")}
    outs = {fmt: args.data / f"convert-{fmt}" for fmt in args.formats}
    for fmt, out in outs.items():
        runs[f"CLI convert --to {fmt}"] = cli(src, fmt, out, len(files), args.cli_args.split())
        if web:
            runs[f"CLI convert --jpeg keep --to {fmt}"] = cli(
                src, fmt, args.data / f"convert-keep-{fmt}", len(files),
                [*args.cli_args.split(), "--jpeg", "keep"])
        for k, also in enumerate(args.also):
            runs[f"CLI convert {also} --to {fmt}"] = cli(
                src, fmt, args.data / f"convert-also{k}-{fmt}", len(files),
                [*args.cli_args.split(), *also.split()])
        if args.baseline:
            runs[f"baseline CLI convert --to {fmt}"] = cli(
                src, fmt, args.data / f"convert-baseline-{fmt}", len(files),
                args.cli_args.split(), args.baseline)
    results = measure_side_by_side(runs, repeats=args.rounds)
    (args.data / "ceiling.bin").unlink(missing_ok=True)
    ratios = {fmt: tree_bytes(out) / bytes_in for fmt, out in outs.items()}
    for r in results:
        fmt = r.name.rsplit(" ", 1)[-1]
        if fmt in ratios and r.name.startswith("CLI convert --to"):
            r.note = f"output {ratios[fmt]:.3f}x input bytes"
            print(f"  {fmt:<5} output/input size {ratios[fmt]:.3f}")
    save(args.json, results, {"size_ratio": ratios, "images": len(files), "mix": args.mix,
                              "web_scale": args.web_scale if web else None, "jpeg_mix": mix,
                              "photo_size": None if web else [w, h],
                              "bytes_in": bytes_in, "rounds": args.rounds,
                              "cli_args": args.cli_args, "also": args.also,
                              "baseline": str(args.baseline) if args.baseline else None,
                              "command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
