"""Run under torchrun: each rank reads one epoch of a remote dataset through a cache shared by
both ranks and writes its batches' labels and keys to OUT/rank<k>.json."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

import feedpipe

dist.init_process_group("gloo")
url, cache, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
loader = feedpipe.make_loader(url, 4, size=32, dtype="uint8", device="cpu", num_workers=1,
                              fields=["label", "path"], seed=3, cache_dir=cache)
batches = [{"label": b["label"].tolist(), "path": list(b["path"])} for b in loader]
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(batches))
dist.barrier()
dist.destroy_process_group()
