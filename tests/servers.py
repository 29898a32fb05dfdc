"""Real servers on 127.0.0.1 for the remote-storage tests, their lifecycle and fixtures:
moto's standalone S3 server, gcp-storage-emulator (a GCS JSON-API server, for gs://) and the
fault proxy (:mod:`fault_proxy`, run as a script; a Hugging Face Hub in its ``--hf`` mode,
:mod:`hub_emulator`); the storage options that reach them, uploads, and the pytest fixtures
(``tests/conftest.py`` imports them)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hub_emulator import reread_hf_constants

PYTHON = sys.executable
FAULT_PROXY = Path(__file__).with_name("fault_proxy.py")


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
    """A server subprocess on 127.0.0.1 (``url``; on ``port``, else a free one); ``stop()``
    ends it."""

    def __init__(self, args: list[str], what: str, port: int | None = None) -> None:
        if port:  # a fixed port must be free, or the check below would find another server
            with socket.socket() as s:
                # as the servers bind: an earlier server's connections in TIME_WAIT do not count
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError as exc:
                    raise RuntimeError(f"{what}: 127.0.0.1:{port} is in use ({exc})") from exc
        self.port = port or free_port()
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
    """The fault proxy (:mod:`fault_proxy`) in a subprocess: serving ``root`` (Range requests;
    with ``hf``, as a Hugging Face Hub of the repositories in it, see
    :class:`hub_emulator.HubRepos`) or forwarding to ``upstream`` (``http://127.0.0.1:PORT``).
    The fault rules apply in every mode."""

    def __init__(self, root: Path | None = None, upstream: str | None = None,
                 hf: bool = False) -> None:
        target = [("--hf" if hf else "--root"), str(root)] if root is not None else \
            ["--upstream", str(upstream).removeprefix("http://")]
        super().__init__([PYTHON, str(FAULT_PROXY), *target], "fault server")

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

    def __init__(self, port: int | None = None) -> None:
        super().__init__([PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p"], "moto server",
                         port)


class GcsServer(Server):
    """gcp-storage-emulator (``python -m gcp_storage_emulator start``, in memory) on 127.0.0.1:
    the GCS JSON API gcsfs speaks, with ranged media downloads and resumable uploads."""

    def __init__(self, port: int | None = None) -> None:
        super().__init__([PYTHON, "-m", "gcp_storage_emulator", "start", "--in-memory", "-q",
                          "--host", "127.0.0.1", "--port"], "gcp-storage-emulator", port)


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


# -- pytest fixtures (tests/conftest.py imports them) ----------------------------------------------
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
    """The test run's packed datasets uploaded to the S3 server: {format: s3 URL}."""
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
    """The test run's packed datasets uploaded to the GCS emulator: {format: gs URL}."""
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
            reread_hf_constants()
            yield server, {r: f"hf://datasets/feedpipe/{r}/ds" for r in ("photos", "faults")}
    finally:
        server.stop()
        reread_hf_constants()

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
