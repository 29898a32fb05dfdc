"""The worker of the structure-damage fuzz tier (test_fault_fuzz.py): one process, many cases.

Usage: python fuzz_driver.py (cases on stdin, one JSON object a line; ``{"src", "warm": true}``
first reads the undamaged dataset, the reference). For each case it copies
the dataset ``src`` to ``work``, overwrites ``length`` bytes of ``file`` at ``offset`` (zeros,
0xFF or seeded random bytes), then runs ``verify`` and reads every batch through ``make_loader``
(``on_error`` "raise", then "skip"), and writes one JSON line per phase as it ends:
``{"phase", "outcome", "detail", "wrong"}``. ``outcome`` is "problems"/"ok" (verify), "done"
(every batch), "typed" (a FeedpipeError) or "untyped" (any other exception); ``wrong`` lists
the samples that came out different from the undamaged dataset's. The test reads the lines
with a timeout (:class:`Driver`, :func:`run_cases`, on the test's side): a hang or a crash in a
case fails it, named, instead of hanging the suite.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import feedpipe
from feedpipe import Output, Workers
from feedpipe.dataset.verify import verify
from feedpipe.errors import FeedpipeError

KW = dict(size=32, crop="resize", shuffle=False, num_workers=0, device="cpu",
          fields=("image", "label", "path"), output=Output(dtype="uint8", mean=None, std=None))
_REFERENCE: dict[str, dict[str, str]] = {}
PHASE_SECONDS = 10  # each of verify, make_loader(on_error="raise") and (on_error="skip")
PHASES = ("verify", "loader-raise", "loader-skip")


def digests(root: str | Path, on_error: str = "raise") -> dict[str, list[str]]:
    """Every sample the loader yields, by its stored path: the digest of its image and label."""
    out: dict[str, list[str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skipped records are warned about: counted below
        for batch in feedpipe.make_loader(root, 8, workers=Workers(on_error=on_error), **KW):
            for path, img, label in zip(batch["path"], batch["image"], batch["label"], strict=True):
                h = hashlib.sha256(img.numpy().tobytes() + str(int(label)).encode())
                out.setdefault(path, []).append(h.hexdigest())
    return out


def damage(case: dict[str, Any]) -> Path:
    """A fresh copy of the case's dataset with its bytes overwritten."""
    root = Path(case["work"])
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(case["src"], root)
    with open(root / case["file"], "r+b") as fh:
        fh.seek(case["offset"])
        fh.write(damage_bytes(case))
    return root


def damage_bytes(case: dict[str, Any]) -> bytes:
    """What the case writes over the file: zeros, 0xFF or random bytes seeded by the offset."""
    n = case["length"]
    return {"zero": bytes(n), "ff": b"\xff" * n}.get(case["mode"]) \
        or random.Random(case["offset"]).randbytes(n)


def run(case: dict[str, Any]) -> None:
    src = case["src"]
    if src not in _REFERENCE:  # the undamaged dataset's samples, once ("warm" cases)
        _REFERENCE[src] = {p: d[0] for p, d in digests(src).items()}
    if case.get("warm"):
        say("warm", "done", f"{len(_REFERENCE[src])} samples")
        return
    want = _REFERENCE[src]
    root = damage(case)
    try:
        report = verify(root)
        say("verify", "problems" if report.problems else "ok", "; ".join(report.problems)[:300])
    except FeedpipeError as exc:
        say("verify", "typed", f"{type(exc).__name__}: {exc}"[:300])
    except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
        say("verify", "untyped", f"{type(exc).__name__}: {exc}"[:300])
    for on_error in ("raise", "skip"):
        got: dict[str, list[str]] = {}
        try:
            got = digests(root, on_error)
            outcome, detail = "done", f"{sum(map(len, got.values()))} samples"
        except FeedpipeError as exc:
            outcome, detail = "typed", f"{type(exc).__name__}: {exc}"[:300]
        except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
            outcome, detail = "untyped", f"{type(exc).__name__}: {exc}"[:300]
        wrong = sorted(p for p, ds in got.items() if any(d != want.get(p) for d in ds))
        say(f"loader-{on_error}", outcome, detail, wrong)
    shutil.rmtree(root, ignore_errors=True)


def say(phase: str, outcome: str, detail: str, wrong: list[str] | None = None) -> None:
    print(json.dumps({"phase": phase, "outcome": outcome, "detail": detail,
                      "wrong": wrong or []}), flush=True)


class Driver:
    """``fuzz_driver.py`` in a subprocess, its answers awaited with a timeout: a case that hangs
    or crashes the process is reported (and a fresh process takes the next case)."""

    def __init__(self, src: Path) -> None:
        self.src, self.proc, self.buf = src, None, b""

    def start(self) -> None:
        here = Path(__file__).parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, __file__],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.buf = b""
        self.send({"src": str(self.src), "warm": True})
        assert self.answer(180) is not None, "the fuzz driver did not start"

    def send(self, case: dict) -> None:
        if self.proc is None:
            self.start()
        self.proc.stdin.write((json.dumps(case) + "\n").encode())
        self.proc.stdin.flush()

    def answer(self, timeout: float) -> dict | None:
        """The next line, or None if none came within ``timeout`` (hung) or the process died."""
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # died (a crash)
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run_cases(src: Path, cases: dict[str, dict[str, Any]], work: Path) -> list[str]:
    """Run the damage ``cases`` (by name: file, offset, length, mode) on dataset ``src`` in one
    driver process; what went wrong in each, named: a hang or crash (no answer within
    PHASE_SECONDS), verify finding nothing, an untyped error or a wrong sample. Cases that would
    change no byte are skipped."""
    driver, failures = Driver(src), []
    try:
        for what, case in cases.items():
            size = (src / case["file"]).stat().st_size
            case = {**case, "src": str(src), "work": str(work),
                    "length": min(case["length"], size - case["offset"])}
            with open(src / case["file"], "rb") as fh:
                fh.seek(case["offset"])
                if fh.read(case["length"]) == damage_bytes(case):
                    continue
            driver.send(case)
            for phase in PHASES:
                got = driver.answer(PHASE_SECONDS)
                if got is None:
                    failures.append(f"{what}: {phase} hung or crashed")
                    driver.stop()
                    break
                if got["outcome"] in ("ok", "untyped") or got["wrong"]:
                    failures.append(f"{what}: {phase}: {got}")
    finally:
        driver.stop()
    return failures


if __name__ == "__main__":
    for line in sys.stdin:
        run(json.loads(line))
