"""Fetch path: feedpipe.storage.download (fsspec/s3fs ranged GETs) against obstore's ranged GETs,
side by side from moto's S3 server on 127.0.0.1 (tests/servers.py), alternating rounds.

Decides whether obstore goes on the fetch path (issue 15: only if measured faster). Run:
``PYTHONPATH=. python benchmarks/bench_fetch.py [MB] [rounds]``; writes
benchmarks/results/fetch.json."""

from __future__ import annotations

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
from feedpipe.storage.transfer import CHUNK  # noqa: E402


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    size = mb << 20
    moto = MotoServer()
    try:
        opts = s3_options(moto.url)
        fs, _ = filesystem("s3://bench", opts)
        fs.mkdir("bench")
        fs.pipe_file("bench/blob", os.urandom(size))
        import obstore
        from obstore.store import S3Store

        store = S3Store("bench", endpoint=moto.url, access_key_id="testing",
                        secret_access_key="testing", region="us-east-1",
                        client_options={"allow_http": True})
        times: dict[str, list[float]] = {"fsspec": [], "obstore": []}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(rounds):
                part = Path(tmp) / "part"
                part.unlink(missing_ok=True)
                t = time.perf_counter()
                download("s3://bench/blob", part, size, opts)
                times["fsspec"].append(time.perf_counter() - t)
                t = time.perf_counter()
                with open(Path(tmp) / "obs", "wb") as out:
                    for start in range(0, size, CHUNK):
                        out.write(obstore.get_range(store, "blob", start=start,
                                                    end=min(start + CHUNK, size)))
                times["obstore"].append(time.perf_counter() - t)
        res = {k: {"MB_per_s": round(mb / statistics.median(v), 1), "runs_s": v}
               for k, v in times.items()}
        res["obstore_over_fsspec"] = round(res["obstore"]["MB_per_s"]
                                           / res["fsspec"]["MB_per_s"], 3)
        res["note"] = (f"{mb} MiB object, {rounds} alternating rounds, moto on 127.0.0.1, "
                       "2-core machine shared with other jobs: ratios only")
        print(json.dumps(res, indent=1))
        out = Path(__file__).with_name("results") / "fetch.json"
        out.write_text(json.dumps(res, indent=1) + "\n")
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
