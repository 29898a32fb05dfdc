"""Real servers on 127.0.0.1 for the remote-storage tests: moto's standalone S3 server,
gcp-storage-emulator (a GCS JSON-API server, for gs://), and a fault-injecting HTTP server (this
file run as a script) that serves a folder (with Range requests), forwards to an upstream (moto,
the GCS emulator) as a reverse proxy, or serves a folder of repositories as a Hugging Face Hub
(``--hf``: the part of the Hub's HTTP API that huggingface_hub's ``HfFileSystem`` uses to resolve
a revision, list, stat and read files; see :class:`HubRepos`).

Faults are set over HTTP while it runs (``POST /__faults__`` with a JSON list of rules), and it
keeps an access log (``GET /__log__``): method, path, query string, Range, status, body bytes
(-1: cut), User-Agent (which client sent it: ``object_store/...`` is obstore), the access key id and
session token an S3 request was signed with, and the client's ``X-Client`` header (a tag telling
apart processes or simulated nodes), per request.
Rule keys: ``match`` (a substring of the path; default every path), ``skip`` (matching requests
let through before the rule applies; default 0), ``kind``:
- ``status``: answer ``status`` (500, 503, 429...) ``times`` times (-1: always);
- ``drop``: send ``after`` bytes of the body, then cut the connection;
- ``corrupt``: flip one byte of the body (``times``);
- ``delay``: wait ``seconds`` before answering (a client timeout);
- ``hang``: accept the request and never answer (the connection is held open ``seconds``,
  default an hour, then closed unanswered): a store that accepts connections and goes silent;
- ``norange``: ignore the ``Range`` header: a 200 with the whole file (folder and Hub modes);
- ``throttle``: cap every response body at ``rate`` bytes/s;
- ``link``: cap all response bodies together at ``rate`` bytes/s (one shared link).
Only GET and HEAD requests are faulted, so uploads (PUT) still go through.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

PYTHON = sys.executable
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
#: the S3 error code an injected status answers with (clients map codes before statuses)
_CODES = {403: "AccessDenied", 404: "NoSuchKey", 429: "SlowDown", 500: "InternalError",
          503: "SlowDown"}
_SIGNER = re.compile(r"Credential=([^/,\s]+)/")  # the access key id a SigV4 request is signed by


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rules: list[dict[str, Any]] = []
        self.log: list[dict[str, Any]] = []
        self.link_free = 0.0  # when the shared link (``link`` rule) can send its next bytes

    def link_slot(self, nbytes: int, rate: float) -> float:
        """Book ``nbytes`` on the shared link: the monotonic time they finish sending."""
        with self.lock:
            self.link_free = max(self.link_free, time.monotonic()) + nbytes / rate
            return self.link_free

    def take(self, path: str, kinds: tuple[str, ...]) -> dict[str, Any] | None:
        """The first rule of ``kinds`` matching ``path`` with uses left (one use taken)."""
        with self.lock:
            for rule in self.rules:
                if rule["kind"] in kinds and rule.get("match", "") in path \
                        and rule.get("times", -1) != 0:
                    if rule.get("skip", 0) > 0:  # let this many matching requests through first
                        rule["skip"] -= 1
                        continue
                    if rule.get("times", -1) > 0:
                        rule["times"] -= 1
                    return dict(rule)
        return None


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


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State
    root: Path | None = None
    upstream: str | None = None
    hub: HubRepos | None = None

    def log_message(self, *args: Any) -> None:  # quiet: the access log is kept as JSON
        pass

    def _control(self) -> bool:
        if self.path == "/__log__":
            with self.state.lock:
                self._reply(200, json.dumps(self.state.log).encode())
            return True
        if self.path == "/__faults__":
            n = int(self.headers.get("Content-Length", 0))
            rules = json.loads(self.rfile.read(n) or b"[]")
            with self.state.lock:
                self.state.rules = rules
                self.state.log = [] if self.headers.get("X-Clear-Log") else self.state.log
            self._reply(200, b"ok")
            return True
        return False

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None,
               head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _record(self, status: int, nbytes: int) -> dict[str, Any]:
        """Log the request before its answer goes out, so a client that has the answer never
        finds the log without it (a test clearing the log next would get a stray entry)."""
        m = _SIGNER.search(self.headers.get("Authorization", ""))
        path, _, query = self.path.partition("?")
        entry = {"method": self.command, "path": path, "query": query,
                 "range": self.headers.get("Range"), "status": status, "bytes": nbytes,
                 "time": time.time(), "agent": self.headers.get("User-Agent", ""),
                 "key_id": m[1] if m else None, "token": self.headers.get("x-amz-security-token"),
                 "client": self.headers.get("X-Client")}
        with self.state.lock:
            self.state.log.append(entry)
        return entry

    def _serve(self) -> None:
        if self._control():
            return
        head = self.command == "HEAD"
        faulted = self.command in ("GET", "HEAD")
        rule = self.state.take(self.path, ("delay",)) if faulted else None
        if rule:
            self._record(0, 0)  # status 0: held back (the client may give up meanwhile)
            time.sleep(rule["seconds"])
        rule = self.state.take(self.path, ("hang",)) if faulted else None
        if rule:
            self._record(0, 0)
            time.sleep(rule.get("seconds", 3600))
            self.close_connection = True
            return
        rule = self.state.take(self.path, ("status",)) if faulted else None
        if rule:
            code = _CODES.get(rule["status"], "InternalError" if rule["status"] >= 500
                              else "InvalidRequest")
            body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            self._record(rule["status"], 0)
            self._reply(rule["status"], body, {"Retry-After": "0"}, head)
            return
        status, headers, body = self._upstream() if self.upstream else \
            self._hub() if self.hub else self._file()
        if faulted and not head and status in (200, 206):
            if self.state.take(self.path, ("corrupt",)) and body:
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            drop = self.state.take(self.path, ("drop",))
            if drop:
                self._record(status, -1)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: drop.get("after", 0)])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
        entry = self._record(status, 0 if head else len(body))
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self._send(body)
        except OSError:
            with self.state.lock:
                entry["bytes"] = -1  # the client went away mid-body: not served
            raise

    def _send(self, body: bytes) -> None:
        link = self.state.take(self.path, ("link",))
        if link:
            step = max(1, int(link["rate"]) // 100)
            for i in range(0, len(body), step):
                chunk = body[i: i + step]
                ahead = self.state.link_slot(len(chunk), link["rate"]) - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                self.wfile.write(chunk)
            return
        throttle = self.state.take(self.path, ("throttle",))
        if not throttle:
            self.wfile.write(body)
            return
        step = max(1, int(throttle["rate"]) // 50)
        start = time.monotonic()
        for i in range(0, len(body), step):
            self.wfile.write(body[i: i + step])
            ahead = (i + step) / throttle["rate"] - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)

    def _file(self) -> tuple[int, dict[str, str], bytes]:
        assert self.root is not None
        rel = urllib.request.url2pathname(self.path.split("?")[0]).lstrip("/")
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve()) or not path.is_file():
            return 404, {}, b"not found"
        if self.command == "PUT":
            n = int(self.headers.get("Content-Length", 0))
            path.write_bytes(self.rfile.read(n))
            return 201, {}, b""
        return self._ranged(path.read_bytes())

    def _ranged(self, data: bytes, headers: dict[str, str] | None = None
                ) -> tuple[int, dict[str, str], bytes]:
        """``data``, or the part of it the request's ``Range`` header asks for."""
        headers = {**(headers or {}), "Accept-Ranges": "bytes"}
        m = _RANGE.match(self.headers.get("Range", ""))
        if m and not self.state.take(self.path, ("norange",)):
            start = int(m[1])
            end = min(int(m[2]) if m[2] else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return 416, {"Content-Range": f"bytes */{len(data)}"}, b""
            return 206, {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}, \
                data[start: end + 1]
        return 200, headers, data

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

    def _upstream(self) -> tuple[int, dict[str, str], bytes]:
        assert self.upstream is not None
        host, port = self.upstream.split(":")
        n = int(self.headers.get("Content-Length", 0) or 0)
        body = self.rfile.read(n) if n else None
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "content-length"}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            keep = {k: v for k, v in resp.getheaders()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                         "date", "server")}
            return resp.status, keep, data
        finally:
            conn.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


class Server:
    """A server subprocess on 127.0.0.1 (``url``); ``stop()`` ends it."""

    def __init__(self, args: list[str], what: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([*args, str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        _wait_ready(self.port, self.proc, what)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class FaultServer(Server):
    """This file's HTTP server in a subprocess: serving ``root`` (Range requests; with ``hf``,
    as a Hugging Face Hub of the repositories in it, see :class:`HubRepos`) or forwarding to
    ``upstream`` (``http://127.0.0.1:PORT``). The fault rules apply in every mode."""

    def __init__(self, root: Path | None = None, upstream: str | None = None,
                 hf: bool = False) -> None:
        target = [("--hf" if hf else "--root"), str(root)] if root is not None else \
            ["--upstream", str(upstream).removeprefix("http://")]
        super().__init__([PYTHON, __file__, *target], "fault server")

    def faults(self, rules: list[dict[str, Any]], clear_log: bool = True) -> None:
        """Replace the fault rules (and, by default, clear the access log)."""
        req = urllib.request.Request(f"{self.url}/__faults__", json.dumps(rules).encode(),
                                     {"X-Clear-Log": "1"} if clear_log else {}, method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def log(self) -> list[dict[str, Any]]:
        """The access log since the last clear."""
        return json.loads(urllib.request.urlopen(f"{self.url}/__log__", timeout=10).read())

    def fetched(self, suffix: str = ".tar") -> dict[str, int]:
        """Body bytes served per path ending in ``suffix`` (successful GETs)."""
        out: dict[str, int] = {}
        for e in self.log():
            if e["method"] == "GET" and e["status"] in (200, 206) and e["path"].endswith(suffix):
                out[e["path"]] = out.get(e["path"], 0) + max(e["bytes"], 0)  # -1: cut
        return out


class MotoServer(Server):
    """moto's standalone S3 server (``python -m moto.server``) on 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__([PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p"], "moto server")


class GcsServer(Server):
    """gcp-storage-emulator (``python -m gcp_storage_emulator start``, in memory) on 127.0.0.1:
    the GCS JSON API gcsfs speaks, with ranged media downloads and resumable uploads."""

    def __init__(self) -> None:
        super().__init__([PYTHON, "-m", "gcp_storage_emulator", "start", "--in-memory", "-q",
                          "--host", "127.0.0.1", "--port"], "gcp-storage-emulator")


#: gcsfs's switch for its ExtendedGcsFileSystem (read when gcsfs is imported)
GCSFS_EXTENDED = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def s3_options(endpoint: str) -> dict[str, Any]:
    """storage_options for s3fs against ``endpoint`` (moto or the proxy in front of it)."""
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint},
            "config_kwargs": {"retries": {"max_attempts": 1}}, "skip_instance_cache": True}


def gcs_options(endpoint: str) -> dict[str, Any]:
    """storage_options for gcsfs against ``endpoint`` (the emulator or the proxy in front of
    it): gcsfs's documented ``endpoint_url``, anonymous (the emulator checks no token)."""
    return {"token": "anon", "endpoint_url": endpoint, "skip_instance_cache": True}


def _key(url: str) -> str:
    """``bucket/prefix`` of ``s3://bucket/prefix`` or ``gs://bucket/prefix``."""
    return url.split("://", 1)[1].rstrip("/")


def upload_tree(local: Path, url: str, options: dict[str, Any]) -> None:
    """Copy a local dataset folder to ``url`` (s3:// or gs://bucket/prefix), creating the
    bucket."""
    import fsspec

    fs = fsspec.filesystem(url.split("://", 1)[0], **options)
    bucket = _key(url).split("/")[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for p in sorted(local.iterdir()):
        if p.is_file():
            fs.put_file(str(p), f"{_key(url)}/{p.name}")


def upload_packed(packed: dict[str, Path], bucket: str, options: dict[str, Any]
                  ) -> dict[str, str]:
    """Each packed dataset copied under ``bucket`` (``s3://name``, ``gs://name``):
    {format: its URL}."""
    out = {fmt: f"{bucket}/{fmt}" for fmt in packed}
    for fmt, path in packed.items():
        upload_tree(path, out[fmt], options)
    return out


def main(argv: list[str]) -> None:
    root = upstream = hub = None
    if argv[0] == "--root":
        root = Path(argv[1])
    elif argv[0] == "--hf":
        hub = HubRepos(Path(argv[1]))
    else:
        upstream = argv[1]
    port = int(argv[2])
    handler = type("H", (Handler,), {"state": _State(), "root": root, "upstream": upstream,
                                     "hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    os.environ.pop("HTTP_PROXY", None)
    main(sys.argv[1:])


# -- pytest fixtures (tests/conftest.py imports them) ----------------------------------------------
try:
    import pytest
except ImportError:  # run as the server script
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    # gcsfs's default filesystem (ExtendedGcsFileSystem) asks the storage-control gRPC API for
    # each bucket's layout; the emulator speaks HTTP only, so every lookup would wait 60 s
    os.environ.setdefault(GCSFS_EXTENDED, "false")

    def _behind_proxy(server: Any, options: Callable[[str], dict[str, Any]]
                      ) -> Iterator[tuple[FaultServer, dict[str, Any]]]:
        """``server`` with a fault proxy in front: (proxy, ``options(proxy URL)``); both stopped
        at the end."""
        proxy = FaultServer(upstream=server.url)
        try:
            yield proxy, options(proxy.url)
        finally:
            proxy.stop()
            server.stop()

    @pytest.fixture(scope="session")
    def moto_s3(tmp_path_factory: pytest.TempPathFactory):
        """moto's S3 server with a fault proxy in front: (proxy, storage_options)."""
        pytest.importorskip("s3fs")
        pytest.importorskip("moto")
        yield from _behind_proxy(MotoServer(), s3_options)

    @pytest.fixture(scope="session")
    def moto():
        """moto's S3 server alone (no proxy), for tests that write."""
        pytest.importorskip("s3fs")
        pytest.importorskip("moto")
        server = MotoServer()
        yield server
        server.stop()

    def _fresh_bucket(protocol: str, opts: dict[str, Any], tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
                      ) -> tuple[str, dict[str, Any], Any]:
        """A bucket named after the test: (bucket URL, storage options, filesystem); the
        staging folder (``XDG_CACHE_HOME``) under ``tmp_path / "xdg"``."""
        import fsspec

        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        fs = fsspec.filesystem(protocol, **opts)
        bucket = "b-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:20]
        fs.mkdir(bucket)
        return f"{protocol}://{bucket}", opts, fs

    @pytest.fixture
    def s3(moto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
        """A fresh bucket on ``moto``: (bucket URL, storage options, s3fs); the staging folder
        (``XDG_CACHE_HOME``) under ``tmp_path / "xdg"``."""
        return _fresh_bucket("s3", s3_options(moto.url), tmp_path, monkeypatch, request)

    @pytest.fixture(scope="session")
    def s3_packed(moto_s3, packed: dict[str, Path]) -> dict[str, str]:
        """The session's packed datasets uploaded to the S3 server: {format: s3 URL}."""
        return upload_packed(packed, "s3://feedpipe-test", moto_s3[1])

    @pytest.fixture(scope="session")
    def gcs():
        """gcp-storage-emulator with a fault proxy in front: (proxy, storage_options)."""
        pytest.importorskip("gcsfs")
        pytest.importorskip("gcp_storage_emulator")
        yield from _behind_proxy(GcsServer(), gcs_options)

    @pytest.fixture
    def gs(gcs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
           request: pytest.FixtureRequest):
        """A fresh bucket on the GCS emulator (through its proxy): (bucket URL, storage
        options, gcsfs); the staging folder (``XDG_CACHE_HOME``) under ``tmp_path / "xdg"``."""
        return _fresh_bucket("gs", gcs[1], tmp_path, monkeypatch, request)

    @pytest.fixture(scope="session")
    def gcs_packed(gcs, packed: dict[str, Path]) -> dict[str, str]:
        """The session's packed datasets uploaded to the GCS emulator: {format: gs URL}."""
        return upload_packed(packed, "gs://feedpipe-test", gcs[1])

    @pytest.fixture(scope="session")
    def hf_hub(packed: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
        """A Hugging Face Hub on 127.0.0.1 (``FaultServer(hf=True)``) holding the dataset repos
        ``feedpipe/photos`` (``ds/``: the packed wds dataset on main and ``refs/pr/1``, the
        lmdb one on branch ``v1``) and ``feedpipe/faults`` (the wds dataset, for fault tests),
        with huggingface_hub pointed at it the documented way: ``HF_ENDPOINT``, a private
        ``HF_HOME`` (no user token or cache), ``HF_HUB_OFFLINE`` unset, set for this process
        and the processes it starts. Yields (server, {"photos": URL, "faults": URL})."""
        pytest.importorskip("huggingface_hub")
        root = tmp_path_factory.mktemp("hub")
        layout = {"photos/ds": packed["wds"], "photos@v1/ds": packed["lmdb"],
                  "photos@refs%2Fpr%2F1/ds": packed["wds"], "faults/ds": packed["wds"]}
        for dst, src in layout.items():
            shutil.copytree(src, root / "datasets" / "feedpipe" / dst, copy_function=os.link)
        server = FaultServer(root, hf=True)
        try:
            with pytest.MonkeyPatch.context() as mp:
                for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
                             "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN_PATH"):
                    mp.delenv(name, raising=False)
                mp.setenv("HF_ENDPOINT", server.url)
                mp.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
                mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
                _reread_hf_constants()
                yield server, {r: f"hf://datasets/feedpipe/{r}/ds" for r in ("photos", "faults")}
        finally:
            server.stop()
            _reread_hf_constants()

    @pytest.fixture(scope="session")
    def http_packed(packed: dict[str, Path]):
        """A fault server over the packed datasets' folder: (server, {format: http URL})."""
        pytest.importorskip("aiohttp")
        root = next(iter(packed.values())).parent
        server = FaultServer(root=root)
        try:
            yield server, {fmt: f"{server.url}/{p.name}" for fmt, p in packed.items()}
        finally:
            server.stop()


def _reread_hf_constants() -> None:
    """huggingface_hub reads ``HF_ENDPOINT``, ``HF_HOME`` and the rest into
    ``huggingface_hub.constants`` when it is first imported: read them again in a process that
    imported it before (a fresh process, a spawned worker, reads them itself)."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        importlib.reload(constants)


def objects(fs: Any, url: str) -> dict[str, bytes]:
    """Every object under ``url`` (s3:// or gs://bucket/prefix), by its key below the prefix."""
    fs.invalidate_cache()
    root = _key(url)
    return {p[len(root) + 1:]: fs.cat_file(p) for p in fs.find(root)}


def cli_opts(opts: dict[str, Any], prefix: str = "") -> list[str]:
    """The CLI's ``--storage-option`` flags for the text options of :func:`s3_options` or
    :func:`gcs_options` (credentials, endpoint; a nested one dotted)."""
    out: list[str] = []
    for k, v in opts.items():
        if isinstance(v, dict):
            out += cli_opts(v, f"{prefix}{k}.")
        elif isinstance(v, str):
            out += ["--storage-option", f"{prefix}{k}={v}"]
    return out
