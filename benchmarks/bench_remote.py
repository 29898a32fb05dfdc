"""The write side of remote datasets: ``convert -o s3://...`` against the same conversion to a local
folder, and against converting locally then uploading the folder (no overlap), through moto's S3
server on 127.0.0.1 (tests/servers.py), in interleaved rounds:

    python benchmarks/bench_remote.py [--images 12000] [--size 500x375] [--rounds 3]

Figures: images/s of each way (the same passthrough JPEG conversion, in-process, 2 workers), bytes
stored remotely against the local dataset's size (each byte uploaded once). Resume after a kill
is tested, not timed (tests/test_remote_convert.py).

Then the read side, through the fault proxy in front of moto with a link cap (``--caps``,
bytes/s, shared by all GETs at once): per round, one ``make_loader`` epoch cold (an empty cache)
and one warm (the cache kept), against the same dataset read locally, and the shard bytes
fetched per epoch; medians over ``--rounds``. The cold goal is min(local, cap, server) ÷ the
mean sample size, where "server" is what moto delivers through the proxy uncapped (every shard
fetched by 2 threads at once, timed in the same run): a cap above it does not bind. moto and
the proxy run on the loader's cores, so each epoch also records the loader's CPU per image and
the servers' CPU seconds: what the cold epoch loses to the servers, and what to its own fetching.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests"))
import psutil  # noqa: E402
from harness import measure_side_by_side, save  # noqa: E402
from servers import FaultServer, MotoServer, s3_options, upload_tree  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.dataset.manifest import Manifest  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=12000)
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=4 << 20,
                    help="bytes (feedpipe's default is 256 MiB): ~110 shards, so the first "
                         "shuffle window (8 shards) is ~7%% of an epoch; moto spends ~2.3 ms of "
                         "CPU a GET on the loader's cores, a quarter as often as with 1 MiB")
    ap.add_argument("--caps", default="20e6,1e9", help="link caps, bytes/s")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "remote.json")
    a = ap.parse_args()
    w, h = (int(v) for v in a.size.split("x"))
    work = Path(tempfile.mkdtemp(prefix="feedpipe-bench-remote-"))
    moto = MotoServer()
    try:
        import fsspec

        opts = s3_options(moto.url)
        fs = fsspec.filesystem("s3", **opts)
        fs.mkdir("bench")
        src = make_photos(work / "src", a.images, size=(w, h), classes=4, seed=0)
        wo = {"shard_size": a.shard_size}
        local, n = work / "local", {"i": 0}

        def to_local() -> int:
            return convert(src, local, to="wds", workers=2, overwrite=True,
                           writer_options=wo).written

        def to_s3() -> int:
            return convert(src, "s3://bench/ds", to="wds", workers=2, overwrite=True,
                           writer_options=wo, storage_options=opts).written

        def local_then_upload() -> int:
            n["i"] += 1
            written = convert(src, work / "staged", to="wds", workers=2, overwrite=True,
                              writer_options=wo).written
            upload_tree(work / "staged", f"s3://bench/copy{n['i']}", opts)
            return written

        results = measure_side_by_side({"convert -> local folder": to_local,
                                        "convert -> s3:// (streamed uploads)": to_s3,
                                        "convert local, then upload": local_then_upload},
                                       repeats=a.rounds, warmup=0)
        m = Manifest.read(local)
        fs.invalidate_cache()
        stored = sum(fs.info(f"bench/ds/{f.name}")["size"] for f in m.files)
        reads = read_side(local, moto, opts, [float(c) for c in a.caps.split(",")],
                          a.batch_size, a.rounds, work)
        extra = {"read": reads, "images": a.images, "size": a.size, "shard_size": a.shard_size,
                 "dataset_bytes": sum(f.size for f in m.files), "stored_bytes": stored,
                 "files": len(m.files),
                 "note": "loaded shared 2-core machine; moto S3 server on loopback"}
        save(a.out, results, extra)
        print(json.dumps(extra, indent=1))
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)


def cpu(procs: list[psutil.Process]) -> float:
    """CPU seconds (user + system) of ``procs`` and their children."""
    total = 0.0
    for p in procs:
        for q in [p, *p.children(recursive=True)]:
            try:
                total += sum(q.cpu_times()[:2])
            except psutil.Error:
                pass
    return total


def epoch(source: object, bs: int, servers: list[psutil.Process] | None = None,
          **kw: object) -> tuple[float, ...]:
    """Images/s of one whole epoch (loader start included: a cold epoch pays its first fetch),
    images/s after the first batch, seconds to the first batch, the main process's CPU ms per
    image, and the servers' CPU seconds in the epoch (moto and the proxy run on the same cores
    as the loader)."""
    me = psutil.Process()  # the main process only: workers may exit before the epoch ends

    def own() -> float:
        return sum(me.cpu_times()[:2])

    c0, s0, t = own(), cpu(servers or []), time.perf_counter()
    n, first = 0, None
    if kw:  # a URL with its cache and storage options
        source = feedpipe.Remote(source, **kw)  # type: ignore[arg-type]
    for b in feedpipe.make_loader(source, bs, size=224, num_workers=2,  # type: ignore[arg-type]
                                  shuffle=True, seed=0):
        n += len(b["label"])
        if first is None:
            first = (time.perf_counter(), n)
    end = time.perf_counter()
    assert first is not None
    steady = (n - first[1]) / (end - first[0])
    return (n / (end - t), steady, first[0] - t, 1e3 * (own() - c0) / n,
            cpu(servers or []) - s0)


def server_rate(url: str, names: list[str], opts: dict) -> float:
    """Bytes/s the server delivers with no cap: every shard fetched by 2 threads at once."""
    import fsspec

    fs = fsspec.filesystem("s3", **{**opts, "skip_instance_cache": True})
    t = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        n = sum(pool.map(lambda name: len(fs.cat_file(f"{url}/{name}")), names))
    return n / (time.perf_counter() - t)


def read_side(local: Path, moto: MotoServer, opts: dict, caps: list[float], bs: int,
              rounds: int, work: Path) -> list[dict[str, object]]:
    """Per cap: local, cold and warm epochs side by side, and the shard bytes fetched."""
    files = Manifest.read(local).files
    size = sum(f.size for f in files)
    mean = size / len(feedpipe.open_dataset(local))
    shards = [f.name for f in files if f.name.endswith(".tar")]
    proxy = FaultServer(upstream=moto.url)
    servers = [psutil.Process(moto.proc.pid), psutil.Process(proxy.proc.pid)]
    out = []
    try:
        popts = {**opts, "client_kwargs": {"endpoint_url": proxy.url}}
        proxy.faults([])
        epoch(local, bs)  # warm-up: imports, page cache
        server = statistics.median(server_rate("bench/ds", shards, popts) for _ in range(rounds))
        for cap in caps:
            runs: dict[str, list[float]] = {}

            def add(name: str, res: tuple[float, ...],
                    runs: dict[str, list[float]] = runs) -> None:
                for key, v in zip(("", "_after_first_batch", "_first_batch_s",
                                   "_main_cpu_ms_per_image", "_server_cpu_s"), res, strict=True):
                    runs.setdefault(name + key, []).append(v)

            for _ in range(rounds):
                cache = work / f"cache-{cap:g}"
                shutil.rmtree(cache, ignore_errors=True)
                kw = {"cache_dir": cache, "storage_options": popts, "servers": servers}
                add("local", epoch(local, bs))
                proxy.faults([{"kind": "link", "rate": cap}])  # also clears the log
                add("cold", epoch("s3://bench/ds", bs, **kw))
                runs.setdefault("cold_fetched_bytes", []).append(
                    sum(proxy.fetched(".tar").values()))
                proxy.faults([{"kind": "link", "rate": cap}])
                add("warm", epoch("s3://bench/ds", bs, **kw))
                runs.setdefault("warm_fetched_bytes", []).append(
                    sum(proxy.fetched(".tar").values()))
            row: dict[str, object] = {"cap_bytes_per_s": cap, "server_bytes_per_s": server,
                                      "dataset_bytes": size, "mean_sample_bytes": mean,
                                      "rounds": runs}
            med = {k: statistics.median(v) for k, v in runs.items()}
            goal = min(med["local"], cap / mean, server / mean)
            steady = min(med["local_after_first_batch"], cap / mean, server / mean)
            row.update(med, cold_goal=goal, cold_over_goal=med["cold"] / goal,
                       cold_after_first_batch_over_goal=med["cold_after_first_batch"] / steady,
                       warm_over_local=med["warm"] / med["local"],
                       bound="local" if goal == med["local"] else
                       "cap" if goal == cap / mean else "server")
            print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
            out.append(row)
    finally:
        proxy.stop()
    return out


if __name__ == "__main__":
    main()
