"""Typed errors: every failure a user can act on has its own class and names the file or key.

Classes that replace a builtin a caller may already catch keep it as a second base
(``ConfigError`` is a ``ValueError``). ``dataset``, ``file`` and ``key`` say where, when known:
for a damaged record, the dataset directory, the sample's source file (its stored ``path``
field) and its key.
"""

from __future__ import annotations

from typing import Any


class FeedpipeError(Exception):
    """Base class for all errors raised by feedpipe."""

    def __init__(self, message: str = "", *, dataset: object = None, file: object = None,
                 key: str | None = None) -> None:
        super().__init__(message)
        self.dataset, self.file, self.key = dataset, file, key

    def __str__(self) -> str:  # not KeyError's repr() for the classes that are also KeyErrors
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its attributes, notes and cause (see :func:`_portable`), so an error
        from a worker process keeps them all."""
        return _rebuild, (type(self), self.args, self.__dict__, _portable(self.__cause__))


def _rebuild(cls: type[FeedpipeError], args: tuple[Any, ...], state: dict[str, Any],
             cause: BaseException | None) -> FeedpipeError:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    exc.__cause__ = cause
    return exc


_PLAIN = (str, bytes, int, float, bool, type(None))


def _portable(cause: BaseException | None) -> BaseException | None:
    """A cause that crosses a process boundary as itself: a feedpipe error, or a builtin
    exception of plain arguments (rebuilt from them); any other (a user's class, which may hold
    anything or not rebuild from its arguments) as a RuntimeError naming its type and message."""
    if cause is None or isinstance(cause, FeedpipeError):
        return cause
    if type(cause).__module__ == "builtins" and all(isinstance(a, _PLAIN) for a in cause.args):
        return cause
    return RuntimeError(f"{type(cause).__module__}.{type(cause).__qualname__}: {cause}")


class ConfigError(FeedpipeError, ValueError):
    """An option has a bad value; the message says how to fix it.

    ``option`` is the Python name of the option it is about (``size``), given by the raiser
    (data, never read back from the message), so the CLI can name its flag (``--size``) instead.
    """

    def __init__(self, message: str = "", *, option: str | None = None, **where: object) -> None:
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.option = option


class IncompleteDatasetError(FeedpipeError):
    """A dataset directory has no complete manifest: its conversion did not finish."""


class NotADatasetError(FeedpipeError, NotADirectoryError):
    """A path given as a dataset is not one: a file (a tar shard, a dataset's data file...), a
    folder of images or a folder of per-split datasets; the message says what it is and what to
    run."""


class ManifestError(FeedpipeError):
    """The manifest exists but is malformed or from an unsupported version."""


class UnsafeDataError(FeedpipeError):
    """Stored data would need code execution (pickle) or object dtypes to read; refused."""


class CorruptRecordError(FeedpipeError):
    """A stored record cannot be read or decoded, or fails its checksum; the message names the
    dataset, the key and (when readable) the sample's source file."""


class BadInputError(FeedpipeError):
    """A source file cannot be converted (empty, truncated, not an image, unreadable)."""


class NotRegularFileError(BadInputError):
    """A source file is a FIFO, a device (``/dev/zero`` never ends), a socket or a folder, not a
    regular file: refused before a byte is read (reading it could block forever or never end).
    ``kind`` says what it is; ``file`` names it."""

    def __init__(self, message: str = "", *, kind: str = "", **where: object) -> None:
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.kind = kind


class DamagedImageError(BadInputError):
    """An image's coded data is damaged: its decoder stopped before the end of the image (data
    cut short, a bad Huffman code) and would make up the rest (grey); a corrupt sample."""


class MissingDependencyError(FeedpipeError, ImportError):
    """An optional dependency is needed for this feature; the message names the pip package."""


class GpuUnavailableError(FeedpipeError):
    """A GPU feature found no usable GPU (no NVIDIA driver loaded, or no device visible)."""


class UnsafePathError(ManifestError):
    """A manifest names a file outside its dataset (an absolute path, '..', a path separator or a
    symlink that leads out); refused before anything is opened or written."""


class SpecialFileError(UnsafePathError):
    """A dataset file is a FIFO, a device, a socket or a folder, not a regular file: opening or
    reading it could block forever; refused, by name, before it is opened."""


class OutputRefusedError(FeedpipeError):
    """A conversion output would destroy data feedpipe did not make (the source, a user folder)."""


class OutputBusyError(FeedpipeError):
    """Another conversion holds the lock on this output path; the message names it."""


class NothingConvertedError(BadInputError):
    """A conversion wrote zero samples (or an empty split); the message says why."""


class DiskFullError(FeedpipeError, OSError):
    """The output's filesystem ran out of space (or a size limit was hit); nothing was kept."""


class ResourceError(FeedpipeError, OSError):
    """The system refused what a read needed (too many open files, no memory, a stale network
    mount): not damage to the data, so never reported as a damaged record nor skipped; the
    message names the file and what to change. ``errno`` is the system's."""


class WorkerDiedError(ResourceError):
    """A conversion worker process died (killed by a signal, e.g. the OOM killer's SIGKILL, or
    crashed) while preparing a file: the conversion stops at once and its partial output is
    removed; the message names the file (``file``) and how the worker ended."""


class DataFileMismatchError(FeedpipeError):
    """A data file is not the one its manifest recorded: its size or the dataset id written into
    it at conversion differs (cut short, grown, or another dataset's file copied in). Refused when
    the file is opened, before a sample is read; not a per-sample error, so ``on_error="skip"``
    does not skip it either."""


class DatasetReplacedError(FeedpipeError):
    """The dataset directory was replaced (re-converted) after its manifest was read; reopen it."""


class EmptyDatasetError(FeedpipeError, ValueError):
    """A dataset (or this rank's share of it) holds no samples: loading or measuring it would
    never yield a batch."""


class SampleError(FeedpipeError, ValueError):
    """A sample handed to a writer does not fit the schema (a missing field, a bad value)."""


class MissingFieldError(SampleError, KeyError):
    """A sample handed to a writer lacks a field of the schema."""


class LoaderError(FeedpipeError, RuntimeError):
    """A loader backend broke its own contract (DALI ended an epoch early, or ran past it)."""


class StorageError(FeedpipeError, OSError):
    """Object storage (s3://, gs://, https://, hf://) failed; the message names the URL.
    ``url`` is the object's address."""

    def __init__(self, message: str = "", *, url: str | None = None, **where: object) -> None:
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.url = url


class RemoteNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist (404): failed at once; check the path."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the credentials (401/403): failed at once; the message says which
    credential to check."""


class RetriesExhaustedError(StorageError):
    """A transient failure (timeout, 5xx, 429/503 SlowDown, a connection cut mid-body) outlasted
    the retry budget; the message names the URL, the attempts and the last error."""


class RangeNotSupportedError(StorageError):
    """The server answered a ranged GET with more than the range (a 200 with the whole object):
    chunked, resumable downloads need HTTP Range support; failed at once, not retried."""


class ChecksumMismatchError(CorruptRecordError):
    """A downloaded file's SHA-256 differs from its manifest's, also after a fresh download;
    nothing of it was kept or read."""


class CacheFullError(StorageError):
    """A remote file cannot fit the cache's ``cache_limit`` (or the cache is full of files in
    use, or its disk is full); the message gives the sizes or the path and what to change."""


class UnsafeCacheError(FeedpipeError, PermissionError):
    """The remote-data cache directory, or an entry in it, is not safe to use: a folder another
    user owns or others may write to (not a group-shared one, docs/remote.md), or an entry that
    is a symlink, not a regular file, or made by an untrusted user. Refused before anything is
    read or written through it; the message names it and says how to fix it."""


class PartsError(FeedpipeError):
    """Parts of a split conversion (``--part i/N``) cannot be merged into one dataset: one is
    missing, given twice, or converted from another source, schema or class list (named)."""


class TransformError(FeedpipeError, RuntimeError):
    """The user's ``transform`` raised on a sample (named by key and source file; the user's
    exception is the cause, its traceback kept). Never skipped: it is a bug, not bad data."""

