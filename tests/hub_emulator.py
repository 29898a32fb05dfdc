"""A Hugging Face Hub emulator for the remote-storage tests: a folder of repositories
(:class:`HubRepos`) and the part of the Hub's HTTP API that huggingface_hub's ``HfFileSystem``
uses to resolve a revision, list, stat and read files (:class:`HubRoutes`, served by the fault
proxy in its ``--hf`` mode, ``servers.FaultServer(root, hf=True)``)."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import urllib.parse
from pathlib import Path
from typing import Any


def _git_sha1(data: bytes, kind: str = "blob") -> str:
    """Git's object id of ``data`` (the Hub's ``oid`` of a file, and its ``ETag``)."""
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).hexdigest()


class HubRepos:
    """A folder of repositories laid out as the Hub names them: ``ROOT/datasets/ORG/NAME/`` is
    the ``main`` revision of dataset ``ORG/NAME`` (``models/`` and ``spaces/`` likewise), and a
    sibling ``NAME@REV/`` (REV percent-quoted, so ``refs%2Fpr%2F1``) is the branch or tag REV.
    Each revision's commit id is a hash of its name; it is accepted as a revision too."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    @staticmethod
    def commit(kind: str, repo_id: str, rev: str) -> str:
        return hashlib.sha1(f"{kind}/{repo_id}@{rev}".encode()).hexdigest()

    def revision(self, kind: str, repo_id: str, rev: str | None
                 ) -> tuple[Path, str] | tuple[None, str]:
        """(folder, commit id) of ``rev`` (None: main), or (None, Hub error code)."""
        base = self.root / f"{kind}s" / repo_id
        if ".." in repo_id.split("/") or not base.is_dir():
            return None, "RepoNotFound"
        revs = {"main": base} | {urllib.parse.unquote(p.name.split("@", 1)[1]): p
                                 for p in base.parent.glob(f"{base.name}@*") if p.is_dir()}
        rev = rev or "main"
        for name, folder in revs.items():
            if rev in (name, self.commit(kind, repo_id, name)):
                return folder, self.commit(kind, repo_id, name)
        return None, "RevisionNotFound"

    @staticmethod
    def entry(folder: Path, path: Path) -> dict[str, Any]:
        """A ``tree`` / ``paths-info`` entry (no ``xetHash``: files are read over plain HTTP)."""
        rel = path.relative_to(folder).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": _git_sha1(rel.encode(), "tree"), "path": rel}
        data = path.read_bytes()
        return {"type": "file", "oid": _git_sha1(data), "size": len(data), "path": rel}

    @staticmethod
    def find(folder: Path, rel: str) -> Path | None:
        """``rel`` inside ``folder`` (None when missing or outside it)."""
        path = (folder / rel).resolve()
        ok = path.is_relative_to(folder.resolve()) and path.exists()
        return path if ok else None


class HubRoutes:
    """The Hub's routes, mixed into the fault proxy's request handler (which gives ``path``,
    ``headers``, ``rfile`` and ``_ranged``); ``hub`` is set in its ``--hf`` mode."""

    hub: HubRepos | None = None
    path: str
    headers: Any
    rfile: Any
    _ranged: Any

    def _hub(self) -> tuple[int, dict[str, str], bytes]:
        """The Hub's API (``/api/{kind}s/{repo}[/revision|tree|paths-info/{rev}[/{path}]]``) and
        files (``[/{kind}s]/{repo}/resolve/{rev}/{path}``), as huggingface_hub calls them: the
        revision and a tree path arrive percent-quoted whole (``refs%2Fpr%2F1``), errors carry
        the ``X-Error-Code`` header (RepoNotFound, RevisionNotFound, EntryNotFound) that
        huggingface_hub maps to its exceptions."""
        assert self.hub is not None
        raw = self.path.split("?")[0]
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        parts = raw.strip("/").split("/")
        unq = urllib.parse.unquote
        api = parts[0] == "api"
        if api:
            parts = parts[1:]
        kind = parts[0][:-1] if parts and parts[0] in ("datasets", "spaces", "models") else None
        if kind is None and api or len(parts) < 2 + (kind is not None):
            return self._hub_error(404, "RepoNotFound")
        parts = parts[1:] if kind else parts
        kind, repo_id, rest = kind or "model", f"{parts[0]}/{parts[1]}", parts[2:]
        op = rest[0] if rest else ("info" if api else "")
        if (api and op not in ("info", "revision", "tree", "paths-info")) or \
                (not api and (op != "resolve" or len(rest) < 3)):
            return self._hub_error(404, "EntryNotFound")
        folder, commit = self.hub.revision(kind, repo_id, unq(rest[1]) if len(rest) > 1 else None)
        if folder is None:
            return self._hub_error(404, commit)
        if op in ("info", "revision"):
            return 200, {"Content-Type": "application/json"}, json.dumps(
                {"id": repo_id, "sha": commit, "private": False}).encode()
        if op == "paths-info":
            n = int(self.headers.get("Content-Length", 0) or 0)
            form = urllib.parse.parse_qs(self.rfile.read(n).decode())
            found = [self.hub.find(folder, p) for p in form.get("paths", [])]
            return 200, {"Content-Type": "application/json"}, json.dumps(
                [self.hub.entry(folder, p) for p in found if p is not None]).encode()
        rel = unq("/".join(rest[2:]))
        path = self.hub.find(folder, rel)
        if op == "tree":
            if path is None or not path.is_dir():
                return self._hub_error(404, "EntryNotFound")
            deep = query.get("recursive", ["false"])[0].lower() == "true"
            found = sorted(path.rglob("*") if deep else path.iterdir())
            return 200, {"Content-Type": "application/json"}, json.dumps(
                [self.hub.entry(folder, p) for p in found]).encode()
        if path is None or not path.is_file():
            return self._hub_error(404, "EntryNotFound")
        data = path.read_bytes()
        return self._ranged(data, {"ETag": f'"{_git_sha1(data)}"', "X-Repo-Commit": commit})

    def _hub_error(self, status: int, code: str) -> tuple[int, dict[str, str], bytes]:
        body = json.dumps({"error": f"{code}: {self.path}"}).encode()
        return status, {"X-Error-Code": code, "X-Error-Message": code,
                        "Content-Type": "application/json"}, body


def reread_hf_constants() -> None:
    """huggingface_hub reads ``HF_ENDPOINT``, ``HF_HOME`` and the rest into
    ``huggingface_hub.constants`` when it is first imported: read them again in a process that
    imported it before (a fresh process, a spawned worker, reads them itself)."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        importlib.reload(constants)
