"""Which client fetches a data file's bytes (``FEEDPIPE_FETCH``: ``auto``, ``fsspec``,
``obstore``), and the obstore side of it: a store built from ``storage_options`` and the
environment only where that keeps the same credentials, endpoint and region fsspec would use.

obstore's runtime does not survive ``fork``: a process forked after its parent fetched with
obstore would hang on its first request. So the store is built lazily in the process that
downloads (cached per pid, URL root and options), and a process whose parent had started the
runtime fetches with fsspec instead (see :func:`fetch_backend`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, cast
from urllib.parse import urlsplit

from ..errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    from obstore.store import (
        ClientConfig,
        GCSConfig,
        RetryConfig,
        S3Config,
        S3Credential,
        S3CredentialProvider,
    )

log = logging.getLogger("feedpipe.storage")
Backend = Literal["fsspec", "obstore"]
FETCH_ENV = "FEEDPIPE_FETCH"
CHOICES = ("auto", "fsspec", "obstore")

#: environment variables obstore reads whose meaning we map; any other ``AWS_*`` / ``GOOGLE_*``
#: one (a profile, a role, an S3-only endpoint...) may change what botocore or gcsfs use
AWS_ENV = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
           "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_CA_BUNDLE"}
GOOGLE_ENV = {"GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"}
#: s3fs options with a faithful obstore form; the rest only tune fsspec's caches or botocore's
#: own retries (our policy governs: obstore's retries are off)
S3_OPTIONS = {"key", "secret", "token", "anon", "endpoint_url", "client_kwargs", "config_kwargs",
              "skip_instance_cache", "use_listings_cache", "listings_expiry_time"}
S3_CLIENT_KWARGS = {"endpoint_url", "region_name"}
S3_CONFIG_KWARGS = {"retries"}
#: the protocols of the fsspec filesystem serving a scheme, whose fsspec config (``FSSPEC_S3_*``
#: variables, ``~/.config/fsspec``) supplies default options
_PROTOCOLS = (("s3", "s3a"), ("gs", "gcs"), ("http", "https"))
_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")  # obstore follows them, aiohttp does not
_KEY = re.compile(r"[A-Za-z0-9._=/-]+")  # object keys obstore's paths keep byte for byte
#: one request: connect, a stalled body (both: the retry policy's ``timeout``, set per store in
#: :func:`obstore_ranged_get`), and the whole ranged GET (a slow link moves a chunk)
CLIENT: dict[str, Any] = {"connect_timeout": timedelta(seconds=30),
                          "read_timeout": timedelta(seconds=30), "timeout": timedelta(hours=1)}
NO_RETRIES: RetryConfig = {"max_retries": 0}  # feedpipe's with_retries is the one retry policy

_STORES: dict[tuple[int, str, str, float | None], Any] = {}  # (pid, root, options, timeout) -> store
_RUNTIME_PID: int | None = None  # the process that started obstore's runtime (None: none did)


@dataclass(frozen=True)
class StoreSpec:
    """An obstore store for one URL root: ``kind`` (s3, gs, http), ``root`` (``s3://bucket``,
    ``https://host:port``), the object's ``path`` in it, the store's config, and the static
    credentials (access key, secret, token) and CA bundle of an S3 store."""

    kind: Literal["s3", "gs", "http"]
    root: str
    path: str
    config: dict[str, Any] = field(default_factory=dict)
    client: dict[str, Any] = field(default_factory=dict)
    credentials: tuple[str, str, str | None] | None = None
    ca_bundle: str | None = None  # AWS_CA_BUNDLE: PEM roots botocore trusts for https


def _s3_spec(url: str, options: Mapping[str, Any], env: Mapping[str, str]) -> StoreSpec | str:
    extra = set(options) - S3_OPTIONS
    if extra:
        return f"storage_options {sorted(extra)} have no obstore equivalent"
    client_kw = dict(options.get("client_kwargs") or {})
    config_kw = dict(options.get("config_kwargs") or {})
    if set(client_kw) - S3_CLIENT_KWARGS or set(config_kw) - S3_CONFIG_KWARGS:
        return (f"client_kwargs {sorted(set(client_kw) - S3_CLIENT_KWARGS)} / config_kwargs "
                f"{sorted(set(config_kw) - S3_CONFIG_KWARGS)} have no obstore equivalent")
    unknown = sorted(k for k in env if k.startswith("AWS_") and k not in AWS_ENV)
    if unknown:
        return f"the environment sets {unknown}, which botocore may use and obstore would not"
    bucket, _, key = url.split("://", 1)[1].partition("/")
    endpoint = options.get("endpoint_url") or client_kw.get("endpoint_url") \
        or env.get("AWS_ENDPOINT_URL")
    region = client_kw.get("region_name") or env.get("AWS_DEFAULT_REGION")
    if not region:
        if not endpoint:  # s3fs follows a bucket's region redirect; obstore would fail on it
            return "no region (client_kwargs.region_name or AWS_DEFAULT_REGION) for AWS S3"
        region = "us-east-1"  # botocore's signing region for an endpoint given without one
    config: dict[str, Any] = {"region": region}
    client = dict(CLIENT)
    if endpoint:
        config["endpoint"] = endpoint
        client["allow_http"] = str(endpoint).startswith("http://")
    ca_bundle = env.get("AWS_CA_BUNDLE") if not client.get("allow_http") else None
    creds: tuple[str, str, str | None] | None = None
    if options.get("anon"):
        config["skip_signature"] = True
    elif options.get("key") or options.get("secret"):
        if not (options.get("key") and options.get("secret")):
            return "storage_options hold only one of key and secret"
        creds = (str(options["key"]), str(options["secret"]), options.get("token") or None)
    elif options.get("token"):
        return "storage_options hold a token without key and secret"
    elif env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        creds = (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                 env.get("AWS_SESSION_TOKEN") or None)
    else:  # botocore would search profiles, SSO, instance roles: leave that to it
        return "no key/secret in storage_options or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
    return StoreSpec("s3", f"s3://{bucket}", key, config, client, creds, ca_bundle)


def _gs_spec(url: str, options: Mapping[str, Any], env: Mapping[str, str]) -> StoreSpec | str:
    extra = set(options) - {"token"}
    if extra:
        return f"storage_options {sorted(extra)} have no obstore equivalent"
    unknown = sorted(k for k in env if k.startswith("GOOGLE_") and k not in GOOGLE_ENV)
    if unknown or env.get("STORAGE_EMULATOR_HOST"):
        return f"the environment sets {unknown or ['STORAGE_EMULATOR_HOST']}, which gcsfs may " \
               "use and obstore would not"
    bucket, _, key = url.split("://", 1)[1].partition("/")
    token = options.get("token")
    if token == "anon":
        config: dict[str, Any] = {"skip_signature": True}
    elif isinstance(token, str) and os.path.isfile(token):
        config = {"application_credentials": token}
    elif token is None and env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        config = {"application_credentials": env["GOOGLE_APPLICATION_CREDENTIALS"]}
    else:  # gcsfs would try gcloud's login, the metadata server, then anonymous access
        return "no token='anon', token file or GOOGLE_APPLICATION_CREDENTIALS"
    return StoreSpec("gs", f"gs://{bucket}", key, config, dict(CLIENT))


def _fsspec_defaults(scheme: str) -> dict[str, Any]:
    """The options fsspec's own config adds to ``storage_options`` for ``scheme``."""
    try:
        from fsspec.config import conf
    except ImportError:
        return {}
    group = next((g for g in _PROTOCOLS if scheme in g), (scheme,))
    out: dict[str, Any] = {}
    for proto in group:
        out.update(conf.get(proto, {}))
    return out


def obstore_spec(url: str, storage_options: Mapping[str, Any] | None = None,
                 environ: Mapping[str, str] | None = None) -> StoreSpec | str:
    """The obstore store that reads ``url`` with the credentials, endpoint and region fsspec
    would use, or why there is none (the reason, a str)."""
    env = os.environ if environ is None else environ
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    options = {**_fsspec_defaults(scheme), **(storage_options or {})}
    options = {k: v for k, v in options.items() if v is not None}
    if scheme in ("s3", "s3a", "gs", "gcs"):
        key = url.split("://", 1)[1].partition("/")[2]
        if not _KEY.fullmatch(key) or any(p in ("", ".", "..") for p in key.split("/")):
            return f"object key {key!r} has characters obstore's paths would re-encode"
        return _s3_spec(url, options, env) if scheme.startswith("s3") else \
            _gs_spec(url, options, env)
    if scheme in ("http", "https"):
        if options:
            return f"storage_options {sorted(options)} (headers, client settings) have no " \
                   "obstore equivalent"
        proxies = [k for k in _PROXY_ENV if env.get(k) or env.get(k.lower())]
        if proxies:
            return f"the environment sets {proxies}, which obstore follows and fsspec's " \
                   "HTTP client does not"
        if parts.query or parts.fragment or "%" in parts.path:
            return "the URL has a query, fragment or escapes obstore's paths would re-encode"
        client = {**CLIENT, "allow_http": scheme == "http"}
        return StoreSpec("http", f"{scheme}://{parts.netloc}", parts.path.lstrip("/"), {}, client)
    return f"{scheme}:// is fetched through fsspec only"


def _runtime_usable() -> bool:
    """False in a process forked after its parent started obstore's runtime (it would hang)."""
    return _RUNTIME_PID in (None, os.getpid())


def fetch_backend(url: str, storage_options: Mapping[str, Any] | None = None) -> Backend:
    """The client that downloads ``url``'s bytes, by ``$FEEDPIPE_FETCH``: ``fsspec``;
    ``obstore`` (an error when it is missing or cannot keep the same credentials); ``auto``
    (the default): obstore when it is installed and :func:`obstore_spec` maps the URL and
    options, else fsspec. A process forked after its parent used obstore takes fsspec."""
    choice = os.environ.get(FETCH_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ConfigError(f"{FETCH_ENV}={choice!r}: use one of {', '.join(CHOICES)}")
    if choice == "fsspec":
        return "fsspec"
    try:
        import obstore  # noqa: F401 - only whether it is installed
    except ImportError as exc:
        if choice == "obstore":
            raise MissingDependencyError(f"{FETCH_ENV}=obstore needs obstore: pip install "
                                         "obstore (or 'feedpipe[remote]')") from exc
        return "fsspec"
    spec = obstore_spec(url, storage_options)
    if isinstance(spec, str):
        if choice == "obstore":
            raise ConfigError(f"{FETCH_ENV}=obstore: {url} cannot be fetched with obstore using "
                              f"the same credentials as fsspec: {spec}. Set {FETCH_ENV}=auto "
                              "or fsspec")
        log.debug("%s: fetched with fsspec: %s", url, spec)
        return "fsspec"
    if not _runtime_usable():
        log.debug("%s: fetched with fsspec: this process was forked after its parent used "
                  "obstore, whose runtime does not survive fork", url)
        return "fsspec"
    return "obstore"


def _build(spec: StoreSpec) -> Any:
    from obstore.store import GCSStore, HTTPStore, S3Store

    client = cast("ClientConfig", spec.client)
    if spec.kind == "http":
        return HTTPStore(spec.root, client_options=client, retry_config=NO_RETRIES)
    bucket = spec.root.split("://", 1)[1]
    if spec.kind == "gs":
        return GCSStore(bucket, config=cast("GCSConfig", spec.config), client_options=client,
                        retry_config=NO_RETRIES)
    if spec.ca_bundle:  # added to the trusted roots, read once per store
        try:
            with open(spec.ca_bundle) as fh:
                client = cast("ClientConfig", {**spec.client, "root_certificate": fh.read()})
        except OSError as exc:
            raise ConfigError(f"AWS_CA_BUNDLE={spec.ca_bundle}: cannot read it ({exc})") from exc
    provider: S3CredentialProvider | None = None
    if spec.credentials is not None:  # given explicitly, so obstore mixes in no AWS_* variable
        key, secret, token = spec.credentials

        def static() -> S3Credential:
            return {"access_key_id": key, "secret_access_key": secret, "token": token,
                    "expires_at": None}

        provider = static
    return S3Store(bucket, config=cast("S3Config", spec.config), client_options=client,
                   retry_config=NO_RETRIES, credential_provider=provider)


def obstore_ranged_get(url: str, storage_options: Mapping[str, Any] | None = None,
                       timeout: float | None = None) -> Callable[[int, int], Any]:
    """``get(start, end)``: bytes ``start`` to ``end`` (exclusive) of ``url`` through obstore,
    a buffer; the store is built in this process on first use and kept for its URL root.
    ``timeout``: seconds a request waits to connect or for its next bytes."""
    spec = obstore_spec(url, storage_options)
    if isinstance(spec, str):
        raise ConfigError(f"{url}: not fetchable with obstore: {spec}")
    import obstore

    if timeout is not None:
        bound = timedelta(seconds=timeout)
        spec = replace(spec, client={**spec.client, "connect_timeout": bound,
                                     "read_timeout": bound})
    key = (os.getpid(), spec.root, repr(sorted((k, repr(v)) for k, v in
                                               (storage_options or {}).items())), timeout)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = _build(spec)
    path = spec.path

    def get(start: int, end: int) -> Any:
        global _RUNTIME_PID
        if _RUNTIME_PID is None:
            _RUNTIME_PID = os.getpid()  # before the runtime starts: a fork from now on is marked
        return obstore.get_range(store, path, start=start, end=end)

    return get
