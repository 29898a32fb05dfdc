"""The HF Trainer on feedpipe loaders, for tests/test_trainers.py (one process).

usage: hf_probe.py CONFIG.json
CONFIG: data, val, out, run, epochs, batch, stop_at (stop training after this global step; a
checkpoint is saved every 3 steps), resume (a checkpoint directory).
Writes OUT/<run>.json: the sample indices trained per epoch and the evaluation's metrics.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback, TrainingArguments

import feedpipe
from feedpipe import Output, Sampler
from feedpipe.integrations.transformers import FeedpipeTrainer

cfg = json.loads(Path(sys.argv[1]).read_text())
out = Path(cfg["out"])
seen: dict[int, list[int]] = {}


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 3)
        self.epoch = 0

    def forward(self, pixel_values, labels, index):
        if self.training:
            seen.setdefault(self.epoch, []).extend(index.tolist())
        logits = self.net(pixel_values.float().mean(dim=(2, 3)))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels % 3), "logits": logits}


class Stop(TrainerCallback):
    def on_epoch_begin(self, args, state, control, model=None, **kw):
        model.epoch = int(round(state.epoch or 0))

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == cfg.get("stop_at"):
            control.should_training_stop = True


def count(pred):
    return {"count": float(len(pred.label_ids)),
            "distinct": float(len(np.unique(pred.label_ids)))}


kw = dict(size=16, device="cpu", seed=3, fields=["image", "label"],
          num_workers=0, output=Output(dtype="uint8"))
model = Model()
args = TrainingArguments(output_dir=str(out / f"ckpt-{cfg['run']}"), num_train_epochs=cfg["epochs"],
                         save_strategy="steps", save_steps=3, logging_steps=1, report_to=[],
                         use_cpu=True, per_device_train_batch_size=cfg["batch"],
                         label_names=["labels"], disable_tqdm=True)
trainer = FeedpipeTrainer(
    model=model, args=args, callbacks=[Stop()], compute_metrics=count,
    train_loader=feedpipe.make_loader(cfg["data"], cfg["batch"], sampler=Sampler(uneven="mask"),
                                      **kw),
    eval_loader=feedpipe.make_loader(cfg["val"], cfg["batch"], shuffle=False,
                                     sampler=Sampler(uneven="mask"), **kw),
    rename={"index": "index"})
trainer.train(resume_from_checkpoint=cfg.get("resume"))
metrics = trainer.evaluate()
logged = [h for h in trainer.state.log_history if "feedpipe/data_wait_share" in h]
(out / f"{cfg['run']}.json").write_text(json.dumps({"seen": seen, "metrics": metrics,
                                                    "logged": len(logged)}))
