"""Table conversion (docs/arrays.md): a numeric table as CSV, JSONL and Parquet packed by the real
CLI, one record per row and as one series (``--series``), with each output's size against the
bytes of the values; another checkout's CLI (``--baseline``) runs in the same rounds, for a
before/after ratio from one run.

Each run is the whole command, process start to exit:

    python -m feedpipe.cli convert TABLE --to FMT -o OUT -q [--series]

The table: ``--rows`` rows of ``--columns`` columns, the first an int64 counter, the others
float64 random walks (CSV/JSONL written with ``repr``, so every value reads back exactly).
Rates are rows/s (median of interleaved rounds). ``--read`` times ``read_table`` alone instead
(the parsing and checks, in a fresh process per run, without the interpreter's start-up and the
packing): the cost of what converters/tables.py checks, on a table large enough to see it.

    python benchmarks/bench_tables.py [--rows 20000] [--columns 8] [--rounds 3] [--read]
        [--kinds csv jsonl parquet] [--formats lmdb] [--baseline /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from harness import Result, measure_side_by_side, save  # noqa: E402


def table(rows: int, columns: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    cols = {"step": np.arange(rows, dtype=np.int64)}
    for j in range(1, columns):
        cols[f"f{j}"] = np.cumsum(rng.standard_normal(rows))
    return cols


def write(cols: dict[str, np.ndarray], root: Path, kinds: list[str]) -> dict[str, Path]:
    """The table in each kind of file asked for."""
    out = {}
    names = list(cols)
    rows = len(cols[names[0]])
    if "csv" in kinds:
        out["csv"] = root / "table.csv"
        with open(out["csv"], "w") as fh:
            fh.write(",".join(names) + "\n")
            for k in range(rows):
                fh.write(",".join(repr(cols[n][k].item()) for n in names) + "\n")
    if "jsonl" in kinds:
        out["jsonl"] = root / "table.jsonl"
        with open(out["jsonl"], "w") as fh:
            for k in range(rows):
                fh.write(json.dumps({n: cols[n][k].item() for n in names}) + "\n")
    if "parquet" in kinds:
        import pyarrow as pa
        import pyarrow.parquet as pq

        out["parquet"] = root / "table.parquet"
        pq.write_table(pa.table(cols), out["parquet"])
    return out


def cli(src: Path, fmt: str, out: Path, rows: int, extra: list[str], code: Path | None):
    """A run of the real CLI (a fresh process each time), feedpipe imported from ``code``."""
    cmd = [sys.executable, "-m", "feedpipe.cli", "convert", str(src), "--to", fmt, "-o",
           str(out), "-q", *extra]
    env = {**os.environ, "PYTHONPATH": str(code.resolve())} if code else None
    cwd = code.resolve() if code else None

    def run() -> int:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
        return rows

    return run


READ = """
import sys, time
from converters.tables import read_table
t = time.perf_counter()
read_table(sys.argv[1])
print(time.perf_counter() - t)
"""


def read(src: Path, rows: int, code: Path | None):
    """``read_table`` alone, timed inside a fresh process (feedpipe imported from ``code``)."""
    env = {**os.environ, "PYTHONPATH": str(code.resolve())} if code else None
    cwd = code.resolve() if code else None

    def run() -> float:
        out = subprocess.run([sys.executable, "-c", READ, str(src)], check=True, env=env,
                             cwd=cwd, capture_output=True, text=True).stdout
        return float(out)

    return run


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--columns", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", nargs="+", default=["csv", "jsonl", "parquet"],
                    choices=["csv", "jsonl", "parquet"])
    ap.add_argument("--formats", nargs="+", default=["lmdb"], choices=["lmdb", "hdf5", "wds"])
    ap.add_argument("--baseline", type=Path, help="another checkout whose CLI runs in the same "
                    "rounds")
    ap.add_argument("--read", action="store_true", help="time read_table alone")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" /
                    "tables.json")
    args = ap.parse_args()
    cols = table(args.rows, args.columns)
    values = sum(a.nbytes for a in cols.values())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = write(cols, root, args.kinds)
        print(f"{args.rows} rows x {args.columns} columns: {values / 1e6:.1f} MB of values; "
              + ", ".join(f"{k} {p.stat().st_size / 1e6:.1f} MB" for k, p in files.items()))
        runs, outs = {}, {}
        if args.read:
            reads = {}
            for kind, src in files.items():
                reads[f"read_table {kind}"] = read(src, args.rows, None)
                if args.baseline:
                    reads[f"baseline read_table {kind}"] = read(src, args.rows, args.baseline)
            results = [Result(name, args.rows) for name in reads]
            for _ in range(args.rounds):  # interleaved, as measure_side_by_side
                for r, run in zip(results, reads.values(), strict=True):
                    r.seconds.append(run())
            for r in results:
                print(f"  {r.name:<44} {r.rate:>10,.0f} rows/s", flush=True)
            for r in results:
                if args.baseline and not r.name.startswith("baseline "):
                    base = next(x for x in results if x.name == f"baseline {r.name}")
                    print(f"  {r.name:<32} this checkout / baseline rate: {r.rate / base.rate:.2f}")
            save(args.json, results, {"rows": args.rows, "columns": args.columns,
                                      "value_bytes": values, "read": True,
                                      "baseline": str(args.baseline) if args.baseline else None,
                                      "command": " ".join(sys.argv)})
            return
        for kind, src in files.items():
            for fmt in args.formats:
                for mode, extra in (("rows", []), ("series", ["--series"])):
                    if mode == "series" and fmt != args.formats[0]:
                        continue  # one series output is enough: its size is the point
                    name = f"{kind} {mode} --to {fmt}"
                    outs[name] = root / name.replace(" ", "_")
                    runs[name] = cli(src, fmt, outs[name], args.rows, extra, None)
                    if args.baseline:
                        runs[f"baseline {name}"] = cli(src, fmt, root / f"b_{outs[name].name}",
                                                       args.rows, extra, args.baseline)
        results = measure_side_by_side(runs, repeats=args.rounds, warmup=0)
        sizes = {name: tree_bytes(out) for name, out in outs.items()}
    for r in results:
        name = r.name.removeprefix("baseline ")
        if not r.name.startswith("baseline "):
            r.note = f"output {sizes[name] / 1e6:.1f} MB, {sizes[name] / values:.1f}x the values"
            print(f"  {name:<32} output {sizes[name] / 1e6:8.1f} MB  "
                  f"({sizes[name] / values:5.1f}x the values)")
        elif args.baseline:
            ours = next(x for x in results if x.name == name)
            print(f"  {name:<32} this checkout / baseline rate: {ours.rate / r.rate:.2f}")
    save(args.json, results, {"rows": args.rows, "columns": args.columns,
                              "value_bytes": values, "sizes": sizes,
                              "baseline": str(args.baseline) if args.baseline else None,
                              "command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
