"""``feedpipe merge s3://bucket/ds``: the merge's file steps on an object store (WebDataset only).

The parts are already under ``URL/parts/part-IIIII-of-NNNNN/`` (``convert -o URL --part i/N``
uploads them there, each committed by its own manifest). Nothing is copied or moved: the merge
reads the parts' manifests and index files, uploads the merged index files, then the merged
manifest last (the commit point, as in :mod:`converters.remote_output`). An interrupted merge
leaves no top-level manifest, so nothing reads the prefix as a dataset, and running it again
finishes it.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

import numpy as np

from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry, Manifest
from feedpipe.dataset.remote_verify import read_manifest
from feedpipe.errors import ConfigError, OutputRefusedError, PartsError
from feedpipe.paths import cache_dir
from feedpipe.storage import exists, filesystem, join, read_bytes, with_retries

from .output import OutputLock, _shown
from .parts import PARTS_DIR


class RemoteStore:
    """The interface of :class:`converters.merge.LocalStore` over an object-store prefix."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.options = dict(storage_options or {})
        self.fs, root = filesystem(self.url, self.options)
        self.root = root.rstrip("/")
        self.parts = join(self.url, PARTS_DIR)
        self._tmp = Path(tempfile.mkdtemp(prefix="feedpipe-merge-"))
        self._written: dict[str, FileEntry] = {}
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        where = cache_dir() / "merge"
        where.mkdir(parents=True, exist_ok=True)
        self.lock = OutputLock(where / digest)  # two merges of one URL on this machine

    def _key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _held(self) -> set[str]:
        self.fs.invalidate_cache()
        try:
            found = with_retries(lambda: self.fs.find(self.root), self.url, "listing")
        except FileNotFoundError:
            return set()
        return {p[len(self.root) + 1:] for p in found}

    def listed_parts(self) -> list[str]:
        """URLs of the part prefixes under ``URL/parts/`` (each named part-*-of-*)."""
        names = {n.split("/")[1] for n in self._held() if n.startswith(PARTS_DIR + "/")
                 and n.count("/") >= 2}
        return [join(self.parts, n) for n in sorted(names)
                if n.startswith("part-") and "-of-" in n]

    def part_path(self, name: str) -> str:
        return join(self.parts, name)

    def read_manifest(self, url: str) -> Manifest:
        return read_manifest(url, self.options)

    def check_target(self, names: set[str]) -> None:
        """The prefix may hold only its parts and what an interrupted merge of it left."""
        held = self._held()
        if MANIFEST_NAME in held:
            raise OutputRefusedError(f"{self.url}: already a complete dataset (it has "
                                     f"{MANIFEST_NAME}); merge into a new output")
        foreign = sorted(n for n in held if not n.startswith(PARTS_DIR + "/")
                         and n not in names and not n.startswith("."))
        if foreign:
            raise OutputRefusedError(f"{self.url}: holds objects a merge did not make "
                                     f"({_shown(foreign)}); choose another output")

    def adopt(self, src: str | Path, name: str) -> bool:
        """Parts are never copied between objects: they must already be at ``URL/parts/name``."""
        if str(src).rstrip("/") == self.part_path(name):
            return False
        raise PartsError(f"{src}: on object storage a merge takes only the parts already under "
                         f"{self.parts}/ (it never copies shards); convert them with "
                         f"`feedpipe convert ... -o {self.url} --part i/N`")

    def load(self, name: str) -> Any:
        """The .npy array ``URL/name`` (no pickle)."""
        raw = read_bytes(join(self.url, name), self.options)
        return np.load(io.BytesIO(raw), allow_pickle=False)

    def write(self, name: str, write_fn: Callable[[BinaryIO], None]) -> None:
        """Write ``name`` into a local temporary folder, then upload it (PUT is atomic)."""
        with open(self._tmp / name, "xb") as fh:  # a private folder (mkdtemp), a new file
            write_fn(fh)
        self._put(name)

    def _put(self, name: str) -> None:
        entry = FileEntry.of(self._tmp, name)
        with_retries(lambda: self.fs.put_file(str(self._tmp / name), self._key(name)),
                     join(self.url, name), "upload")
        self._written[name] = entry

    def entry(self, name: str) -> FileEntry:
        """Size and SHA-256 of a merged file (from its upload) or of a part's object."""
        if name in self._written:
            return self._written[name]
        raw = read_bytes(join(self.url, name), self.options)
        return FileEntry(name, len(raw), hashlib.sha256(raw).hexdigest())

    def commit(self, manifest: Manifest) -> None:
        """Upload the manifest last: the commit point."""
        try:
            manifest.write(self._tmp)
            self._put(MANIFEST_NAME)
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def refuse_merged(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """A part is never converted into a prefix that is already a merged dataset (its manifest
    lists the parts' objects: replacing one would break it)."""
    if exists(join(url, MANIFEST_NAME), storage_options):
        raise ConfigError(f"{url} is already a merged dataset; convert parts into a new output")
