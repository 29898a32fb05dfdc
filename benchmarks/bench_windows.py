"""Time-series windows (docs/arrays.md): windows cut at load time from a series stored once,
against the two ways users do it today, side by side in one run, with what each keeps on disk.

1. ``Windows`` over the series packed once (``pack_arrays(series=True)``), through
   ``make_loader``.
2. A plain in-memory ``TensorDataset`` of materialized windows + ``torch.utils.data.DataLoader``
   (shuffled, default collate).
3. The materialized windows packed as a dataset (each window stored separately), through
   ``make_loader``.

Every window is ``--length`` rows of ``--features`` float32 columns in, ``--horizon`` rows of the
first column out, at ``--stride``. The goal: (1) no slower than (3), at about stride/length of
its disk size. Rates are windows/s over whole shuffled epochs (median of interleaved rounds).

    python benchmarks/bench_windows.py [--rows 200000] [--features 8] [--length 24] \
        [--horizon 1] [--stride 1] [--batch 256] [--workers 0] [--format lmdb] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from harness import drain, measure_side_by_side, one_thread, save  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import feedpipe  # noqa: E402
from converters.arrays import pack_arrays  # noqa: E402
from feedpipe.dataset.windows import Windows  # noqa: E402


def disk_bytes(root: Path) -> int:
    """Every file of a packed dataset (data files and manifest)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def series(rows: int, features: int) -> np.ndarray:
    """A smooth multivariate series (random walks), float32, rows × features."""
    rng = np.random.default_rng(0)
    return np.cumsum(rng.standard_normal((rows, features)), axis=0).astype(np.float32)


def materialize(x: np.ndarray, length: int, horizon: int, stride: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every window as its own array (what a dataset of stored windows holds)."""
    starts = np.arange(0, len(x) - length - horizon + 1, stride)
    xs = np.stack([x[s:s + length] for s in starts])
    ys = np.stack([x[s + length:s + length + horizon, :1] for s in starts])
    return xs, ys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--length", type=int, default=24)
    ap.add_argument("--horizon", type=int, default=1)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=0, help="loader processes, every loader")
    ap.add_argument("--format", default="lmdb", choices=["lmdb", "hdf5", "wds"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" /
                    "windows.json")
    args = ap.parse_args()
    L, H, S = args.length, args.horizon, args.stride
    x = series(args.rows, args.features)
    cols = {f"f{j}": x[:, j] for j in range(args.features)}
    xs, ys = materialize(x, L, H, S)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        pack_arrays(cols, root / "series", to=args.format, series=True)
        pack_series = time.perf_counter() - t
        t = time.perf_counter()
        pack_arrays({"x": xs, "y": ys}, root / "windows", to=args.format)
        pack_windows = time.perf_counter() - t
        t = time.perf_counter()
        win = Windows(root / "series", length=L, horizon=H, stride=S, targets=["f0"],
                      features=list(cols))
        open_s = time.perf_counter() - t
        assert len(win) == len(xs) and np.array_equal(win[7]["x"], xs[7])  # the same windows
        kw = dict(fields=["x", "y"], device="cpu", num_workers=args.workers, seed=1)
        tensors = TensorDataset(torch.from_numpy(xs), torch.from_numpy(ys))
        runs = {
            "Windows over the series stored once": lambda: drain(
                feedpipe.make_loader(win, args.batch, **kw)),
            "TensorDataset + DataLoader (in memory)": lambda: drain(DataLoader(
                tensors, args.batch, shuffle=True, num_workers=args.workers,
                worker_init_fn=one_thread)),
            "materialized windows packed, make_loader": lambda: drain(
                feedpipe.make_loader(root / "windows", args.batch, **kw)),
        }
        results = measure_side_by_side(runs, repeats=args.rounds)
        sizes = {"series_on_disk": disk_bytes(root / "series"),
                 "windows_on_disk": disk_bytes(root / "windows"),
                 "windows_in_memory": xs.nbytes + ys.nbytes, "series_raw": x.nbytes}
    ratio = sizes["windows_on_disk"] / sizes["series_on_disk"]
    print(f"  on disk ({args.format}): series {sizes['series_on_disk'] / 1e6:,.1f} MB, "
          f"materialized windows {sizes['windows_on_disk'] / 1e6:,.1f} MB ({ratio:.1f}x); in "
          f"memory: windows {sizes['windows_in_memory'] / 1e6:,.1f} MB")
    print(f"  Windows open (series read into memory): {open_s:.2f} s; pack series "
          f"{pack_series:.2f} s, windows {pack_windows:.2f} s")
    print(f"  Windows / materialized-packed rate: {results[0].rate / results[2].rate:.2f}x")
    save(args.out, results, {"args": {k: str(v) for k, v in vars(args).items()},
                             "windows": len(xs), **sizes, "disk_ratio": ratio,
                             "open_seconds": open_s, "pack_series_seconds": pack_series,
                             "pack_windows_seconds": pack_windows})


if __name__ == "__main__":
    main()
