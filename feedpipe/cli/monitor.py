"""Sample GPU utilisation and memory (NVML) next to a training job, to see whether the loader
keeps the GPU busy."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..paths import write_atomic

if TYPE_CHECKING:
    from ..tools.gpumon import Sampler

HELP = "sample GPU utilisation and memory (NVML) next to a job"


def add_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    m.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C)")
    m.add_argument("--json", type=Path, help="write the summary here as JSON")


def run(args: argparse.Namespace, sampler: Sampler | None = None) -> int:
    """A live line per interval, then the summary (and ``--json``)."""
    from ..tools.benchreport import check_output_path  # only when the command runs
    from ..tools.gpumon import GpuMonitor, live_line

    if args.duration is not None and not args.duration > 0:  # also NaN
        raise ConfigError(f"--duration {args.duration}: use a positive number of seconds")
    if args.json:
        check_output_path(args.json, "--json")
    mon = GpuMonitor(args.interval, sampler=sampler, on_sample=live_line(time.monotonic()))
    mon.start()
    try:
        mon.join(args.duration)  # None: until Ctrl-C
    except KeyboardInterrupt:
        pass
    summary = mon.stop()
    print(summary)
    if args.json:
        write_atomic(args.json, json.dumps(summary.to_dict(), indent=1) + "\n")
    return 0
