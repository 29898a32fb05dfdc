"""Run under torchrun: each rank loads one epoch and writes what it saw to OUT/rank<k>.json."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

import feedpipe
from feedpipe import Output

dist.init_process_group("gloo")
data, out = sys.argv[1], Path(sys.argv[2])
loader = feedpipe.make_loader(data, 4, size=32, device="cpu", num_workers=1,
                              fields=["path"], seed=3, output=Output(dtype="uint8"))
paths = [p for batch in loader for p in batch["path"]]
counts = [0, 0]
dist.all_gather_object(counts, len(loader))
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(
    {"paths": paths, "batches": len(loader), "all_batches": counts,
     "world": [loader.world.rank, loader.world.size]}))
dist.barrier()
dist.destroy_process_group()
