"""Fetch path: feedpipe.storage.download through each client (``backend="fsspec"``: s3fs ranged
GETs; ``backend="obstore"``: obstore's), side by side from moto's S3 server on 127.0.0.1
(tests/servers.py), alternating which goes first each round.

Per client: wall MB/s, and the client process's CPU seconds per GB fetched (``time.process_time``:
every thread of this process, so fsspec's event loop and obstore's runtime threads count; the
server is another process). Decides whether obstore goes on the fetch path (only if
measured faster). Run: ``PYTHONPATH=. python benchmarks/bench_fetch.py [--mb 64] [--rounds 3]
[--out benchmarks/results/fetch.json]``."""

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
from feedpipe.storage.fetch import obstore_spec  # noqa: E402

BACKENDS = ("fsspec", "obstore")


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
        spec = obstore_spec(url, opts)
        if isinstance(spec, str):
            raise SystemExit(f"obstore cannot read {url} with these options: {spec}")
        fs, _ = filesystem(url, opts)
        fs.mkdir("bench")
        fs.pipe_file("bench/blob", os.urandom(size))
        wall: dict[str, list[float]] = {b: [] for b in BACKENDS}
        cpu: dict[str, list[float]] = {b: [] for b in BACKENDS}
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "part"
            for backend in BACKENDS:  # untimed: each client's session and connection set up
                download(url, Path(tmp) / f"warm-{backend}", 1 << 20, opts, backend=backend)
            for r in range(args.rounds):
                for backend in BACKENDS if r % 2 == 0 else BACKENDS[::-1]:
                    part.unlink(missing_ok=True)
                    c, t = time.process_time(), time.perf_counter()
                    download(url, part, size, opts, backend=backend)
                    wall[backend].append(time.perf_counter() - t)
                    cpu[backend].append(time.process_time() - c)
                    assert part.stat().st_size == size
        gb = size / 1e9
        res: dict[str, object] = {
            b: {"MB_per_s": round(args.mb / statistics.median(wall[b]), 1),
                "cpu_s_per_GB": round(statistics.median(cpu[b]) / gb, 2),
                "wall_s": [round(x, 3) for x in wall[b]],
                "cpu_s": [round(x, 3) for x in cpu[b]]} for b in BACKENDS}
        fsspec, obstore = res["fsspec"], res["obstore"]
        assert isinstance(fsspec, dict) and isinstance(obstore, dict)
        res["obstore_over_fsspec_MB_per_s"] = round(obstore["MB_per_s"] / fsspec["MB_per_s"], 3)
        res["obstore_over_fsspec_cpu_per_GB"] = round(
            obstore["cpu_s_per_GB"] / max(fsspec["cpu_s_per_GB"], 1e-9), 3)
        res["note"] = (f"{args.mb} MiB object, {args.rounds} rounds alternating which client "
                       "goes first, feedpipe.storage.download (16 MiB ranged GETs) from moto on "
                       "127.0.0.1; CPU is this process's (all threads), not the server's")
        print(json.dumps(res, indent=1))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
