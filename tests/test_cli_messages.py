"""Messages that point the right way. A data file given for its dataset, a
folder of images or of per-split datasets given to ``info``, a part's empty classes, a user
target module beside the command, and every subcommand's ``--help`` say what they are."""

from __future__ import annotations

import pytest
from fp_helpers import cli_main, run_cli

from feedpipe.cli.app import build_parser


def _one_line(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_a_data_file_says_pass_the_folder(packed, capsys):
    data = next(p for p in packed["lmdb"].iterdir() if p.name != "feedpipe.json")
    for cmd in ("verify", "info"):
        rc, _, err = cli_main(capsys, cmd, data)
        assert f"pass the dataset folder ({packed['lmdb']})" in _one_line(rc, err)
        assert "convert" not in err


def test_info_on_images_or_on_split_datasets(photo_dir, tmp_path, capsys):
    rc, _, err = cli_main(capsys, "info", photo_dir)
    assert "is a folder of images" in _one_line(rc, err) and "did not finish" not in err
    assert f"feedpipe convert {photo_dir}" in err
    out = tmp_path / "split"
    rc, _, err = cli_main(capsys, "convert", photo_dir, "--to", "lmdb", "-o", out,
                          "--val-fraction", "0.25", "-q", "--workers", "0")
    assert rc == 0, err
    rc, _, err = cli_main(capsys, "info", out)
    assert "holds 2 datasets, one per split (train, val)" in _one_line(rc, err)
    assert "did not finish" not in err


def test_a_part_leaves_empty_classes_to_merge(photo_dir, tmp_path, capsys):
    rc, out, err = cli_main(capsys, "convert", photo_dir, "--to", "lmdb", "-o", tmp_path / "o",
                            "--part", "1/4", "-q", "--workers", "0")
    assert rc == 0, err
    assert "have no samples" not in out + err  # the slice holds one class of four


def test_target_module_beside_the_command_gets_a_pythonpath_hint(tmp_path, monkeypatch,
                                                                 capsys):
    (tmp_path / "mytgt_27.py").write_text("def f(mask):\n    return mask\n")
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli_main(capsys, "convert", tmp_path, "--to", "lmdb", "-o", tmp_path / "o",
                          "--masks", tmp_path, "--target", "t=mytgt_27:f")
    assert "mytgt_27.py is in the current folder" in _one_line(rc, err)
    assert "PYTHONPATH=." in err


def test_every_subcommand_describes_itself():
    parser = build_parser()
    assert "docstring" not in (parser.description or "") and len(parser.description) > 40
    for name, sub in parser.commands.items():
        assert sub.description and len(sub.description) > 40, name


@pytest.mark.parametrize("module", ["feedpipe", "feedpipe.cli"])
def test_version_and_module_entry(module):
    import subprocess
    import sys

    from feedpipe import __version__

    proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"feedpipe {__version__}"
    assert run_cli("--help").stdout.count("\n") > 5


def test_no_recorded_size_says_so_and_a_misspelt_field_comes_first(tmp_path):
    """All 28×28 images, stored as they come: the schema records no size. The error used to say
    'varying size', and it hid a misspelt field named after the image."""
    import numpy as np
    from PIL import Image

    import feedpipe
    from converters import convert
    from feedpipe.errors import ConfigError

    for k in range(4):
        (tmp_path / "src" / "c").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((28, 28, 3), k * 40, np.uint8)).save(tmp_path / "src/c" / f"{k}.jpg")
    convert(tmp_path / "src", tmp_path / "ds", to="lmdb", workers=0)
    kw = dict(num_workers=0, device="cpu")
    with pytest.raises(ConfigError, match="records no image size") as exc:
        feedpipe.make_loader(tmp_path / "ds", 2, **kw)
    assert "varying" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"'lable' \(did you mean 'label'\?\)"):
        feedpipe.make_loader(tmp_path / "ds", 2, fields=("image", "lable"), **kw)


@pytest.mark.parametrize("args, said", [
    (["convert", "imgs", "--to", "lmbd", "-o", "out"], "invalid choice: 'lmbd'"),
    (["convert", "imgs", "--to", "lmdb"], "required: -o/--out"),
    (["bench", "packed", "--size", "big"], "argument --size: invalid int value: 'big'"),
    (["covert", "imgs"], "invalid choice: 'covert'"),
])
def test_a_usage_mistake_is_one_line_and_a_hint(args, said, capsys):
    """argparse printed its whole usage block (40 lines for convert) before the line that says
    what is wrong: now that line and where the options are, exit status 2."""
    from feedpipe.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2 and said in lines[0] and "usage:" not in err, err
    command = "feedpipe" if args[0] == "covert" else f"feedpipe {args[0]}"
    assert lines[0].startswith(f"{command}: error: ")
    assert lines[1] == f"run `{command} --help` for the options"


def test_advice_prints_as_a_plain_warning(photo_dir, tmp_path):
    """A manifest column that looks geometric is advice: the CLI prints it as ``feedpipe convert:
    warning: ...``, not Python's ``converters/pack.py:193: UserWarning`` with a source line;
    library callers still get a ``UserWarning``."""
    from converters import convert

    images = sorted(photo_dir.rglob("*.jpg"))[:3]
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,bbox\n" + "".join(f"{p},3\n" for p in images))
    proc = run_cli("convert", manifest, "--to", "lmdb", "-o", tmp_path / "out", "-q",
                   "--workers", "0")
    assert proc.returncode == 0, proc.stderr
    warned = [ln for ln in proc.stderr.splitlines() if "manifest columns ['bbox']" in ln]
    assert len(warned) == 1 and warned[0].startswith("feedpipe convert: warning: "), proc.stderr
    assert "UserWarning" not in proc.stderr and ".py:" not in proc.stderr, proc.stderr
    with pytest.warns(UserWarning, match=r"manifest columns \['bbox'\]"):
        convert(manifest, tmp_path / "lib", to="lmdb", workers=0)


def test_only_feedpipe_warnings_print_plainly(capsys):
    """Another library's warning keeps Python's form (its source line says whose it is)."""
    import warnings

    import converters
    from feedpipe.cli.app import _plain_warnings

    python_form: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, *a: \
            python_form.append(f"{filename}:{lineno}: {category.__name__}: {message}")
        with _plain_warnings("bench"):
            warnings.warn_explicit("advice", UserWarning, converters.__file__, 1)
            warnings.warn_explicit("theirs", UserWarning, "/opt/lib/torch/utils/data.py", 7)
    assert capsys.readouterr().err == "feedpipe bench: warning: advice\n"
    assert python_form == ["/opt/lib/torch/utils/data.py:7: UserWarning: theirs"]
