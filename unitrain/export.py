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

from unitrain._errors import ConfigError
from unitrain.models import MLP, model_from_dict

__all__ = ["export_weights"]


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


#: How each portable model type becomes each framework's layout.
_EXPORTERS: dict[type, dict[str, Callable[[Any, dict[str, np.ndarray]], Any]]] = {
    MLP: {"torch": _mlp_torch, "keras": _mlp_keras},
}


def export_weights(source: Any, framework: str) -> Any:
    """The model weights of a Trainer or a checkpoint in ``framework``'s layout.

    Args:
        source: a :class:`~unitrain.trainer.Trainer` or the path of a checkpoint directory.
        framework: ``"torch"`` (a ``state_dict`` of tensors, ``layers.{i}.weight`` as
            ``(out, in)``) or ``"keras"`` (the list for ``model.set_weights``).

    Raises:
        ConfigError: the model is not portable, or has no export to ``framework``.
    """
    if isinstance(source, (str, Path)):
        from unitrain.checkpoint import load_checkpoint

        checkpoint = load_checkpoint(source)
        description = checkpoint.trainer.get("model")
        if not isinstance(description, dict) or description.get("type") == "native":
            raise ConfigError(f"{source}: export needs a checkpoint of a portable model")
        model, weights = model_from_dict(description), dict(checkpoint.model)
    else:
        model = source.model
        weights = {
            name.removeprefix("model."): value
            for name, value in source.backend.state_dict().items()
            if name.startswith("model.")
        }
    exporters = _EXPORTERS.get(type(model))
    if exporters is None:
        raise ConfigError(
            f"no export for {type(model).__name__} models; a native model is already in its "
            "framework's layout (read it from the backend)"
        )
    if framework not in exporters:
        raise ConfigError(f"unknown framework {framework!r}; choose one of {sorted(exporters)}")
    return exporters[framework](model, weights)
