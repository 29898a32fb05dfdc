"""Check the machine (cores, memory, shared memory, GPU, decoders) and optionally a dataset or URL
for what would make loading slow, with the fix for each finding."""

from __future__ import annotations

import argparse
import json
import sys

from .args import add_storage_args, storage_options

HELP = "check the machine and a dataset for slow-loading causes"


def add_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("path", nargs="?", help="packed dataset, image folder or URL (optional; a URL "
                   "gets the fetch bandwidth against the decode rate)")
    d.add_argument("--no-bench", action="store_true", help="skip the short bench of PATH")
    d.add_argument("--batches", type=int, default=8, help="short bench: batches (default 8)")
    d.add_argument("--batch-size", type=int, default=64, help="for the bench and /dev/shm sizing")
    d.add_argument("--size", type=int, default=224, help="output HxW for the bench and sizing")
    d.add_argument("--json", action="store_true", help="print the findings as JSON")
    add_storage_args(d)


def run(args: argparse.Namespace) -> int:
    """Print the findings (or their JSON); exit 1 if a check failed."""
    from ..tools import machine
    from ..tools.doctor import RANK, run_doctor  # torch: only when the command runs

    if args.path is not None and not args.no_bench and not args.json:
        print("running a short bench ...", file=sys.stderr)
    rep = run_doctor(args.path, bench=not args.no_bench, batches=args.batches,
                     batch_size=args.batch_size, size=args.size,
                     storage_options=storage_options(args))
    if args.json:
        print(json.dumps(rep.to_json(), indent=1))
        return rep.exit_code
    print(f"feedpipe doctor: {machine.summary_line(rep.machine)}"
          + (f"; dataset {rep.path}" if rep.path else ""))
    for f in rep.findings:
        print(f)
    worst = [f for f in rep.findings if RANK[f.severity] <= RANK["medium"]]
    print(f"{len(worst)} finding(s) worth fixing" if worst else "nothing serious found")
    return rep.exit_code
