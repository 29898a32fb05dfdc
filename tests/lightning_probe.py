"""A Lightning run on feedpipe loaders, for tests/test_trainers.py.

usage: lightning_probe.py CONFIG.json
CONFIG: data, val, out, devices, epochs, batch, workers, every (checkpoint every n train steps),
kill_at (global step at which every rank SIGKILLs itself), resume (a checkpoint path),
save_after (trainer.save_checkpoint to OUT/<run>-after-fit.ckpt once fit has returned).
Each rank appends one JSON line per trained batch to OUT/seen-<run>-rank<r>.jsonl
({"epoch", "batch_idx", "index": [...]}) and rank 0 writes OUT/<run>-metrics.json.
"""

import json
import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from feedpipe import Output, Sampler
from feedpipe.integrations.lightning import FeedpipeDataModule

cfg = json.loads(Path(sys.argv[1]).read_text())
out = Path(cfg["out"])
run = cfg["run"]


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 3)
        self.val_count = 0

    def training_step(self, batch, batch_idx):
        with open(out / f"seen-{run}-rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "batch_idx": batch_idx,
                                "index": batch["index"][batch["valid"]].tolist()}) + "\n")
        if cfg.get("kill_at") is not None and self.global_step == cfg["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)
        x = batch["image"].float().mean(dim=(2, 3))
        return torch.nn.functional.cross_entropy(self.net(x), batch["label"] % 3)

    def validation_step(self, batch, batch_idx):
        valid = batch["valid"]
        self.log("val_count", valid.sum().float(), reduce_fx="sum", sync_dist=True,
                 on_epoch=True)
        self.log("val_rows", float(len(valid)), reduce_fx="sum", sync_dist=True, on_epoch=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


dm = FeedpipeDataModule(cfg["data"], cfg.get("val"), batch_size=cfg["batch"], size=16,
                        device="cpu", num_workers=cfg.get("workers", 0), seed=3,
                        fields=["image", "label"], output=Output(dtype="uint8"),
                        sampler=Sampler(uneven="mask"))
callbacks = []
if cfg.get("every"):
    callbacks.append(ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=cfg["every"],
                                     save_top_k=-1, filename="{epoch}-{step}"))
trainer = pl.Trainer(accelerator="cpu", devices=cfg["devices"],
                     strategy="ddp" if cfg["devices"] > 1 else "auto",
                     max_epochs=cfg["epochs"], logger=CSVLogger(out / f"logs-{run}"),
                     callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0 if cfg.get("resume") else 2,
                     log_every_n_steps=1)
model = Model()
trainer.fit(model, datamodule=dm, ckpt_path=cfg.get("resume"))
if cfg.get("save_after"):  # a checkpoint taken once fit is over
    trainer.save_checkpoint(out / f"{run}-after-fit.ckpt")
metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
validated = trainer.validate(model, datamodule=dm, verbose=False)[0]
if trainer.global_rank == 0:
    metrics["validate_count"] = float(validated["val_count"])
    (out / f"{run}-metrics.json").write_text(json.dumps(metrics))
