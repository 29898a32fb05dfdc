"""An accelerate loop on feedpipe loaders, for tests/test_trainers.py (run under torchrun, or
alone for one process).

usage: accelerate_probe.py CONFIG.json
CONFIG: data, val, out, run, epochs, batch, accum, stop_after (save_state after this many batches
of epoch 0, then stop), resume (a save_state directory), plain (the loaders through
accelerator.prepare, not feedpipe.integrations.accelerate.prepare).
Each rank writes OUT/<run>-rank<r>.json: the sample indices it trained per epoch, the optimizer
steps per epoch, and what gather_for_metrics returned over the validation loader.
"""

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

import feedpipe
from feedpipe import Output, Sampler
from feedpipe.integrations.accelerate import prepare

cfg = json.loads(Path(sys.argv[1]).read_text())
out = Path(cfg["out"])
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.get("accum", 1),
                          log_with="tensorboard", project_dir=str(out / "tb"))
accelerator.init_trackers(cfg["run"])
kw = dict(size=16, device="cpu", seed=3, fields=["image", "label"], output=Output(dtype="uint8"))
train = feedpipe.make_loader(cfg["data"], cfg["batch"], num_workers=cfg.get("workers", 0),
                             sampler=Sampler(uneven="mask"), **kw)
val = feedpipe.make_loader(cfg["val"], cfg["batch"], num_workers=0, shuffle=False,
                           sampler=Sampler(uneven="mask"), **kw)
model = torch.nn.Linear(3, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if cfg.get("plain"):  # accelerate's own prepare: the loaders come back as they are
    model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)
    loader = train
else:
    model, optimizer, train, val = prepare(accelerator, model, optimizer, train, val)
    loader = train.loader
if cfg.get("resume"):
    accelerator.load_state(cfg["resume"])
seen: dict[int, list[int]] = {}
steps: dict[int, int] = {}
first = loader.position()[0]
stopped = False
for epoch in range(first, cfg["epochs"]):
    train.set_epoch(epoch)
    for n, batch in enumerate(train):
        with accelerator.accumulate(model):
            x = batch["image"].float().mean(dim=(2, 3))
            loss = torch.nn.functional.cross_entropy(model(x), batch["label"] % 3)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        seen.setdefault(epoch, []).extend(batch["index"][batch["valid"]].tolist())
        if accelerator.sync_gradients:
            steps[epoch] = steps.get(epoch, 0) + 1
        if epoch == 0 and cfg.get("stop_after") == n + 1:
            accelerator.save_state(str(out / "state"))
            stopped = True
            break
    if stopped:
        break
gathered = []
for batch in val:
    gathered += accelerator.gather_for_metrics(batch["index"]).tolist()
accelerator.wait_for_everyone()  # no rank tears the process group down while one still gathers
accelerator.end_training()
(out / f"{cfg['run']}-rank{accelerator.process_index}.json").write_text(json.dumps(
    {"seen": seen, "steps": steps, "gathered": gathered, "len": len(train),
     "world": accelerator.num_processes, "logged": getattr(train, "epochs_logged", None)}))
