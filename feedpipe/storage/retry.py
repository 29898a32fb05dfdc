"""The retry policy every request to a store goes through: exponential backoff with full jitter
on transient failures (timeouts, 5xx, 429/503 throttling, connections refused or cut), read
alike from the exceptions of fsspec's clients (aiohttp, botocore, gcsfs, httpx); an immediate,
typed failure on a missing object (:class:`RemoteNotFoundError`) or refused credentials
(:class:`AccessDeniedError`, naming where the credential comes from)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, replace
from typing import Callable, Literal, TypeVar

from ..errors import AccessDeniedError, ConfigError, RemoteNotFoundError, StorageError
from .urls import scheme_of

log = logging.getLogger("feedpipe.storage")
T = TypeVar("T")
Verdict = Literal["retry", "not_found", "denied", "fatal"]

#: where each store looks for credentials, for the access-denied message
CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials (and "
          "AWS_ENDPOINT_URL for a non-AWS endpoint)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`",
    "hf": "HF_TOKEN or `hf auth login`",
    "http": "the server's authentication (headers in storage_options={'headers': ...})",
}
CREDENTIALS.update(s3a=CREDENTIALS["s3"], gcs=CREDENTIALS["gs"], https=CREDENTIALS["http"])
TIMEOUT = 30.0  # seconds a try waits to connect, or for the next bytes of its answer
DEADLINE_TIMEOUTS = 4  # no new try starts after this many timeouts since the first


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in a row without progress, waiting a random time up to
    ``base * 2**n`` seconds (capped at ``cap``) before try ``n + 1`` ("full jitter": clients
    that failed together do not retry together). Each try gives up after ``timeout`` seconds
    without a connection or new bytes, and no try starts ``deadline`` seconds after the first:
    a store that accepts connections and never answers fails within ``deadline + timeout``."""

    attempts: int = 8
    base: float = 0.25
    cap: float = 20.0
    timeout: float = TIMEOUT
    deadline: float = DEADLINE_TIMEOUTS * TIMEOUT

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base < 0 or self.cap < 0:
            raise ConfigError(f"RetryPolicy{(self.attempts, self.base, self.cap)}: attempts must "
                              "be >= 1 and the delays >= 0")
        if not (self.timeout > 0 and self.deadline >= 0):  # also refuses NaN
            raise ConfigError(f"RetryPolicy(timeout={self.timeout!r}, deadline={self.deadline!r})"
                              ": timeout must be > 0 seconds and deadline >= 0")

    @classmethod
    def with_timeout(cls, timeout: float | None, base: RetryPolicy | None = None) -> RetryPolicy:
        """``base`` (the default policy) with each try bounded by ``timeout`` seconds and the
        deadline ``DEADLINE_TIMEOUTS`` times that; None keeps ``base``."""
        base = base or DEFAULT_POLICY
        if timeout is None:
            return base
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not timeout > 0:
            raise ConfigError(f"timeout={timeout!r}: use seconds > 0 (each request to the store "
                              "waits that long to connect or for its next bytes)", option="timeout")
        return replace(base, timeout=float(timeout), deadline=DEADLINE_TIMEOUTS * float(timeout))

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (>= 1)."""
        return random.uniform(0, min(self.cap, self.base * 2 ** (failures - 1)))


DEFAULT_POLICY = RetryPolicy()


def _status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (aiohttp, botocore, requests/httpx, gcsfs)."""
    if type(exc) is OSError and str(exc).startswith("Forbidden: "):  # how gcsfs reports a 403
        return 403
    response = getattr(exc, "response", None)
    if type(exc).__module__.startswith("gcsfs"):  # gcsfs.retry.HttpError: the status is ``code``
        found = [getattr(exc, "code", None)]
    else:
        found = [getattr(obj, name, None) for obj in (exc, response)
                 for name in ("status", "status_code")]
        if isinstance(response, dict):  # botocore ClientError
            found.append(response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    return next((code for code in found if isinstance(code, int)), None)


def classify(exc: BaseException) -> Verdict:
    """Whether a failed request is worth another try."""
    if isinstance(exc, StorageError):
        return "not_found" if isinstance(exc, RemoteNotFoundError) else \
            "denied" if isinstance(exc, AccessDeniedError) else "fatal"
    status = _status(exc)
    if status is not None:
        if status == 404:
            return "not_found"
        if status in (401, 403):
            return "denied"
        return "retry" if status in (408, 429) or status >= 500 else "fatal"
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    if isinstance(exc, PermissionError):
        return "denied"
    # timeouts, cut connections, and the HTTP clients' connection and protocol errors (their
    # errors with a status are above); httpx2 is huggingface_hub's client
    client = type(exc).__module__.split(".")[0] in (
        "aiohttp", "botocore", "aiobotocore", "urllib3", "httpx", "httpx2", "requests", "fsspec")
    return "retry" if client or isinstance(exc, (OSError, EOFError, asyncio.TimeoutError)) \
        else "fatal"


def typed(exc: BaseException, url: str, what: str) -> StorageError:
    """``exc`` as the typed error a caller can act on, naming the URL."""
    if isinstance(exc, StorageError):
        return exc
    verdict = classify(exc)
    if verdict == "not_found":
        return RemoteNotFoundError(f"{url}: not found while {what}; check the path (bucket, "
                                   "prefix, file name) and that the dataset was written there "
                                   "completely", url=url)
    if verdict == "denied":
        creds = CREDENTIALS.get(scheme_of(url) or "", "the store's credentials")
        return AccessDeniedError(f"{url}: access denied while {what} ({str(exc).strip()}); check "
                                 f"{creds}, or pass them in storage_options=", url=url)
    return StorageError(f"{url}: {what} failed: {type(exc).__name__}: {str(exc).strip()}", url=url)


def with_retries(call: Callable[[], T], url: str, what: str,
                 policy: RetryPolicy = DEFAULT_POLICY) -> T:
    """Run ``call`` until it succeeds, retrying transient failures under ``policy``; a permanent
    failure or an exhausted budget raises the typed error naming ``url``."""
    failures, start = 0, time.monotonic()
    while True:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised typed
            if classify(exc) != "retry":
                raise typed(exc, url, what) from exc
            failures += 1
            pause, spent = policy.delay(failures), time.monotonic() - start
            if failures >= policy.attempts or spent + pause > policy.deadline:
                raise StorageError(
                    f"{url}: {what} failed {failures} times in a row in {spent:.1f} s; last "
                    f"error {type(exc).__name__}: {str(exc).strip() or 'no answer'}. The store is "
                    f"unreachable or overloaded: retry later, or check the endpoint (each try "
                    f"waits {policy.timeout:g} s for an answer; a request gives up after "
                    f"{policy.deadline:g} s: the timeout= option)", url=url) from exc
            log.info("%s: %s failed (%s: %s); retry %d of %d in %.2f s", url, what,
                     type(exc).__name__, str(exc).strip(), failures, policy.attempts - 1, pause)
            time.sleep(pause)
