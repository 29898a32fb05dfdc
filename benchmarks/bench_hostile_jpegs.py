"""What one hostile JPEG costs: peak RSS and seconds of the real CLI converting a folder that holds
it, and of one loader epoch over a dataset that holds it, with this checkout and (``--baseline``)
another one, in the same run.

The files (tests/hostile_jpegs.py makes them):

- ``scan bomb``: a valid progressive JPEG of SIDE² pixels in 2,647 nearly empty scans (every scan
  decodes every block of its component again);
- ``scan bomb, stray byte``: the same with one byte before its first scan (simplejpeg refuses
  it, so it went to Pillow);
- ``claims 16000²``: a ~10 KB progressive file whose header claims 16000×16000;
- ``progressive SIDE²``: a smooth progressive photo (a small one scaled up), the transcode to
  baseline's worst case;
- ``control: a good photo`` (640×480): the process start-up and import time each figure includes.

Each conversion runs ``python -m feedpipe.cli convert SRC --to lmdb -o OUT --workers 0 -q`` in a
fresh process, its peak RSS taken from ``getrusage(RUSAGE_CHILDREN)`` of a wrapper process. The
loader epoch (batch 1, size 224, ``on_error="skip"``, no workers) reads an LMDB dataset holding a
good photo and the file, packed directly with the writer (an older converter stored such files;
this one refuses them), so both loaders meet it.

    python benchmarks/bench_hostile_jpegs.py [--baseline /path/to/checkout] [--side 4096]
                                             [--timeout 300] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from hostile_jpegs import (  # noqa: E402
    big_progressive,
    claims,
    encode,
    packed,
    photo,
    scan_bomb,
    with_byte_before_first_scan,
)

# runs argv, then prints its exit code, wall seconds, peak RSS (MB) of it and its children
_WRAP = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
try:
    p = subprocess.run(sys.argv[2:], capture_output=True, text=True, timeout=float(sys.argv[1]))
    rc, out = p.returncode, (p.stdout + p.stderr)[-400:]
except subprocess.TimeoutExpired:
    rc, out = "timeout", ""
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t, "peak_mb": peak, "out": out}))
"""

_EPOCH = """
import sys, warnings, feedpipe
warnings.simplefilter("ignore")
ld = feedpipe.make_loader(sys.argv[1], 1, size=224, num_workers=0, device="cpu", shuffle=False,
                          workers=feedpipe.Workers(on_error="skip"))
n = sum(len(b["image"]) for b in ld)
print(f"served {n}, skipped {len(ld.skipped)}: {ld.skipped[:1]}")
"""


def files(side: int) -> dict[str, Callable[[], bytes]]:
    """The hostile files, by name, each made when asked for."""
    return {"control: a good photo": lambda: encode(photo(640, 480, seed=2)),
            "scan bomb": lambda: scan_bomb(side, side, 3),
            "scan bomb, stray byte": lambda: with_byte_before_first_scan(scan_bomb(side, side, 3)),
            "claims 16000²": lambda: claims(encode(photo(96, 64), progressive=True), 16000, 16000),
            f"progressive {side}²": lambda: big_progressive(side)}



def run(code: Path, timeout: float, *argv: str) -> dict[str, object]:
    """``python *argv`` with feedpipe imported from ``code``, measured by the wrapper."""
    env = {"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _WRAP, str(timeout), sys.executable, *argv],
                          capture_output=True, text=True, env=env, cwd=code)
    return json.loads(proc.stdout)


def outcome(r: dict[str, object]) -> str:
    """What happened to the hostile file: refused (and why), stored, served or skipped."""
    out = str(r["out"])
    if r["step"] == "convert" and r["rc"] == 0:
        why = out.split("skipped hostile.jpg: ", 1)
        return f"refused: {why[1].splitlines()[0][:70]}" if len(why) == 2 else "stored"
    return out.strip().splitlines()[-1][:90] if out.strip() else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="another checkout, measured in the same run")
    ap.add_argument("--side", type=int, default=4096, help="the bomb's and the photo's side")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--only", help="run the cases whose name contains this")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "hostile-jpegs.json")
    args = ap.parse_args()
    codes = {"this": HERE.parent, **({"baseline": args.baseline.resolve()} if args.baseline
                                     else {})}
    table: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="hostile-jpegs-") as tmp:
        for name, make in files(args.side).items():
            if args.only and args.only not in name:
                continue
            data = make()
            src = Path(tmp) / "src"
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir()
            (src / "hostile.jpg").write_bytes(data)
            (src / "good.jpg").write_bytes(encode(photo(64, 48)))
            for label, code in codes.items():
                out = Path(tmp) / f"out-{label}"
                shutil.rmtree(out, ignore_errors=True)
                conv = run(code, args.timeout, "-m", "feedpipe.cli", "convert", str(src),
                           "--to", "lmdb", "-o", str(out), "--workers", "0", "-q")
                table.append({"file": name, "bytes": len(data), "code": label, "step": "convert",
                              **conv})
            if "progressive" in name:
                continue
            stored = packed(Path(tmp) / f"ds-{len(table)}", data)
            for label, code in codes.items():
                epoch = run(code, args.timeout, "-c", _EPOCH, str(stored))
                table.append({"file": name, "bytes": len(data), "code": label,
                              "step": "load one epoch", **epoch})
    print(f"{'file':24} {'step':40} {'code':9} {'rc':>7} {'seconds':>8} {'peak MB':>8}  what")
    for r in table:
        print(f"{r['file']:24} {r['step']:40} {r['code']:9} {r['rc']!s:>7} "
              f"{r['seconds']:8.2f} {r['peak_mb']:8.0f}  {outcome(r)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"side": args.side, "runs": table}, indent=1))


if __name__ == "__main__":
    main()
