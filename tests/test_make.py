"""The Makefile's installs, read with ``make -n`` (what it would run) in a copy without .venv: each
target installs what it runs, with pip's progress shown (no ``-q``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def planned(tmp_path: Path, target: str) -> list[str]:
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items()  # (run under `make test`: not a sub-make)
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return out.splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_installs_the_demo_extra_only(tmp_path):
    lines = planned(tmp_path, "demo")
    pips = [ln for ln in lines if " install " in ln]
    assert len(pips) == 2, lines
    assert pips[0].endswith("torch==2.13.0") and pips[1].endswith("-e '.[demo]'")
    assert all(" -q" not in ln for ln in pips)  # pip's progress is shown
    assert lines[-1].endswith("feedpipe demo")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_each_target_installs_its_own_extra(tmp_path):
    for target, extra in (("test", "test"), ("lint", "lint"), ("docs", "docs"),
                          ("dist", "lint"), ("test-faults", "test")):
        pips = [ln for ln in planned(tmp_path, target) if " install " in ln and "-e '." in ln]
        assert [p.rsplit(" ", 1)[-1] for p in pips] == [f"'.[{extra}]'"], target
