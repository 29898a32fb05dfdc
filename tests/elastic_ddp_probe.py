"""Run under torchrun: MODE "pre" reads BATCHES batches of epoch 1 on each rank and rank 0 saves
the state to OUT/state.json; "post" resumes that state; "epoch" reads epoch 1 whole. Each rank
writes what it read to OUT/<MODE>-rank<k>.json.

usage: elastic_ddp_probe.py DATA OUT MODE BATCH_SIZE WORKERS [BATCHES]
"""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import feedpipe
from feedpipe import Output
from feedpipe.loader.config import usable_cores

dist.init_process_group("gloo")
data, out, mode, batch = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
workers = sys.argv[5] if sys.argv[5] == "auto" else int(sys.argv[5])
rank = dist.get_rank()
loader = feedpipe.make_loader(data, batch, size=16, device="cpu", seed=3,
                              fields=["image", "path"], num_workers=workers,
                              output=Output(dtype="uint8"))
loader.set_epoch(1)
if mode == "post":
    loader.load_state_dict(json.loads((out / "state.json").read_text()))
count = len(loader)
batches = []
for n, b in enumerate(loader):
    batches.append(list(b["path"]))
    if mode == "pre" and n + 1 == int(sys.argv[6]):
        break
if mode == "pre" and rank == 0:
    (out / "state.json").write_text(json.dumps(loader.state_dict()))
counts = [0] * dist.get_world_size()
dist.all_gather_object(counts, count)
(out / f"{mode}-rank{rank}.json").write_text(json.dumps(
    {"batches": batches, "len": count, "all_len": counts, "world": [rank, dist.get_world_size()],
     "workers": loader.describe().num_workers, "cores": usable_cores(),
     "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
     "node": int(os.environ.get("GROUP_RANK", 0))}))
dist.barrier()
dist.destroy_process_group()
# Leave without interpreter finalization (gloo teardown abort, pytorch/pytorch#179291): the test
# checks the files written above.
sys.stdout.flush()
os._exit(0)
