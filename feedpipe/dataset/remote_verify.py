"""``feedpipe info`` and ``feedpipe verify`` on a URL: the manifest read from object storage, and
every object fetched, its size and SHA-256 checked against the manifest, then its records re-read.

The manifest is validated by :meth:`Manifest.read` itself (from a private temporary folder), so a
URL dataset gets the same checks as a local one: complete, a known version, plain file names.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

from ..errors import FeedpipeError, IncompleteDatasetError, RemoteNotFoundError
from ..storage import download, join, read_bytes, remote_size
from .manifest import MANIFEST_NAME, FileEntry, Manifest
from .verify import VerifyReport, verify

Options = Mapping[str, Any] | None


def read_manifest(url: str, storage_options: Options = None,
                  into: Path | None = None) -> Manifest:
    """Read and validate ``url``'s manifest; a missing one means the conversion did not finish
    (or is still uploading). ``into`` keeps the manifest file in that folder."""
    try:
        raw = read_bytes(join(url, MANIFEST_NAME), storage_options)
    except RemoteNotFoundError as exc:
        raise IncompleteDatasetError(f"{url}: no {MANIFEST_NAME}; its conversion did not finish "
                                     "(or is still uploading), or this is not a feedpipe "
                                     "dataset. Re-run `feedpipe convert`.") from exc
    if into is not None:
        (into / MANIFEST_NAME).write_bytes(raw)
        return Manifest.read(into)
    with tempfile.TemporaryDirectory(prefix="feedpipe-manifest-") as tmp:
        (Path(tmp) / MANIFEST_NAME).write_bytes(raw)
        return Manifest.read(tmp)


def verify_remote(url: str, *, decode: bool = True, storage_options: Options = None,
                  workdir: str | Path | None = None) -> VerifyReport:
    """Fetch every object the manifest lists (into a temporary folder under ``workdir``), check
    its size and SHA-256, then re-read every record as :func:`feedpipe.dataset.verify.verify`.
    Problems name the object's URL."""
    url = url.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="feedpipe-verify-", dir=workdir) as tmp:
        root = Path(tmp)
        manifest = read_manifest(url, storage_options, into=root)
        report = VerifyReport()
        for entry in manifest.files:
            report.files_checked += 1
            where = join(url, entry.name)
            try:
                size = remote_size(where, storage_options)
                if size != entry.size:
                    report.problems.append(f"{where}: size {size}, manifest says {entry.size}")
                    continue
                (root / entry.name).parent.mkdir(parents=True, exist_ok=True)  # parts/.../
                download(where, root / entry.name, size, storage_options)
            except (FeedpipeError, OSError) as exc:
                missing = isinstance(exc, RemoteNotFoundError)
                report.problems.append(f"{where}: missing" if missing else str(exc))
                continue
            if FileEntry.of(root, entry.name).sha256 != entry.sha256:
                report.problems.append(f"{where}: checksum mismatch")
        if report.problems:  # records of a damaged or missing object would only repeat them
            return report
        local = verify(root, decode=decode)
        local.files_checked = report.files_checked
        local.problems = [p.replace(str(root), url) for p in local.problems]
        local.notes = [n.replace(str(root), url) for n in local.notes]
        return local

