"""Typed errors: every failure a user can act on has its own class and names the file or key."""

from __future__ import annotations


class FeedpipeError(Exception):
    """Base class for all errors raised by feedpipe."""


class ConfigError(FeedpipeError, ValueError):
    """An option has a bad value; the message says how to fix it."""


class IncompleteDatasetError(FeedpipeError):
    """A dataset directory has no complete manifest: its conversion did not finish."""


class ManifestError(FeedpipeError):
    """The manifest exists but is malformed or from an unsupported version."""


class UnsafeDataError(FeedpipeError):
    """Stored data would need code execution (pickle) or object dtypes to read; refused."""


class CorruptRecordError(FeedpipeError):
    """A stored record cannot be read or decoded; the message names the dataset and key."""


class BadInputError(FeedpipeError):
    """A source file cannot be converted (empty, truncated, not an image, unreadable)."""


class MissingDependencyError(FeedpipeError, ImportError):
    """An optional dependency is needed for this feature; the message names the pip package."""


class GpuUnavailableError(FeedpipeError):
    """A GPU feature found no usable GPU (no NVIDIA driver loaded, or no device visible)."""


class UnsafePathError(ManifestError):
    """A manifest names a file outside its dataset (an absolute path, '..', a path separator or a
    symlink that leads out); refused before anything is opened or written."""


class OutputRefusedError(FeedpipeError):
    """A conversion output would destroy data feedpipe did not make (the source, a user folder)."""


class OutputBusyError(FeedpipeError):
    """Another conversion holds the lock on this output path; the message names it."""


class NothingConvertedError(BadInputError):
    """A conversion wrote zero samples (or an empty split); the message says why."""


class DiskFullError(FeedpipeError, OSError):
    """The output's filesystem ran out of space (or a size limit was hit); nothing was kept."""


class DatasetReplacedError(FeedpipeError):
    """The dataset directory was replaced (re-converted) after its manifest was read; reopen it."""
