"""The training scripts of examples/ run end to end as a user runs them (a real subprocess,
loader worker processes, Lightning's DDP on two CPU processes), on their own tiny generated data
at smaller sizes, and each ends with its data-wait share; they use only the public API."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SUMMARY = re.compile(r"^(input-bound|partly input-bound|compute-bound): (\d+)% of steady-state "
                     r"time waiting for data \((\d+) batches", re.M)
# what the examples may import from the project: the public names, option groups, integrations
PUBLIC = {"feedpipe", "converters", "feedpipe.integrations.lightning",
          "feedpipe.integrations.accelerate", "feedpipe.integrations.transformers",
          "feedpipe.loader.transforms", "feedpipe.loader.augment", "feedpipe.dataset.windows"}
SCRIPTS = {  # script -> its arguments for a small run
    "classify_lightning.py": ["--samples", "96", "--epochs", "1", "--devices", "2",
                              "--strategy", "ddp", "--workers", "0"],
    "landmarks.py": ["--samples", "40", "--epochs", "1", "--size", "48", "--workers", "1"],
    "air_quality.py": ["--hours", str(24 * 30), "--epochs", "1"],
    "segmentation.py": ["--samples", "24", "--epochs", "1", "--size", "32", "--workers", "1"],
    "captcha_ctc.py": ["--samples", "40", "--epochs", "1", "--batch-size", "8", "--workers", "1"],
}


def _run(script: str, work: Path) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(EXAMPLES / script), "--work", str(work),
                           *SCRIPTS[script]], cwd=work.parent, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    summary = SUMMARY.search(done.stdout)
    assert summary, f"no data-wait share printed:\n{done.stdout[-2000:]}"
    assert 0 <= int(summary.group(2)) <= 100 and int(summary.group(3)) >= 2
    return done.stdout


def test_every_example_is_tested_and_in_the_readme() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py") if p.name != "tiny_data.py"}
    assert scripts == set(SCRIPTS)
    readme = (EXAMPLES / "README.md").read_text()
    for script in scripts:
        assert f"examples/{script}" in readme, script
        assert "Your own data" in (EXAMPLES / script).read_text(), script


def test_examples_use_only_the_public_api() -> None:
    """The loader's internals change; the examples stay on what the reference documents."""
    for path in EXAMPLES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.split(".")[0] in ("feedpipe", "converters"):
                    assert name in PUBLIC, f"{path.name} imports {name}"


def test_classification_in_lightning_ddp_counts_each_validation_sample_once(tmp_path) -> None:
    out = _run("classify_lightning.py", tmp_path / "work")
    # 96 images, a quarter for validation; 2 ranks × 32 rows pad 24 samples to 64
    assert "validation: 24 samples, each counted once over 2 rank(s)" in out, out


def test_landmarks_with_a_user_augmentation(tmp_path) -> None:
    out = _run("landmarks.py", tmp_path / "work")
    error = float(re.search(r"validation ([\d.]+) px mean point error at 48x48", out).group(1))
    assert 0 < error < 48


def test_air_quality_windows_split_by_time(tmp_path) -> None:
    out = _run("air_quality.py", tmp_path / "work")
    train, val = map(int, re.search(r"windows: (\d+) train, (\d+) validation", out).groups())
    # 720 hours split 576 / 144 at train_fraction 0.8; 30-hour windows never cross it
    assert train + val <= (576 - 29) + (144 - 29) and val > 0
    assert re.search(r"validation MAE [\d.]+ \(pm25 units\); persistence [\d.]+", out)


def test_segmentation_with_precomputed_distance_maps(tmp_path) -> None:
    out = _run("segmentation.py", tmp_path / "work")
    assert 0 <= float(re.search(r"validation IoU ([\d.]+)", out).group(1)) <= 1
    assert (tmp_path / "work" / "seg.lmdb" / "train").is_dir()


def test_captcha_text_with_ctc(tmp_path) -> None:
    out = _run("captcha_ctc.py", tmp_path / "work")
    assert re.search(r"CTC loss [\d.]+; validation: \d+ read exactly, character error \d+%", out)
