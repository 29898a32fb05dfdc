"""Where a dataset lives: URL detection and the fsspec filesystem for a URL (s3fs, gcsfs,
huggingface_hub, HTTP through aiohttp). Credentials come from the environment, the store's
profiles or ``storage_options`` (passed to the filesystem untouched), never from a dataset."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

#: scheme -> the pip package whose fsspec filesystem serves it
PROTOCOLS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp",
             "https": "aiohttp", "hf": "huggingface_hub"}
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_FS: dict[tuple[int, str, str], Any] = {}  # (pid, protocol, options) -> filesystem


def scheme_of(url: str | os.PathLike[str]) -> str | None:
    """The URL's scheme (``s3``, ``https``...), None for a plain local path."""
    m = _SCHEME.match(os.fspath(url)) if isinstance(url, str) else None
    return m[1].lower() if m else None


def is_remote(url: str | os.PathLike[str]) -> bool:
    """Whether ``url`` names object storage or a web server (not a local path or ``file://``).
    An unknown scheme (``ftp://``) is refused: read as a path it would be a folder named ``ftp:``."""
    scheme = scheme_of(url)
    if scheme is None or scheme in ("file", "local"):
        return False
    if scheme not in PROTOCOLS:
        raise ConfigError(f"{url}: unsupported URL scheme {scheme}://; feedpipe reads local "
                          f"paths, file:// and {', '.join(s + '://' for s in PROTOCOLS)}")
    return True


def local_path(url: str | os.PathLike[str]) -> str:
    """A local path or ``file://`` URL as a plain path."""
    text = os.fspath(url)
    return text[len("file://"):] if scheme_of(text) == "file" else text


def join(url: str, name: str) -> str:
    """``name`` inside the dataset folder ``url`` (one slash between them)."""
    return f"{url.rstrip('/')}/{name}"


def with_timeout(scheme: str, options: Mapping[str, Any], timeout: float | None
                 ) -> dict[str, Any]:
    """``options`` with each request bounded by ``timeout`` seconds to connect and between bytes
    of the answer, where they set no timeout of their own: aiohttp's for http(s)
    (``client_kwargs.timeout``) and gs (``requests_timeout``: None would disable the session's),
    botocore's for s3. hf:// keeps huggingface_hub's own (``HF_HUB_DOWNLOAD_TIMEOUT``)."""
    out = dict(options)
    if timeout is None or scheme not in ("http", "https", "s3", "s3a", "gs", "gcs"):
        return out
    if scheme in ("s3", "s3a"):  # the caller's own settings win
        out["config_kwargs"] = {"connect_timeout": timeout, "read_timeout": timeout,
                                **(out.get("config_kwargs") or {})}
        return out
    try:
        import aiohttp
    except ImportError:  # the filesystem's own import names the missing package
        return out
    bound = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
    if scheme in ("gs", "gcs"):
        out.setdefault("requests_timeout", bound)
    else:
        out["client_kwargs"] = {"timeout": bound, **(out.get("client_kwargs") or {})}
    return out


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None,
               timeout: float | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem for ``url`` and the path it takes, one per process and options
    (fsspec's event loop does not survive a fork); ``timeout`` bounds each request
    (:func:`with_timeout`). A missing backend is a MissingDependencyError naming it."""
    scheme = scheme_of(url) or "file"
    try:
        import fsspec
    except ImportError as exc:
        raise MissingDependencyError("remote datasets need fsspec: pip install "
                                     "'feedpipe[remote]'") from exc
    options = with_timeout(scheme, storage_options or {}, timeout)
    key = (os.getpid(), scheme, repr(sorted((k, repr(v)) for k, v in options.items())))
    fs = _FS.get(key)
    if fs is None:
        try:
            fs = fsspec.filesystem(scheme, **options)
        except ImportError as exc:
            package = PROTOCOLS.get(scheme, "fsspec")
            raise MissingDependencyError(f"{url}: reading {scheme}:// needs {package}: pip "
                                         f"install {package} (or 'feedpipe[remote]')") from exc
        _FS[key] = fs
    return fs, fs._strip_protocol(url)
