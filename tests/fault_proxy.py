"""The fault-injecting HTTP server of the remote-storage tests, run as a script on 127.0.0.1
(``servers.FaultServer`` starts it): it serves a folder (with Range requests), forwards to an
upstream (moto, the GCS emulator) as a reverse proxy, or serves a folder of repositories as a
Hugging Face Hub (``--hf``, :mod:`hub_emulator`).

Faults are set over HTTP while it runs (``POST /__faults__`` with a JSON list of rules), and it
keeps an access log (``GET /__log__``): method, path, query string, Range, status, body bytes
(-1: cut), User-Agent (which client sent it), the access key id and session token an S3 request
was signed with, and the client's ``X-Client`` header (a tag telling apart processes or
simulated nodes), per request.
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

import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hub_emulator import HubRepos, HubRoutes

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


class Handler(HubRoutes, BaseHTTPRequestHandler):
    """One request: a control path, else the fault rules, then the folder, the upstream or the
    Hub (:class:`~hub_emulator.HubRoutes`) answers."""

    protocol_version = "HTTP/1.1"
    state: _State
    root: Path | None = None
    upstream: str | None = None

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

