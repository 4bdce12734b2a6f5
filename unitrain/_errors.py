"""The exceptions unitrain raises; every one says what is wrong and what to do about it."""

from __future__ import annotations

__all__ = [
    "BackendNotFoundError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "MissingFrameworkError",
    "NonFiniteError",
    "RunFolderError",
    "UnitrainError",
]


class UnitrainError(Exception):
    """Base class of every error unitrain raises on purpose."""


class ConfigError(UnitrainError, ValueError):
    """A hyperparameter, schedule argument or config field has a value that cannot work."""


class DataError(UnitrainError, ValueError):
    """A data set is empty, ragged, non-finite or does not fit the model."""


class BackendNotFoundError(UnitrainError, LookupError):
    """No backend is registered under the requested name."""


class MissingFrameworkError(UnitrainError, ImportError):
    """The framework a backend needs is not installed; the message names the pip extra."""


class CheckpointError(UnitrainError):
    """A checkpoint is missing, truncated, corrupted or does not match the run loading it."""


class RunFolderError(CheckpointError):
    """A file or folder of a run (metrics, event files, checkpoints) cannot be written.

    Raised before training when the folder is read-only, full or not ours to write, and while
    training when a write fails; also for a run file that is a symlink, FIFO, device or
    directory, which unitrain never writes through. A :class:`CheckpointError` because it is
    about the run folder that holds the checkpoints, so ``except CheckpointError`` around a
    ``fit`` still catches every storage problem. The OSError, if any, is its ``__cause__``.
    """


class NonFiniteError(UnitrainError, FloatingPointError):
    """Training produced a NaN or infinite loss or gradient under the ``raise`` policy."""
