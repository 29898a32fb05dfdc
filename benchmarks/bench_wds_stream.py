"""WebDataset sequential streaming: feedpipe's tar member grouping against ``webdataset``'s own
iterators (``tar_file_iterator`` + ``group_by_keys``), side by side in one run.

Both sides do the same work per shard: read every member, group by key, check the key against
the index, check each member's crc32, refuse unpickling suffixes and decode the stored values.
Only the member iteration and grouping differ. Samples/s, interleaved rounds (harness.py).

    python benchmarks/bench_wds_stream.py [--images 3000] [--shard-count 500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import measure_side_by_side  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.dataset.formats.base import unsafe_name  # noqa: E402
from feedpipe.dataset.formats.wds import WdsReader  # noqa: E402
from feedpipe.errors import CorruptRecordError, UnsafeDataError  # noqa: E402
from feedpipe.schema.codecs import crc32  # noqa: E402


def webdataset_shard(ds: WdsReader, shard: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """:meth:`WdsReader.iter_shard`'s checks over ``webdataset.tariterators`` instead."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    path = ds.root / ds.shards[shard]
    r = ds.shard_ranges()[shard]
    i = r.start
    with open(path, "rb") as fh:
        def files() -> Iterator[dict[str, Any]]:
            for m in tar_file_iterator(fh):
                if unsafe_name(m["fname"]):
                    raise UnsafeDataError(f"{path}: member {m['fname']} would need unpickling")
                yield {**m, "__url__": str(path)}

        for sample in group_by_keys(files()):
            key = sample["__key__"]
            if i >= r.stop or key != ds.key_of(i):
                raise CorruptRecordError(f"{path} key {key}: not where the index has it")
            crcs = ds._crc[i].tolist() if ds._crc is not None else None
            stored = {}
            for c, f in enumerate(ds.schema):
                data = sample[f.wds_suffix]
                if crcs is not None and crc32(data) != crcs[c]:
                    raise CorruptRecordError(f"{path} key {key}: {f.wds_suffix} checksum")
                stored[f.name] = f.decode(data, f"{path} key {key}")
            yield key, stored
            i += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--shard-count", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = make_photos(Path(tmp) / "src", args.images, size=(160, 120), classes=4, seed=0)
        convert(src, Path(tmp) / "wds", to="wds", workers=0,
                writer_options={"shard_count": args.shard_count})
        ds = feedpipe.open_dataset(Path(tmp) / "wds")
        assert isinstance(ds, WdsReader)
        shards = range(len(ds.shards))
        ours = [k for s in shards for k, _ in ds.iter_shard(s)]
        theirs = [k for s in shards for k, _ in webdataset_shard(ds, s)]
        assert ours == theirs and len(ours) == args.images
        print(f"{len(ds)} samples in {len(ds.shards)} shards")
        measure_side_by_side({
            "feedpipe tar_members + group_by_key":
                lambda: sum(1 for s in shards for _ in ds.iter_shard(s)),
            "webdataset tar_file_iterator + group_by_keys":
                lambda: sum(1 for s in shards for _ in webdataset_shard(ds, s)),
        }, repeats=args.rounds)


if __name__ == "__main__":
    main()
