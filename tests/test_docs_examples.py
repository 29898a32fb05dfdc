"""Every code block of README.md and docs/ is run on small generated data, so an example that
stops working fails the suite (tests/docs_blocks.py says how blocks are marked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_blocks import LANGUAGES, ROOT, RUN, blocks, pages

RUNNABLE = [p for p in pages()
            if any(b.language in RUN and b.not_run is None for b in blocks(p))]


def test_every_block_says_its_language() -> None:
    untagged = [f"{b.page}:{b.line}" for p in pages() for b in blocks(p)
                if b.language not in LANGUAGES]
    assert not untagged, f"tag these blocks python, bash or text: {untagged}"


def test_few_blocks_are_left_out() -> None:
    """A block is left out only with a reason, and only a few are (GPU, a cluster, the cloud)."""
    left = [b for p in pages() for b in blocks(p) if b.not_run is not None]
    run = [b for p in pages() for b in blocks(p)
           if b.not_run is None and b.language in RUN and not b.hidden]
    assert all(b.not_run.strip() for b in left)
    assert len(left) <= len(run) // 4, [f"{b.page}:{b.line}: {b.not_run}" for b in left]


# pages whose examples tune, find batch sizes or stand up servers (15-60 s each on 2 cores): in
# the heavy tier (CI runs it after `make test`), so `make test` stays short
HEAVY_PAGES = {"docs/measure.md", "docs/remote.md", "docs/distributed-conversion.md"}


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.heavy) if p.relative_to(ROOT).as_posix() in HEAVY_PAGES
    else p for p in RUNNABLE], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_examples_run(page: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        CUDA_VISIBLE_DEVICES="", MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "docs_run.py"),
                           page.relative_to(ROOT).as_posix()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def test_trainer_snippets_are_run_where_their_library_is() -> None:
    """docs/trainers.md's Lightning, accelerate and HF Trainer snippets are whole programs that
    the docs test runs (each where its library imports), never blocks left out."""
    page = [b for b in blocks(ROOT / "docs" / "trainers.md") if b.language == "python"]
    assert all(b.not_run is None for b in page), [b.line for b in page if b.not_run]
    needs = {m for b in page for m in b.needs}
    assert needs == {"lightning", "accelerate", "transformers"}
    for block in page:
        if block.needs:
            compile(block.code, "trainers.md", "exec")
            assert f"import {block.needs[0]}" in block.code or \
                f"from {block.needs[0]}" in block.code, block.line  # imports what it uses
