"""Run under torchrun: each rank searches a batch size against its own CPU memory budget (rank 1's
is smaller) and writes its result to OUT/rank<k>.json."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from feedpipe.tools.tune import find_batch_size

dist.init_process_group("gloo")
out, budgets = Path(sys.argv[1]), [int(b) for b in sys.argv[2].split(",")]
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
res = find_batch_size(model, lambda n: (torch.randn(n, 256), torch.randint(0, 10, (n,))),
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      memory_budget=budgets[rank], max_size=16384, start=256, steps=1,
                      resolution=1 / 8)
(out / f"rank{rank}.json").write_text(json.dumps({**res.to_dict(), "budget": budgets[rank]}))
dist.barrier()
dist.destroy_process_group()
# Leave without interpreter finalization: torch's gloo worker threads can abort the process there
# ("terminate called without an active exception", pytorch/pytorch#179291) after the work is done
# and written; the test checks the files above, so an exit code from teardown would only mislead.
sys.stdout.flush()
os._exit(0)
