"""Object storage (s3://, gs://, https://, hf://) through fsspec: URLs, retries, transfers, the
node-local shard cache, and :data:`Store` (a local directory or a URL prefix behind one
interface). Sits between ``dataset`` and ``schema``; it knows nothing of formats."""

from .retry import DEFAULT_POLICY, RetryPolicy, classify, with_retries
from .store import DirStore, Store, UrlStore, open_store
from .transfer import download, read_bytes, remote_size, upload
from .urls import filesystem, is_remote, join, local_path, scheme_of

__all__ = ["DEFAULT_POLICY", "DirStore", "RetryPolicy", "Store", "UrlStore", "classify",
           "download", "filesystem", "is_remote", "join", "local_path", "open_store",
           "read_bytes", "remote_size", "scheme_of", "upload", "with_retries"]
