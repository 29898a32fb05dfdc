"""Typed errors: what a user can act on is a FeedpipeError naming dataset, file and key; the CLI
shows those as one line (exit 2) in its own terms, keeps tracebacks for bugs, and refuses empty
datasets at once instead of spinning."""

from __future__ import annotations

import builtins as builtins_module
import errno
import json
import multiprocessing.reduction as reduction
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI, cli_main, jpeg_bytes, put_hdf5_value, run_cli

import feedpipe
from feedpipe import Output, Workers
from feedpipe.cli import args as cli_args
from feedpipe.cli import build_parser, main
from feedpipe.cli import info as cli_info
from feedpipe.cli.app import speak_cli
from feedpipe.dataset.formats.wds import check_key
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.dataset.registry import WRITERS
from feedpipe.errors import (
    BadInputError,
    ConfigError,
    CorruptRecordError,
    DamagedDataError,
    FeedpipeError,
    ResourceError,
    SampleError,
    TransformError,
)
from feedpipe.loader.sampler import World
from feedpipe.schema.fields import ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema

SCHEMA = Schema((ImageField("image"), LabelField("label"), JsonField("path")))
U8 = dict(device="cpu", output=Output(dtype="uint8", mean=None, std=None))


def pack(fmt: str, root: Path, n: int, skipped: int = 0) -> Path:
    """A dataset of ``n`` small JPEGs (``img<i>.jpg``), written through the real writer."""
    w = WRITERS[fmt](root, SCHEMA)
    rng = np.random.default_rng(0)
    for i in range(n):
        img = rng.integers(0, 255, (24 + i % 3, 32, 3), np.uint8)
        w.write({"image": jpeg_bytes(img), "label": i, "path": f"src/img{i}.jpg"})
    files, extra = w.close()
    gone = tuple({"path": f"gone/{k:05d}.jpg", "reason": "not an image"} for k in range(skipped))
    Manifest(fmt, n, SCHEMA, ("a",), tuple(FileEntry.of(root, f) for f in files), {}, gone,
             extra).write(root)
    return root


# --- the classes -----------------------------------------------------------------------------

def test_library_errors_are_typed_and_keep_their_builtin(tmp_path):
    with pytest.raises(ConfigError, match="rank 3 of 2") as exc:
        World(3, 2)
    assert isinstance(exc.value, ValueError)
    with pytest.raises(ConfigError, match="must be non-empty"):
        check_key("a.b")
    with pytest.raises(ConfigError, match="compression"):
        WRITERS["hdf5"](tmp_path / "h", SCHEMA, compression="zstd")
    w = WRITERS["lmdb"](tmp_path / "l", SCHEMA)
    with pytest.raises(SampleError) as missing:
        w.write({"image": b"x", "label": 0})
    assert isinstance(missing.value, ValueError) and missing.value.key == "000000000"
    assert str(missing.value).startswith("sample 0 lacks fields ['path']")  # no KeyError quotes
    w.close()
    ld = feedpipe.make_loader(pack("lmdb", tmp_path / "ds", 8), 4, size=16, **U8)
    with pytest.raises(ConfigError, match="seed"):
        ld.load_state_dict({**ld.state_dict(), "seed": 5})


@pytest.mark.parametrize("fmt", ["hdf5"])
def test_bad_json_record_is_a_corrupt_record_under_both_policies(tmp_path, fmt):
    root = pack(fmt, tmp_path / "ds", 16)
    put_hdf5_value(root, "path", 5, b"{not json")  # a damaged record whose checksum matches
    kw = dict(size=16, shuffle=False, num_workers=0, fields=("image", "label", "path"), **U8)
    with pytest.raises(CorruptRecordError, match="key 000000005") as exc:
        list(feedpipe.make_loader(root, 4, **kw))
    assert exc.value.key == "000000005"
    ld = feedpipe.make_loader(root, 4, workers=Workers(on_error="skip"), **kw)
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        labels = [int(v) for b in ld for v in b["label"]]
    assert len(labels) == 16 and 5 not in labels
    assert "key 000000005" in ld.skipped[0]


def test_errors_are_caught_by_intent(tmp_path):
    """Five intents a caller catches (bad input, damaged data, resources, configuration,
    remote): what used to be 33 classes of their own is raised as its intent's class."""
    from converters import convert
    from converters.packer import disk_full
    from feedpipe.dataset.formats.handles import open_error

    (tmp_path / "plain").mkdir()
    (tmp_path / "empty-src").mkdir()
    (tmp_path / "f.tar").write_bytes(b"x")
    for path in (tmp_path / "plain", tmp_path / "f.tar", pack("lmdb", tmp_path / "zero", 0)):
        with pytest.raises(BadInputError):  # not a dataset, a file, no samples
            feedpipe.make_loader(path, 4, size=16, **U8)
    with pytest.raises(BadInputError, match="wrote 0 samples"):
        convert(tmp_path / "empty-src", tmp_path / "out", to="lmdb", workers=0)
    root = pack("lmdb", tmp_path / "ds", 4)
    manifest = json.loads((root / "feedpipe.json").read_text())
    for damage in ({"feedpipe_manifest": 99}, {"files": [{"name": "../x", "size": 1}]}):
        (root / "feedpipe.json").write_text(json.dumps({**manifest, **damage}))
        with pytest.raises(DamagedDataError):  # another version; a file outside the dataset
            feedpipe.open_dataset(root)
    busy = open_error(OSError(errno.EMFILE, "Too many open files"), "a.tar")
    full = disk_full(OSError(errno.ENOSPC, "No space left"), tmp_path / "o", tmp_path / "p")
    assert isinstance(busy, ResourceError) and busy.errno == errno.EMFILE
    assert isinstance(full, ResourceError) and full.errno == errno.ENOSPC
    with pytest.raises(ConfigError):
        feedpipe.make_loader(root, 0)


def test_the_errors_table_is_the_hierarchy():
    """docs/reference/errors.md has one row per class, indented under its intent class, naming
    its builtin bases: checked against the classes themselves."""
    import re

    import feedpipe.errors as errors

    classes = {n: c for n, c in vars(errors).items()
               if isinstance(c, type) and issubclass(c, errors.FeedpipeError)
               and c is not errors.FeedpipeError}
    rows = re.findall(r"^\|[^|]*\| (&nbsp;&nbsp;)?`(\w+)`( \(([^)]*)\))? \|",
                      (Path(__file__).parents[1] / "docs/reference/errors.md").read_text(), re.M)
    assert sorted(r[1] for r in rows) == sorted(classes)
    intent = None
    for leaf, name, _, builtins in rows:
        cls = classes[name]
        if leaf:
            assert issubclass(cls, intent), name
        else:
            intent = cls
            assert cls.__bases__[0] is errors.FeedpipeError, name
        for b in builtins.replace("`", "").split(", ") if builtins else ():
            assert issubclass(cls, getattr(builtins_module, b)), (name, b)


# --- the CLI ---------------------------------------------------------------------------------

def test_user_errors_are_one_line_and_bugs_keep_their_traceback(tmp_path, capsys, monkeypatch):
    (tmp_path / "plain").mkdir()
    rc, out, err = cli_main(capsys, "info", tmp_path / "plain")
    assert rc == 2 and err.count("\n") == 1 and "feedpipe info: error:" in err
    assert "Traceback" not in err
    rc, _, err = cli_main(capsys, "info", tmp_path / "nowhere")  # an OS error about a path
    assert rc == 2 and "nowhere" in err and "Traceback" not in err
    rc, _, err = cli_main(capsys, "--debug", "info", tmp_path / "plain")
    assert rc == 2 and "Traceback" in err and "BadInputError" in err

    def buggy(args: object) -> int:
        raise ValueError("a bug, not the user's mistake")

    monkeypatch.setattr(cli_info, "run", buggy)
    with pytest.raises(ValueError, match="a bug"):  # not turned into "error: ..." and exit 2
        main(["info", str(tmp_path / "plain")])


def test_cli_messages_name_flags_not_python(tmp_path, capsys):
    root = pack("lmdb", tmp_path / "ds", 8)  # images of varying size
    rc, _, err = cli_main(capsys, "tune", root, "--batch-size", "4", "--no-cache",
                          "--device", "cpu")
    assert rc == 2 and "--size HxW" in err and "size=" not in err, err
    rc, _, err = cli_main(capsys, "tune", root, "--batch-size", "0", "--size", "16")
    assert rc == 2 and "--batch-size 0" in err and "batch_size=" not in err, err
    rc, _, err = cli_main(capsys, "bench", root, "--batches", "1")
    assert rc == 2 and "--batches 1:" in err and "batches=" not in err, err
    rc, _, err = cli_main(capsys, "doctor", root, "--batches", "1")
    assert rc == 2 and "--batches 1:" in err and "batches=" not in err, err
    rc, _, err = cli_main(capsys, "bench", root, "--batch-size", "16,0")  # batch_sizes=(16, 0)
    assert rc == 2 and "--batch-size (16, 0): use positive integers" in err, err
    rc, _, err = cli_main(capsys, "bench", root, "--device", "cpu", "--dtype", "float32",
                          "--size", "0", "--batches", "2")
    assert rc == 2 and "--size 0: use an integer of at least 1" in err, err
    assert cli_args.hw_size("96x128") == (96, 128) and cli_args.hw_size("224") == 224
    with pytest.raises(SystemExit):  # argparse names the flag itself
        cli_main(capsys, "tune", root, "--batch-size", "4", "--size", "0x9")
    assert "argument --size" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # was a bare ValueError from float('abc') after parsing
        cli_main(capsys, "convert", tmp_path, "--to", "wds", "-o", tmp_path / "o",
                 "--shard-size", "abc")
    assert "argument --shard-size: 'abc' is not a size" in capsys.readouterr().err


def test_closed_stdout_pipe_ends_quietly(tmp_path):
    root = pack("lmdb", tmp_path / "ds", 2, skipped=4000)  # info --json prints > 64 KiB
    cmd = " ".join([*CLI, "info", "--json", str(root)]) + " | head -n 2"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.splitlines()[0] == "{"
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141  # 128 + SIGPIPE from the writer, through pipefail


# --- empty datasets --------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_empty_dataset_is_refused_by_the_library(tmp_path, fmt):
    root = pack(fmt, tmp_path / fmt, 0)
    with pytest.raises(BadInputError, match="0 samples"):
        feedpipe.make_loader(root, 4, size=16, **U8)
    from feedpipe.tools.tune import autotune

    with pytest.raises(BadInputError, match="0 samples"):
        autotune(root, 4, cache=False, size=16, **U8)


@pytest.mark.parametrize("command, fmt", [("bench", "lmdb"), ("doctor", "hdf5"),
                                          ("tune", "wds")])
def test_empty_dataset_is_refused_by_every_tool_at_once(tmp_path, command, fmt):
    root = pack(fmt, tmp_path / fmt, 0)
    args = {"bench": ["--batches", "3"], "doctor": [], "tune": ["--batch-size", "4"]}[command]
    proc = run_cli(command, root, *args, timeout=90)  # it used to spin at 100% CPU forever
    assert proc.returncode == 2, proc.stderr
    assert "0 samples" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_refuses_a_loader_that_yields_no_batch():
    from feedpipe.tools.monitor import stream

    with pytest.raises(BadInputError, match="no batch"):
        next(stream([], batches=5, epochs=None))


def test_every_feedpipe_error_names_where(tmp_path):
    root = pack("lmdb", tmp_path / "ds", 4)
    ds = feedpipe.open_dataset(root)
    exc = ds.corrupt(2, "example")
    assert isinstance(exc, FeedpipeError) and exc.key == "000000002" and exc.dataset == root
    located = ds.located(exc)
    assert located.file == "src/img2.jpg" and "src/img2.jpg" in str(located)
    assert json.loads((root / "feedpipe.json").read_text())["format_version"] == 2
    assert ConfigError("size=3: x").option is None  # data, never parsed from the message
    assert ConfigError("size=3: x", option="size").option == "size"


def test_every_config_error_that_names_an_option_carries_it():
    """A ConfigError whose message starts with ``name=`` says ``option="name"`` (the CLI names
    the flag from that data; it used to parse the name back out of the message)."""
    import ast
    import re

    root = Path(__file__).parents[1]
    missing = []
    for path in sorted([*root.joinpath("feedpipe").rglob("*.py"),
                        *root.joinpath("converters").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ConfigError"
                    and node.args):
                continue
            first = node.args[0]
            while isinstance(first, ast.BinOp):
                first = first.left
            if isinstance(first, ast.JoinedStr) and first.values:
                first = first.values[0]
            text = first.value if isinstance(first, ast.Constant) else ""
            named = re.match(r"([a-z_][a-z0-9_]*)=", text if isinstance(text, str) else "")
            given = {k.arg: k.value for k in node.keywords}.get("option")
            if named and not (isinstance(given, ast.Constant) and given.value == named[1]):
                missing.append(f"{path.relative_to(root)}:{node.lineno} {named[1]}")
    assert not missing, missing


def test_cli_speaks_flags_from_the_option_not_the_text():
    parser = build_parser()
    flags = parser.commands["bench"].flags
    assert flags["batch_sizes"] == "--batch-size" and flags["batches"] == "--batches"
    assert parser.commands["convert"].flags["distance_truncate"] == "--distance-truncate"  # group
    assert speak_cli("size='ab': use N", "size", flags) == "--size ab: use N"
    assert speak_cli("x: pass size=(H, W) to batch", "size", flags) == "x: pass --size HxW to batch"
    assert speak_cli("batches=1 (--batches): more", "batches", flags) == "--batches 1: more"
    # another option's spelling is not guessed at, nor an option without a flag
    assert speak_cli("seed=-1: use seed=0", None, flags) == "seed=-1: use seed=0"
    assert speak_cli("cuda_sync=1: no", "cuda_sync", flags) == "cuda_sync=1: no"


class _UsersOwn(Exception):
    def __init__(self, a: int, b: int) -> None:  # does not rebuild from its args
        super().__init__(f"{a}/{b}")
        self.lock = threading.Lock()  # nor pickle


def test_an_error_crossing_processes_keeps_its_attributes_notes_and_cause():
    """What a loader worker sends: attributes and notes as they are; a builtin cause as itself,
    a user's class as a RuntimeError naming it (it may neither pickle nor rebuild)."""
    for cause, want in ((KeyError("my bug"), KeyError("my bug")),
                        (_UsersOwn(1, 2), RuntimeError(f"{__name__}._UsersOwn: 1/2"))):
        try:
            try:
                raise cause
            except Exception as exc:
                raise TransformError("boom", dataset="ds", file="a.jpg", key="7") from exc
        except TransformError as exc:
            exc.add_note("worker traceback")
            sent = reduction.ForkingPickler.dumps(exc)
        got = reduction.ForkingPickler.loads(sent)
        assert type(got) is TransformError and str(got) == "boom"
        assert (got.dataset, got.file, got.key, got.__notes__) == ("ds", "a.jpg", "7",
                                                                   ["worker traceback"])
        assert type(got.__cause__) is type(want) and got.__cause__.args == want.args
    opt = reduction.ForkingPickler.loads(reduction.ForkingPickler.dumps(
        ConfigError("size=0: use a positive size", option="size")))
    assert opt.option == "size" and isinstance(opt, ValueError)


def test_a_malformed_storage_option_is_a_usage_error_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["info", str(tmp_path), "--storage-option", "endpoint_url"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "--storage-option: 'endpoint_url': use KEY=VALUE" in err.splitlines()[0]
