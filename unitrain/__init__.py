"""unitrain: one training recipe, run on PyTorch, TensorFlow or JAX, with proof they agree.

Importing unitrain imports no framework; a backend's framework is imported when that backend
is requested.
"""

from unitrain import callbacks, models, optim, schedules
from unitrain._errors import (
    BackendNotFoundError,
    CheckpointError,
    ConfigError,
    DataError,
    MissingFrameworkError,
    NonFiniteError,
    UnitrainError,
)
from unitrain.backend import Backend, BackendOptions, Capabilities, FusedStep
from unitrain.config import TrainerConfig
from unitrain.data import ArrayLoader
from unitrain.registry import get_backend, list_backends
from unitrain.trainer import Trainer, TrainState

__version__ = "0.1.0"

__all__ = [
    "ArrayLoader",
    "Backend",
    "BackendNotFoundError",
    "BackendOptions",
    "Capabilities",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "FusedStep",
    "MissingFrameworkError",
    "NonFiniteError",
    "TrainState",
    "Trainer",
    "TrainerConfig",
    "UnitrainError",
    "__version__",
    "callbacks",
    "get_backend",
    "list_backends",
    "models",
    "optim",
    "schedules",
]
