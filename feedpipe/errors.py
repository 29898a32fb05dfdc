"""Typed errors, one class per intent a caller can catch (the table: docs/reference/errors.md).

A class that replaces a builtin keeps it as a second base (``ConfigError`` is a ``ValueError``).
``dataset``, ``file``, ``key`` and ``url`` say where, when known (for a damaged record: the
dataset directory, the sample's source file and its key).
"""

from __future__ import annotations

from typing import Any


class FeedpipeError(Exception):
    """Base class for all errors raised by feedpipe."""

    def __init__(self, message: str = "", *, dataset: object = None, file: object = None,
                 key: str | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.dataset, self.file, self.key, self.url = dataset, file, key, url

    def __str__(self) -> str:  # not KeyError's repr() for the classes that are also KeyErrors
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its attributes, notes and cause, so an error from a worker keeps them."""
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


# --- configuration ---------------------------------------------------------------------------

class ConfigError(FeedpipeError, ValueError):
    """An option has a bad value, or this environment cannot do what it asks. ``option``: the
    Python name of the option (``size``), given by the raiser, so the CLI can name its flag."""

    def __init__(self, message: str = "", *, option: str | None = None, **where: Any) -> None:
        super().__init__(message, **where)
        self.option = option


class MissingDependencyError(ConfigError, ImportError):
    """An optional package is needed for this feature; the message names the pip package."""


# --- bad input -------------------------------------------------------------------------------

class BadInputError(FeedpipeError):
    """What was given cannot be used as it is: a source file, a path that is not a finished
    dataset, an output that would destroy data feedpipe did not make, parts that do not merge."""


class NotRegularFileError(BadInputError):
    """A source file is a FIFO, a device, a socket or a folder (``kind``): refused before a byte
    is read, which could block forever."""

    def __init__(self, message: str = "", *, kind: str = "", **where: Any) -> None:
        super().__init__(message, **where)
        self.kind = kind


class DamagedImageError(BadInputError):
    """An image's coded data is damaged: its decoder stopped before the end and would make up
    the rest (grey)."""


class SampleError(BadInputError, ValueError):
    """A sample does not fit the schema; ``skip_bad_values`` skips it like any ValueError."""


# --- damaged data ----------------------------------------------------------------------------

class DamagedDataError(FeedpipeError):
    """A dataset on disk is not what feedpipe wrote or can read (a malformed manifest, a file
    outside the dataset or not a regular file): re-convert or restore it."""


class CorruptRecordError(DamagedDataError):
    """One stored record (or a downloaded file) cannot be read or fails its checksum;
    ``on_error="skip"`` replaces it."""


class UnsafeDataError(DamagedDataError):
    """Stored data would need pickle or object dtypes to read: refused, never skipped."""


class DataFileMismatchError(DamagedDataError):
    """A data file is not the one its manifest recorded (size or dataset id): refused when
    opened, never skipped by ``on_error="skip"``."""


class DatasetReplacedError(DamagedDataError):
    """The dataset was re-converted after its manifest was read; reopen it."""


# --- resources -------------------------------------------------------------------------------

class ResourceError(FeedpipeError, OSError):
    """The system cannot give what this needs (disk space: ``errno`` ENOSPC, open files, memory,
    a worker process, a lock, a GPU); not damage to the data, so never skipped."""

    def __init__(self, message: str = "", *, errno: int | None = None, **where: Any) -> None:
        super().__init__(message, **where)
        self.errno = errno


# --- remote storage --------------------------------------------------------------------------

class StorageError(FeedpipeError, OSError):
    """Object storage (s3://, gs://, https://, hf://) or its node-local cache failed: retries
    exhausted, no Range requests, a full or unsafe cache."""


class RemoteNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist (404): failed at once."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the credentials (401/403): failed at once."""


# --- the loader and the user's code ----------------------------------------------------------

class LoaderError(FeedpipeError, RuntimeError):
    """A loader broke its own contract, or a worker held one batch past
    ``Workers(batch_timeout=)``."""


class TransformError(FeedpipeError, RuntimeError):
    """The user's ``transform`` raised on a sample (its exception is the cause); never skipped:
    a bug, not bad data."""
