"""Run under torchrun: each rank reads one epoch of a remote dataset through the cache CACHE
(shared by the ranks of one node) and writes its batches' labels and keys to OUT/rank<k>.json.
OPTIONS, when given, is make_loader's storage_options as JSON (S3 credentials, HTTP headers).

usage: remote_probe.py URL CACHE OUT [OPTIONS]
"""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import feedpipe
from feedpipe import Output, Remote

dist.init_process_group("gloo")
url, cache, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
loader = feedpipe.make_loader(Remote(url, cache_dir=cache, storage_options=options), 4, size=32,
                              device="cpu", num_workers=1,
                              fields=["label", "path"], seed=3, output=Output(dtype="uint8"))
batches = [{"label": b["label"].tolist(), "path": list(b["path"])} for b in loader]
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(batches))
dist.barrier()
dist.destroy_process_group()
# Leave without interpreter finalization (gloo teardown abort, pytorch/pytorch#179291): the test
# checks the files written above.
sys.stdout.flush()
os._exit(0)
