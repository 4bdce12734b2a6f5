"""Weights in each framework's own layout, for inference outside unitrain.

unitrain keeps one canonical layout (linear weights ``(in, out)``, the ``x @ W`` of JAX and
Keras). :func:`export_weights` turns a trained portable model into what the framework's own
modules load: a torch ``state_dict`` (linear weights ``(out, in)``) for a module whose
``layers`` are ``nn.Linear``, or the list Keras's ``model.set_weights`` takes for a
``Sequential`` of ``Dense`` layers.

Examples:
    >>> import numpy as np
    >>> from unitrain import Trainer, TrainerConfig, models
    >>> trainer = Trainer(models.MLP((4, 3, 2)), backend="numpy")
    >>> [w.shape for w in export_weights(trainer, "keras")]
    [(4, 3), (3,), (3, 2), (2,)]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from unitrain._errors import CheckpointError, ConfigError
from unitrain.models import MLP, model_from_dict

__all__ = ["export_weights", "portable_weights"]


def _mlp_torch(model: MLP, weights: dict[str, np.ndarray]) -> dict[str, Any]:
    import torch

    # nn.Linear computes x @ W.T + b with W of shape (out, in): the transpose of ours.
    return {
        name: torch.from_numpy(np.ascontiguousarray(value.T if value.ndim == 2 else value))
        for name, value in weights.items()
    }


def _mlp_keras(model: MLP, weights: dict[str, np.ndarray]) -> list[np.ndarray]:
    # Dense layers hold (kernel (in, out), bias) in layer order: our layout, as a list.
    order = []
    for i in range(model.num_layers):
        order += [weights[f"layers.{i}.weight"], weights[f"layers.{i}.bias"]]
    return order


#: The dtype a checkpoint holds model tensors in, by ``TrainerConfig.dtype``: numpy has no
#: bfloat16, so backends save it as float32, which holds it exactly.
_SAVED_DTYPES = {
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "bfloat16": np.float32,
}

#: How each portable model type becomes each framework's layout.
_EXPORTERS: dict[type, dict[str, Callable[[Any, dict[str, np.ndarray]], Any]]] = {
    MLP: {"torch": _mlp_torch, "keras": _mlp_keras},
}


def _read_checkpoint(path: Path) -> tuple[Any, dict[str, np.ndarray]]:
    """A checkpoint's portable model and its weights, checked to be exactly that model's."""
    from unitrain.checkpoint import load_checkpoint
    from unitrain.checkpoint._resume import check_tensors

    checkpoint = load_checkpoint(path)
    description = checkpoint.trainer.get("model")
    if not isinstance(description, dict) or description.get("type") == "native":
        raise ConfigError(f"{path}: export needs a checkpoint of a portable model")
    model = model_from_dict(description)
    config = checkpoint.trainer.get("config")
    dtype_name = config.get("dtype", "float32") if isinstance(config, dict) else "float32"
    dtype = _SAVED_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise CheckpointError(
            f"{path / 'trainer.json'}: 'config.dtype' must be one of {sorted(_SAVED_DTYPES)}, "
            f"got {dtype_name!r:.40}; the trainer state is damaged or was not written by "
            "unitrain — use an earlier checkpoint"
        )
    # Zero-strided views: the model's shapes and dtype without allocating its size again.
    shapes = {**model.param_shapes(), **model.state_shapes()}
    expected = {f"model.{k}": np.broadcast_to(np.zeros((), dtype), s) for k, s in shapes.items()}
    check_tensors(checkpoint.path, {f"model.{k}": v for k, v in checkpoint.model.items()}, expected)
    return model, dict(checkpoint.model)


def portable_weights(source: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """The portable model of a Trainer or a checkpoint path and its tensors by canonical name.

    Raises:
        ConfigError: the checkpoint's model is not portable.
        CheckpointError: the checkpoint is damaged or its tensors are not exactly its model's.
    """
    if isinstance(source, (str, Path)):
        return _read_checkpoint(Path(source))
    weights = {
        name.removeprefix("model."): value
        for name, value in source.backend.state_dict().items()
        if name.startswith("model.")
    }
    return source.model, weights


def export_weights(source: Any, framework: str) -> Any:
    """The model weights of a Trainer or a checkpoint in ``framework``'s layout.

    Args:
        source: a :class:`~unitrain.training.trainer.Trainer` or the path of a checkpoint directory.
        framework: ``"torch"`` (a ``state_dict`` of tensors, ``layers.{i}.weight`` as
            ``(out, in)``) or ``"keras"`` (the list for ``model.set_weights``).

    Raises:
        ConfigError: the model is not portable, or has no export to ``framework``.
        CheckpointError: the checkpoint is damaged, or its tensors are not exactly its model's
            (names, shapes, dtype, finite values), as a resume would refuse them.
    """
    model, weights = portable_weights(source)
    exporters = _EXPORTERS.get(type(model))
    if exporters is None:
        raise ConfigError(
            f"no export for {type(model).__name__} models; a native model is already in its "
            "framework's layout (read it from the backend)"
        )
    if framework not in exporters:
        raise ConfigError(f"unknown framework {framework!r}; choose one of {sorted(exporters)}")
    return exporters[framework](model, weights)
