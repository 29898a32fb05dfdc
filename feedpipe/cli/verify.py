"""Re-read every record of a packed dataset and check its checksums; exits non-zero on any damage
and names what is damaged."""

from __future__ import annotations

import argparse

from .args import add_storage_args, storage_options

HELP = "re-read every record; non-zero exit on damage"


def add_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument("path", help="dataset folder or URL (every object fetched, its SHA-256 "
                   "checked)")
    v.add_argument("--no-decode", action="store_true", help="skip decoding images")
    add_storage_args(v)


def run(args: argparse.Namespace) -> int:
    from ..dataset.verify import verify  # the format readers (h5py, lmdb): only when it runs

    report = verify(args.path, decode=not args.no_decode, storage_options=storage_options(args))
    for line in report.notes:
        print(f"NOTE {line}")
    for line in report.problems:
        print(f"DAMAGED {line}")
    status = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"{args.path}: checked {report.files_checked} files and {report.records_checked} "
          f"records: {status}")
    return 0 if report.ok else 1
