"""The public API's shape: make_loader's short signature and option groups, help() on one
screen, typo suggestions, the configuration's check of every option by type (driven by its
annotations) as well as by value, and the resolved configuration a loader shows."""

from __future__ import annotations

import inspect
import pydoc
import re
import textwrap
from typing import Literal, Optional

import pytest
import torch

import converters
import feedpipe
from converters import convert
from feedpipe import Output
from feedpipe.checks import conforms, describe
from feedpipe.errors import ConfigError
from feedpipe.loader.api import make_loader
from feedpipe.loader.config import PREFETCH_DECODE, LoaderConfig, auto_workers


def test_every_keyword_is_documented():
    params = inspect.signature(feedpipe.make_loader).parameters
    assert list(params)[:2] == ["source", "batch_size"]
    shown = {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert shown
    doc = inspect.getdoc(make_loader)
    for name in shown:  # one documented line each (Google style: under "Args:")
        assert re.search(rf"^\s+(\w+, )*{name}(, \w+)*: ", doc, re.M), name


def test_help_fits_on_one_screen():
    """help(feedpipe.make_loader) on a 100-column terminal: at most 50 lines."""
    text = pydoc.render_doc(feedpipe.make_loader, renderer=pydoc.plaintext)
    lines = [w for line in text.splitlines() for w in textwrap.wrap(line, 100) or [""]]
    assert len(lines) <= 50, len(lines)


def test_the_common_case_is_one_line_and_groups_nest_in_the_config(packed):
    ld = feedpipe.make_loader(packed["lmdb"], 8, size=32, crop="random_resized_crop", flip=True)
    assert next(iter(ld))["image"].shape[1:] == (3, 32, 32)
    ld = feedpipe.make_loader(
        packed["lmdb"], 8, size=32, crop=feedpipe.RandomResizedCrop(scale=(0.5, 1.0)),
        device="cpu", num_workers=0, workers=feedpipe.Workers(on_error="skip"),
        output=feedpipe.Output(dtype="uint8", mean=None, std=None),
        sampler=feedpipe.Sampler(shuffle_window=2), backend="torch")
    cfg = ld.config
    assert (cfg.crop, cfg.random_resized_crop.scale, cfg.workers.on_error, cfg.output.dtype,
            cfg.output.mean, cfg.sampler.shuffle_window) == \
        ("random_resized_crop", (0.5, 1.0), "skip", "uint8", None, 2)
    assert next(iter(ld))["image"].dtype == torch.uint8
    assert feedpipe.convert is converters.convert  # Python's convert, beside make_loader


@pytest.mark.parametrize("typo, close", [("flp", "flip"), ("num_worker", "num_workers"),
                                          ("szie", "size")])
def test_typo_names_the_keyword_and_the_closest_option(packed, typo, close):
    with pytest.raises(ConfigError, match=rf"make_loader\(\) got an unexpected keyword argument "
                       rf"'{typo}'; did you mean '{close}'\?") as exc:
        feedpipe.make_loader(packed["lmdb"], 4, **{typo: 1})
    assert exc.value.option == typo
    with pytest.raises(ConfigError, match="the options are shuffle, seed"):
        feedpipe.make_loader(packed["lmdb"], 4, qqqqqq=1)


@pytest.mark.parametrize("group, typo, close", [
    (feedpipe.Workers, "prefech_factor", "prefetch_factor"), (feedpipe.Output, "dtyp", "dtype"),
    (feedpipe.Sampler, "uneve", "uneven"), (feedpipe.RandomResizedCrop, "scales", "scale"),
    (feedpipe.Dali, "readr", "reader"), (feedpipe.Remote, "cache_dri", "cache_dir"),
    (feedpipe.Mix, "weigths", "weights"),
])
def test_typo_in_an_option_group_names_the_closest_field(group, typo, close):
    args = ("s3://b/d",) if group is feedpipe.Remote else ([],) if group is feedpipe.Mix else ()
    with pytest.raises(ConfigError, match=rf"{group.__name__}\(\) got an unexpected keyword "
                       rf"argument '{typo}'; did you mean '{close}'\?") as exc:
        group(*args, **{typo: 1})
    assert exc.value.option == typo


@pytest.mark.parametrize("group, option, value, accepted", [
    (LoaderConfig, "flip", "yes", "True or False"),
    (LoaderConfig, "shuffle", 1, "True or False"),
    (LoaderConfig, "batch_size", 2.0, "positive integer"),
    (LoaderConfig, "size", "224", r"\(height, width\)"),
    (LoaderConfig, "size", (224, 224.0), r"\(height, width\)"),
    (LoaderConfig, "num_workers", 2.0, "'auto' or an int"),
    (LoaderConfig, "device", 3, "a str"),
    (LoaderConfig, "fields", ("image", 1), "a tuple of str or None"),
    (LoaderConfig, "output", "uint8", r"feedpipe\.Output\(\.\.\.\)"),
    (feedpipe.RandomResizedCrop, "scale", "ab", r"a \(float, float\) tuple"),
    (feedpipe.Workers, "pin_memory", "yes", "True, False or 'auto'"),
    (feedpipe.Workers, "multiprocessing_context", "thread",
     "'fork', 'spawn', 'forkserver' or None"),
    (feedpipe.Workers, "max_pixels", 1.5, "positive pixel count"),
    (feedpipe.Output, "dtype", "int7", "'float32', 'float16', 'bfloat16' or 'uint8'"),
    (feedpipe.Dali, "hw_decoder_load", "0.5", "a float"),
    (feedpipe.Mix, "classes", "all", "'equal'"),
    (feedpipe.Remote, "timeout", "30", "seconds > 0"),
])
def test_each_group_refuses_wrong_types_naming_option_and_values(group, option, value, accepted):
    first = {LoaderConfig: "batch_size", feedpipe.Mix: "sources", feedpipe.Remote: "url"}
    given = {first[group]: {LoaderConfig: 4, feedpipe.Mix: []}.get(group, "s3://b/d")} \
        if group in first else {}
    with pytest.raises(ConfigError, match="^" + re.escape(f"{option}={value!r}: ") + f".*{accepted}"
                       ) as exc:
        group(**{**given, option: value})
    assert exc.value.option == option


@pytest.mark.parametrize("make, option, said", [
    (lambda: feedpipe.Workers(prefetch_factor=0), "prefetch_factor", "'auto' or an int >= 1"),
    (lambda: feedpipe.Workers(batch_timeout=0), "batch_timeout", "seconds > 0"),
    (lambda: feedpipe.Output(mean=None), "mean", "mean and std go together"),
    (lambda: feedpipe.Output(std=(1, 0, 1)), "std", "three positive per-channel values"),
    (lambda: feedpipe.Sampler(shuffle_buffer=0), "shuffle_buffer", "positive sample count"),
    (lambda: feedpipe.RandomResizedCrop(scale=(0.5, 0.2)), "scale", "0 < min <= max <= 1"),
    (lambda: feedpipe.Dali(hw_decoder_load=1.5), "hw_decoder_load", r"fraction in \[0, 1\]"),
    (lambda: feedpipe.Remote("s3://b/d", cache_limit="256 parsecs"), "cache_limit", "256 parsecs"),
    (lambda: feedpipe.Remote("s3://b/d", storage_options=[1]), "storage_options", "a dict"),
    (lambda: feedpipe.Mix([], weights=[-1, 2]), "weights", "one positive weight"),
    (lambda: LoaderConfig(4, drop_last=True, sampler=feedpipe.Sampler(uneven="mask")),
     "uneven", "one or the other"),
])
def test_each_group_checks_its_values_when_built(make, option, said):
    with pytest.raises(ConfigError, match=said) as exc:
        make()
    assert exc.value.option == option


def test_config_takes_the_convenient_spellings():
    cfg = LoaderConfig(4, size=32, fields=["image"], output=feedpipe.Output(mean=[0, 0, 0],
                       std=[1, 1, 1]), crop=feedpipe.RandomResizedCrop(scale=(1, 1)),
                       backend=feedpipe.Dali(reader="webdataset"), device=torch.device("cpu"),
                       workers=None)
    assert (cfg.size, cfg.fields, cfg.output.mean, cfg.crop, cfg.random_resized_crop.scale) == \
        ((32, 32), ("image",), (0.0, 0.0, 0.0), "random_resized_crop", (1.0, 1.0))
    assert (cfg.backend, cfg.dali.reader, cfg.device, cfg.workers) == \
        ("dali", "webdataset", torch.device("cpu"), feedpipe.Workers())
    assert all(type(v) is float for v in cfg.output.std)


def test_the_loader_shows_every_choice_resolved(packed, photo_dir, tmp_path):
    """``loader.config`` is the configuration with every "auto" decided, once, from the machine
    and the dataset: the same object the backend reads (its ``describe()`` agrees)."""
    ld = feedpipe.make_loader(packed["lmdb"], 8, size=32)
    cfg = ld.config
    cuda = torch.cuda.is_available()
    assert cfg.device == (torch.device("cuda", torch.cuda.current_device()) if cuda
                          else torch.device("cpu"))
    assert (cfg.backend, cfg.fields, cfg.num_workers) == ("torch", ("image", "label"),
                                                          auto_workers(True))
    assert (cfg.workers.prefetch_factor, cfg.workers.pin_memory, cfg.workers.decode_on) == \
        (PREFETCH_DECODE, cuda, "cpu")
    assert "auto" not in repr(cfg), cfg
    view = ld.describe()
    assert (view.num_workers, view.device, view.backend) == (cfg.num_workers, cfg.device.type,
                                                             cfg.backend)
    assert view.prefetch_factor == (cfg.workers.prefetch_factor if cfg.num_workers else None)
    fixed = feedpipe.make_loader(packed["lmdb"], 8, size=32, device="cpu", num_workers=0,
                                 fields=["image"], workers=feedpipe.Workers(prefetch_factor=3))
    assert (fixed.config.device, fixed.config.num_workers, fixed.config.fields,
            fixed.config.workers.prefetch_factor, fixed.config.workers.pin_memory) == \
        (torch.device("cpu"), 0, ("image",), 3, False)
    raw = tmp_path / "raw"
    convert(photo_dir, raw, to="lmdb", workers=0, store="raw", resize=(24, 24))
    decode_free = feedpipe.make_loader(raw, 4, device="cpu").config
    assert (decode_free.num_workers, decode_free.workers.prefetch_factor) == \
        (auto_workers(False), 2)


def test_conforms_and_describe_each_kind():
    assert conforms(True, bool) and not conforms(1, bool)
    assert conforms(3, int) and not conforms(True, int) and not conforms(3.0, int)
    assert conforms(3, float) and conforms(3.5, float) and not conforms(False, float)
    assert conforms("a", Literal["a", "b"]) and not conforms("c", Literal["a", "b"])
    assert not conforms(1, Literal[True])  # 1 == True, but it is not the literal
    assert conforms(None, Optional[int]) and conforms(None, int | None)
    assert not conforms("x", int | None)
    assert conforms((1, 2), tuple[int, int]) and not conforms((1, 2, 3), tuple[int, int])
    assert not conforms([1, 2], tuple[int, int])
    assert conforms(("a", "b", "c"), tuple[str, ...]) and not conforms(("a", 1), tuple[str, ...])
    assert describe(Literal["pad", "drop"]) == "'pad' or 'drop'"
    assert describe(bool | Literal["auto"]) == "True, False or 'auto'"
    assert describe(tuple[int, int] | None) == "a (int, int) tuple or None"
    assert describe(int) == "an int"


# --- convert(): keyword-only, typed, (height, width) like the loader --------------------------

def test_convert_resize_is_height_width_in_python_and_cli(tmp_path, photo_dir, capsys):
    from fp_helpers import cli_main

    from converters import convert

    res = convert(photo_dir, tmp_path / "py", to="lmdb", workers=0, store="raw", resize=(24, 40))
    assert res.written > 0
    ds = feedpipe.open_dataset(tmp_path / "py")
    assert ds.schema["image"].shape == (24, 40, 3) and ds[0]["image"].shape == (24, 40, 3)
    rc, _, err = cli_main(capsys, "convert", photo_dir, "--to", "lmdb", "-o", tmp_path / "cli",
                          "--store", "raw", "--resize", "24x40", "--workers", "0", "-q")
    assert rc == 0, err
    assert feedpipe.open_dataset(tmp_path / "cli")[0]["image"].shape == (24, 40, 3)
    loader = feedpipe.make_loader(tmp_path / "cli", 4, size=(24, 40), crop="resize",
                                  device="cpu", num_workers=0, output=Output(dtype="uint8"))
    assert tuple(next(iter(loader))["image"].shape[2:]) == (24, 40)  # the same order both ends


def test_convert_options_are_keyword_only_and_typed(tmp_path, photo_dir):
    from converters import PackOptions, convert, parse_resize

    params = inspect.signature(convert).parameters
    assert [n for n, p in params.items() if p.kind is not inspect.Parameter.KEYWORD_ONLY] == \
        ["src", "out"]
    with pytest.raises(TypeError):
        convert(photo_dir, tmp_path / "o", "lmdb")  # type: ignore[misc]
    for kwargs, match in [({"resize": "320x240"}, r"resize='320x240': use .*\(height, width\)"),
                          ({"resize": (1, 2, 3)}, r"resize=\(1, 2, 3\): use .*\(height, width\)"),
                          ({"quality": 90.0}, r"quality=90.0: use an int"),
                          ({"store": "row"}, r"store='row': use 'passthrough', 'reencode'"),
                          ({"mask_dtype": "int8"}, r"mask_dtype='int8': use 'uint8' or 'uint16'"),
                          ({"max_pixels": "many"}, r"max_pixels='many': use an int or None")]:
        with pytest.raises(ConfigError, match=match):
            convert(photo_dir, tmp_path / "o", to="lmdb", workers=0, **kwargs)
    assert not (tmp_path / "o").exists()
    assert PackOptions("raw", [24, 40]).raw_shape == (24, 40, 3)
    assert parse_resize("240x320") == (240, 320) and parse_resize("256") == 256
    with pytest.raises(ConfigError, match="HxW .*height x width"):
        parse_resize("240 by 320")


def test_cli_choices_come_from_the_literal_types():
    from typing import get_args

    from converters.options import Codec, Layout, Store
    from feedpipe.cli.app import build_parser
    from feedpipe.loader.config import Crop, Dtype

    def choices(command: str, dest: str) -> tuple:
        parser = build_parser()
        sub = next(a for a in parser._actions if a.dest == "command").choices[command]
        return tuple(next(a for a in sub._actions if a.dest == dest).choices)

    assert choices("convert", "store") == get_args(Store)
    assert choices("convert", "codec") == get_args(Codec)
    assert choices("convert", "layout") == get_args(Layout)
    assert choices("tune", "crop") == get_args(Crop)
    assert choices("tune", "dtype") == get_args(Dtype)


def test_default_fields_are_decided_once():
    from feedpipe.loader.config import DEFAULT_FIELDS

    assert DEFAULT_FIELDS == ("image", "label")
    assert LoaderConfig(4).fields_in({"image", "path"}) == ("image",)
    assert LoaderConfig(4).fields_in({"label", "image", "mask"}) == ("image", "label")
    assert LoaderConfig(4, fields=["mask"]).fields_in({"image", "mask"}) == ("mask",)


def test_convert_takes_the_image_options_as_keywords_only(tmp_path, photo_dir):
    """One way to pass options: keywords; ``options=PackOptions`` is gone."""
    from converters import convert

    convert(photo_dir, tmp_path / "kw", to="hdf5", workers=0, store="raw", resize=(24, 40),
            codec="png")
    ds = feedpipe.open_dataset(tmp_path / "kw")
    assert ds.schema["image"].shape == (24, 40, 3)
    conversion = ds.manifest.conversion
    assert (conversion["store"], tuple(conversion["resize"])) == ("raw", (24, 40))
    with pytest.raises(TypeError, match="options"):
        convert(photo_dir, tmp_path / "both", to="lmdb", workers=0,  # type: ignore[call-arg]
                options=None)
    with pytest.raises(ConfigError, match="targets are computed from masks"):
        convert(photo_dir, tmp_path / "nomask", to="lmdb", workers=0, targets=["boundary"])
    assert not (tmp_path / "both").exists() and not (tmp_path / "nomask").exists()
