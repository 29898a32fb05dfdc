"""Typed errors, one class per intent a caller can catch (docs/reference/errors.md has the
table): bad input, damaged data, resources, configuration, remote storage, and the loader or
the user's code. A leaf class exists only where it carries something a caller uses.

Classes that replace a builtin a caller may already catch keep it as a second base
(``ConfigError`` is a ``ValueError``). ``dataset``, ``file``, ``key`` and ``url`` say where, when
known: for a damaged record, the dataset directory, the sample's source file (its stored
``path`` field) and its key.
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


# --- configuration ---------------------------------------------------------------------------

class ConfigError(FeedpipeError, ValueError):
    """An option has a bad value, or this environment cannot do what it asks; the message says
    how to fix it. ``option`` is the Python name of the option it is about (``size``), given by
    the raiser (data, never read back from the message), so the CLI can name its flag."""

    def __init__(self, message: str = "", *, option: str | None = None, **where: Any) -> None:
        super().__init__(message, **where)
        self.option = option


class MissingDependencyError(ConfigError, ImportError):
    """An optional package is needed for this feature; the message names the pip package."""


# --- bad input -------------------------------------------------------------------------------

class BadInputError(FeedpipeError):
    """What was given cannot be used as it is: a source file (empty, not an image, unreadable),
    a path that is not a finished dataset or holds no samples, an output that would destroy data
    feedpipe did not make, parts that do not merge, a conversion that wrote nothing."""


class NotRegularFileError(BadInputError):
    """A source file is a FIFO, a device, a socket or a folder: refused before a byte is read
    (reading it could block forever or never end). ``kind`` says what it is."""

    def __init__(self, message: str = "", *, kind: str = "", **where: Any) -> None:
        super().__init__(message, **where)
        self.kind = kind


class DamagedImageError(BadInputError):
    """An image's coded data is damaged: its decoder stopped before the end and would make up
    the rest (grey); a record that decodes to it was damaged in its source file."""


class SampleError(BadInputError, ValueError):
    """A sample handed to a writer does not fit the schema (a missing field, a bad value); a
    conversion with ``skip_bad_values`` skips it like any ValueError."""


# --- damaged data ----------------------------------------------------------------------------

class DamagedDataError(FeedpipeError):
    """A dataset on disk is not what feedpipe wrote or can read: a malformed or unsupported
    manifest, a file named outside the dataset or not a regular file (refused before it is
    opened). Re-convert or restore it."""


class CorruptRecordError(DamagedDataError):
    """One stored record cannot be read or decoded, or fails its checksum (also a downloaded
    file whose SHA-256 differs); ``on_error="skip"`` replaces it. The message names the dataset,
    the key and (when readable) the sample's source file."""


class UnsafeDataError(DamagedDataError):
    """Stored data would need code execution (pickle) or object dtypes to read: refused, never
    skipped."""


class DataFileMismatchError(DamagedDataError):
    """A data file is not the one its manifest recorded (size or dataset id): refused when it is
    opened; not a per-sample error, so ``on_error="skip"`` does not skip it (a WebDataset shard,
    read alone, loses its samples)."""


class DatasetReplacedError(DamagedDataError):
    """The dataset directory was replaced (re-converted) after its manifest was read; reopen it
    (``open_dataset`` does, once)."""


# --- resources -------------------------------------------------------------------------------

class ResourceError(FeedpipeError, OSError):
    """The system cannot give what this needs: disk space (``errno`` ENOSPC), open files,
    memory, a worker process (it died), a lock another conversion holds, a GPU. Not damage to
    the data, so never skipped; the message names the file and what to change."""

    def __init__(self, message: str = "", *, errno: int | None = None, **where: Any) -> None:
        super().__init__(message, **where)
        self.errno = errno


# --- remote storage --------------------------------------------------------------------------

class StorageError(FeedpipeError, OSError):
    """Object storage (s3://, gs://, https://, hf://) or the node-local cache that reads it
    failed: retries exhausted, a server without Range requests, a full or unsafe cache. The
    message names the URL (``url``) and what to change."""


class RemoteNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist (404): failed at once; check the path."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the credentials (401/403): failed at once; the message says which
    credential to check."""


# --- the loader and the user's code ----------------------------------------------------------

class LoaderError(FeedpipeError, RuntimeError):
    """A loader broke its own contract (DALI ended an epoch early), or a worker held one batch
    past ``Workers(batch_timeout=)``."""


class TransformError(FeedpipeError, RuntimeError):
    """The user's ``transform`` raised on a sample (named by key and source file; the user's
    exception is the cause, its traceback kept). Never skipped: it is a bug, not bad data."""
