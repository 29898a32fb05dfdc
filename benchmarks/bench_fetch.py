"""Fetch path: feedpipe.storage.download (fsspec/s3fs ranged GETs, 16 MiB each) from moto's S3
server on 127.0.0.1 (tests/servers.py): wall MB/s, and the client process's CPU seconds per GB
fetched (``time.process_time``: every thread of this process, fsspec's event loop included; the
server is another process). Run: ``PYTHONPATH=. python benchmarks/bench_fetch.py [--mb 64]
[--rounds 3] [--out benchmarks/results/fetch.json]``."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import MotoServer, s3_options  # noqa: E402

from feedpipe.storage import download, filesystem  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=64, help="object size in MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).with_name("results") / "fetch.json")
    args = ap.parse_args()
    size = args.mb << 20
    moto = MotoServer()
    try:
        opts = s3_options(moto.url)
        url = "s3://bench/blob"
        fs, _ = filesystem(url, opts)
        fs.mkdir("bench")
        fs.pipe_file("bench/blob", os.urandom(size))
        wall: list[float] = []
        cpu: list[float] = []
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "part"
            download(url, Path(tmp) / "warm", 1 << 20, opts)  # untimed: session, connection
            for _ in range(args.rounds):
                part.unlink(missing_ok=True)
                c, t = time.process_time(), time.perf_counter()
                download(url, part, size, opts)
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                assert part.stat().st_size == size
        res = {"MB_per_s": round(args.mb / statistics.median(wall), 1),
               "cpu_s_per_GB": round(statistics.median(cpu) / (size / 1e9), 2),
               "wall_s": [round(x, 3) for x in wall], "cpu_s": [round(x, 3) for x in cpu],
               "note": f"{args.mb} MiB object, {args.rounds} rounds, feedpipe.storage.download "
                       "(16 MiB ranged GETs) from moto on 127.0.0.1; CPU is this process's "
                       "(all threads), not the server's"}
        print(json.dumps(res, indent=1))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
