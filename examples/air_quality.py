"""PM2.5 forecasting from hourly air-quality readings: windows cut at load time, split by time,
normalized with statistics of the training rows only.

    python examples/air_quality.py                            # a generated hourly series
    python examples/air_quality.py --data air/ --target pm2_5 --features pm2_5,TEMP,PRES,DEWP

The series is stored once (``series=True``): each row an hour, in blocks. ``Windows`` cuts
windows at load time (``length`` hours in, the next ``horizon`` hours of the target out), so
overlapping windows never multiply the data on disk. ``split="train"``/``"val"`` are the rows
before / from the conversion's ``train_fraction``: no window crosses the boundary, so validation
never sees a training hour, and ``normalize=True`` uses the mean and std that the conversion
computed over the training rows only. Windows that touch a missing reading are left out and
counted (``gaps="skip"``). At the end: the validation error in µg/m³ against a "same as the last
hour" forecast, and the data-wait share.

Your own data: a CSV in time order (e.g. the UCI Beijing PM2.5 set), converted with
``feedpipe convert air.csv --columns pm2.5,TEMP,PRES,DEWP --dtype float32 --series
--train-fraction 0.8 --to lmdb -o air`` (``pm2.5`` is stored as ``pm2_5``), then
``--data air --target pm2_5``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import feedpipe
from converters import pack_arrays
from feedpipe.dataset.windows import Windows


class Forecaster(torch.nn.Module):
    """Two 1-D conv layers over the window's hours, then the horizon's values."""

    def __init__(self, features: int, length: int, horizon: int) -> None:
        super().__init__()
        self.horizon = horizon
        self.net = torch.nn.Sequential(
            torch.nn.Conv1d(features, 32, 5, padding=2), torch.nn.ReLU(),
            torch.nn.Conv1d(32, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(32 * length, horizon))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: N × length × F
        return self.net(x.transpose(1, 2)).unsqueeze(-1)   # N × horizon × 1


def prepare(args: argparse.Namespace) -> Path:
    """The packed series: ``--data``, or a generated one packed with ``pack_arrays``."""
    if args.data:
        return Path(args.data)
    packed = args.work / "air"
    if packed.exists():
        print(f"using {packed}, made by an earlier run (remove it to generate anew)")
    else:
        import tiny_data

        series = tiny_data.air_quality(hours=args.hours)
        pack_arrays(series, packed, to="lmdb", series=True, train_fraction=0.8)
    return packed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a series packed with --series --train-fraction")
    p.add_argument("--target", default="pm25", help="the field to forecast")
    p.add_argument("--features", help="comma-separated input fields (default: every numeric)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "feedpipe-examples"
                   / "air_quality", help="where the generated series goes (without --data)")
    p.add_argument("--hours", type=int, default=24 * 90, help="generated hours (without --data)")
    p.add_argument("--length", type=int, default=24, help="hours in")
    p.add_argument("--horizon", type=int, default=6, help="hours out")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", default="0", help="loader processes, or auto (windows are two "
                   "slices of arrays in memory: the main process keeps up)")
    args = p.parse_args()
    data = prepare(args)
    features = args.features.split(",") if args.features else None
    if features and args.target in features:  # the target first: x's column 0
        features = [args.target, *(f for f in features if f != args.target)]
    kw = dict(length=args.length, horizon=args.horizon, targets=[args.target],
              features=features, normalize=True, gaps="skip")
    train_windows = Windows(data, split="train", **kw)
    val_windows = Windows(data, split="val", **kw)
    print(f"windows: {len(train_windows)} train, {len(val_windows)} validation; left out "
          f"(touch a gap): {train_windows.left_out} and {val_windows.left_out}")
    workers = args.workers if args.workers == "auto" else int(args.workers)
    train = feedpipe.make_loader(train_windows, args.batch_size, fields=["x", "y"],
                                 num_workers=workers)
    val = feedpipe.make_loader(val_windows, args.batch_size, fields=["x", "y"], shuffle=False,
                               num_workers=workers)
    mean, std = (float(v[0]) for v in train_windows.stats()["y"])  # to undo the normalization
    columns = next(iter(val))["x"].shape[-1]
    persistence = val_windows.features[0] == args.target  # x's column 0 is the target's past
    model = Forecaster(columns, args.length, args.horizon)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    meter = feedpipe.StallMeter()
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        for batch in meter.wrap(train):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        errors, naive = [], []
        with torch.no_grad():
            for batch in val:
                errors.append((model(batch["x"]) - batch["y"]).abs().flatten())
                if persistence:  # the forecast "as the last hour", for comparison
                    naive.append((batch["x"][:, -1:, :1] - batch["y"]).abs().flatten())
        mae = torch.cat(errors).mean().item() * std
        line = f"epoch {epoch}: validation MAE {mae:.1f} ({args.target} units)"
        if naive:
            line += f"; persistence {torch.cat(naive).mean().item() * std:.1f}"
        print(line)
    print(f"(train-rows normalization: {args.target} mean {mean:.1f}, std {std:.1f})")
    print(meter.summary())


if __name__ == "__main__":
    main()
