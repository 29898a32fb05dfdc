"""The API reference (docs/reference/, built by mkdocs + mkdocstrings): every public name is on
it, parameters render as tables, Sphinx roles never show raw, internals stay off it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import feedpipe

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
# public names that live outside ``feedpipe.__all__``, each in the module docs name for it
OUTSIDE = {
    "feedpipe.loader.transforms": ["RandomAffine"],
    "feedpipe.loader.augment": ["ColorJitter", "RandomGrayscale", "RandomErasing", "MixUp",
                                "CutMix"],
    "feedpipe.dataset.windows": ["Windows"],
    "converters": ["convert", "pack_arrays", "LabelColumns", "Target", "make_distance_map",
                   "make_boundary", "ConvertResult"],
    "feedpipe.integrations.lightning": ["FeedpipeDataModule", "FeedpipeCallback"],
    "feedpipe.integrations.accelerate": ["prepare", "AcceleratedLoader"],
    "feedpipe.integrations.transformers": ["FeedpipeTrainer"],
}


def _directives() -> list[tuple[str, str | None]]:
    """(identifier, custom heading) of every ``::: identifier`` on the reference pages."""
    out = []
    for page in sorted(REFERENCE.glob("*.md")):
        text = page.read_text()
        for m in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", text, re.M):
            heading = re.search(r"^\s+heading: (\S+)", m.group(2), re.M)
            out.append((m.group(1), heading.group(1) if heading else None))
    return out


def test_every_public_name_is_in_the_reference() -> None:
    shown = {name for ident, heading in _directives() for name in (ident, heading) if name}
    modules = {ident for ident, _ in _directives()}
    missing = []
    for name in feedpipe.__all__:
        home = feedpipe._EXPORTS[name]
        if f"feedpipe.{name}" not in shown and f"feedpipe.{home}" not in modules:
            missing.append(f"feedpipe.{name}")
    for module, names in OUTSIDE.items():
        missing += [f"{module}.{n}" for n in names
                    if not any(s.endswith(f".{n}") for s in shown) and module not in modules]
    assert not missing, f"not on docs/reference/*.md: {missing}"


def test_every_reference_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"reference/{p.name}" in nav for p in REFERENCE.glob("*.md"))


@pytest.mark.skipif(importlib.util.find_spec("mkdocstrings_handlers") is None,
                    reason="the docs extra (mkdocs, mkdocstrings) is not installed")
def test_reference_renders_parameters_and_hides_internals(tmp_path: Path) -> None:
    """Built strictly as CI builds it: make_loader's and the groups' parameters are tables,
    no ``:class:`` role shows raw, and the reader lists no internal method."""
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pages = {p.parent.name if p.name == "index.html" else p.stem: p.read_text()
             for p in (site / "reference").rglob("*.html")}
    for name, html in pages.items():
        text = re.sub(r"<[^>]+>", "", html)
        assert not re.search(r":(class|func|meth|mod|attr|data|exc):`", text), name
    loading = pages["reference"]

    def section(html: str, ident: str) -> str:
        """``ident``'s part of the page: its heading up to the next object not its member."""
        start = html.index(f'id="{ident}"')
        for m in re.finditer(r'id="([^"]+)" class="doc doc-heading"', html[start + 1:]):
            if not m.group(1).startswith(f"{ident}."):
                return html[start:start + 1 + m.start()]
        return html[start:]

    table = section(loading, "feedpipe.make_loader")
    assert "doc-section-title" in table and "Parameters" in table
    for param in ("source", "batch_size", "crop", "workers", "output", "sampler", "backend"):
        assert re.search(rf"<code>{param}</code>", table), param
    for group in ("Workers", "Output", "Sampler", "Remote", "Mix", "Dali"):
        assert "Parameters" in section(loading, f"feedpipe.{group}"), group
    reader = section(pages["datasets"], "feedpipe.DatasetReader")
    for internal in ("check_root", "check_size", "check_id", "located", "corrupt", "unsafe",
                     "stray_entries", "plan_ahead"):
        assert f"feedpipe.DatasetReader.{internal}" not in reader, internal
    assert "feedpipe.DatasetReader.get_batch" in reader
