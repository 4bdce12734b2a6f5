"""unitrain: one training recipe, run on PyTorch, TensorFlow or JAX, with proof they agree.

Importing unitrain imports no framework, and not even numpy: the public names below load on
first use (PEP 562), so ``import unitrain`` stays cheap for command-line tools and for the
pytest plugin. A backend's framework is imported when that backend is requested.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from unitrain._errors import (
    BackendNotFoundError,
    CheckpointError,
    ConfigError,
    DataError,
    MissingFrameworkError,
    NonFiniteError,
    RunFolderError,
    UnitrainError,
)

if TYPE_CHECKING:  # what the lazy loader below provides, for type checkers and editors
    from unitrain import callbacks, metrics, models, optim, schedules
    from unitrain.backends.protocol import Backend, BackendOptions, Capabilities, FusedStep
    from unitrain.backends.registry import get_backend, list_backends
    from unitrain.data import ArrayLoader
    from unitrain.export import export_weights
    from unitrain.native_export import export_native
    from unitrain.onnx_export import export_onnx
    from unitrain.recipes import Recipe, load_recipe
    from unitrain.training.config import TrainerConfig
    from unitrain.training.trainer import RunState, Trainer, TrainState

__version__ = "0.1.0"

#: public name -> the module that defines it (a submodule is its own entry).
_LAZY = {
    "callbacks": "unitrain.callbacks",
    "metrics": "unitrain.metrics",
    "Recipe": "unitrain.recipes",
    "load_recipe": "unitrain.recipes",
    "export_weights": "unitrain.export",
    "export_onnx": "unitrain.onnx_export",
    "export_native": "unitrain.native_export",
    "models": "unitrain.models",
    "optim": "unitrain.optim",
    "schedules": "unitrain.schedules",
    "Backend": "unitrain.backends.protocol",
    "BackendOptions": "unitrain.backends.protocol",
    "Capabilities": "unitrain.backends.protocol",
    "FusedStep": "unitrain.backends.protocol",
    "TrainerConfig": "unitrain.training.config",
    "ArrayLoader": "unitrain.data",
    "get_backend": "unitrain.backends.registry",
    "list_backends": "unitrain.backends.registry",
    "Trainer": "unitrain.training.trainer",
    "TrainState": "unitrain.training.trainer",
    "RunState": "unitrain.training.trainer",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'unitrain' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if module.__name__ == f"unitrain.{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ArrayLoader",
    "Recipe",
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
    "RunFolderError",
    "RunState",
    "TrainState",
    "Trainer",
    "TrainerConfig",
    "UnitrainError",
    "__version__",
    "callbacks",
    "export_native",
    "export_onnx",
    "export_weights",
    "get_backend",
    "list_backends",
    "load_recipe",
    "metrics",
    "models",
    "optim",
    "schedules",
]
