"""The exceptions unitrain raises; every one says what is wrong and what to do about it."""

from __future__ import annotations

__all__ = [
    "BackendNotFoundError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "MissingFrameworkError",
    "NonFiniteError",
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


class NonFiniteError(UnitrainError, FloatingPointError):
    """Training produced a NaN or infinite loss or gradient under the ``raise`` policy."""
