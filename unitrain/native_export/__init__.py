"""Native models from a portable description: built from each framework's own layers.

:func:`export_native` turns a trained portable model into a ``torch.nn.Module`` of
``torch.nn`` layers, a Keras 3 model of ``keras.layers`` or a pure JAX function with its
parameters, each in eval mode and computing what ``Trainer.predict`` computes. A colleague
uses the result with its framework alone. Where a framework has no layer with the same
semantics, a few lines in that framework's own primitives stand in (torch's
:mod:`~unitrain.native_export.torch_modules`); where even that would not be faithful (a
layer of your own written in :mod:`unitrain.ops`), the export stops with an error naming the
layer and the framework. docs/export.md has the table of layers by framework.

Every model keeps unitrain's input layout: images channels-last ``(N, H, W, C)``, token ids
``(N, L)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from unitrain._errors import ConfigError, MissingFrameworkError

__all__ = ["FRAMEWORKS", "JaxExport", "export_native"]

#: The frameworks :func:`export_native` builds for, with the extra that installs each.
FRAMEWORKS = {"torch": "torch", "keras": "tensorflow", "jax": "jax"}


class JaxExport(NamedTuple):
    """A model as JAX code: ``apply(params, x)`` (pure, jit-able) and its ``params``, a
    dict of float32 arrays by canonical name in the canonical layouts (which are JAX's)."""

    apply: Callable[[Any, Any], Any]
    params: dict[str, Any]


def _import_builder(framework: str) -> Any:
    try:
        return importlib.import_module(f"unitrain.native_export._{framework}")
    except ImportError as error:
        raise MissingFrameworkError(
            f"export_native(..., {framework!r}) needs {framework}: "
            f"pip install 'unitrain[{FRAMEWORKS[framework]}]'"
        ) from error


def export_native(source: Any, framework: str, *, input_shape: Sequence[int] | None = None) -> Any:
    """The model of a Trainer or a checkpoint as ``framework``'s own model, in eval mode.

    Args:
        source: a :class:`~unitrain.training.trainer.Trainer` or a checkpoint directory.
        framework: ``"torch"`` (an ``nn.Module`` whose ``state_dict`` loaded strictly),
            ``"keras"`` (a functional ``keras.Model`` with its weights set) or ``"jax"``
            (a :class:`JaxExport`: ``apply(params, x)`` and ``params``).
        input_shape: the shape of one example (no batch axis); Keras builds its model for
            it, and needs it unless the model starts with a dense layer. torch and JAX read
            any length and image size the layers accept.

    Returns:
        The framework's model; its weights are float32.

    Raises:
        ConfigError: the model is not portable, ``framework`` is unknown, or a layer has no
            faithful form in ``framework`` (the layer and the framework are named).
        CheckpointError: the checkpoint is damaged or does not hold exactly its model.
        MissingFrameworkError: ``framework`` is not installed.

    Examples:
        >>> from unitrain import Trainer, models
        >>> trainer = Trainer(models.MLP((4, 3, 2)), backend="numpy")
        >>> apply, params = export_native(trainer, "jax")
        >>> sorted(params)
        ['layers.0.bias', 'layers.0.weight', 'layers.1.bias', 'layers.1.weight']
    """
    if framework not in FRAMEWORKS:
        raise ConfigError(
            f"export_native: unknown framework {framework!r}; choose one of {sorted(FRAMEWORKS)}"
        )
    from unitrain.export import portable_weights

    model, weights = portable_weights(source)
    builder = _import_builder(framework)
    if framework == "torch":
        return builder.torch_module(model, weights)
    if framework == "keras":
        from unitrain.onnx_export import example_shape

        shape = example_shape(model, input_shape, "export_native")
        return builder.keras_model(model, weights, shape)
    return JaxExport(*builder.jax_function(model, weights))
