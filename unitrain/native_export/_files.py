"""Native exports as files each framework loads without unitrain.

- torch: ``torch.export``'s ``.pt2`` program (the graph and its weights), loaded with
  ``torch.export.load(path).module()``: no unitrain, no Python class of the model, and
  the batch axis left free. ``torch.save`` of the module would pickle unitrain's module
  classes, which a colleague would need to import and which ``weights_only`` loading
  refuses.
- keras: a ``.keras`` file (``keras.saving.load_model``); a model with learned or sinusoidal
  positions needs ``import unitrain.native_export.keras_layers`` first (their two layers).
- jax: ``jax.export``'s serialized program (StableHLO, the batch axis symbolic) and its
  parameters as ``<name>.safetensors``: ``jax.export.deserialize(data).call(params, x)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from unitrain.models import AbstractLayer

__all__ = ["SUFFIXES", "save_native"]

#: The file each framework's export writes, by suffix.
SUFFIXES = {"torch": ".pt2", "keras": ".keras", "jax": ".jax"}


def _example(model: AbstractLayer, shape: Sequence[int], batch: int) -> np.ndarray:
    if model.input_kind == "tokens":
        return np.zeros((batch, *shape), np.int64)
    return np.zeros((batch, *shape), np.float32)


def _fixed_batch(model: AbstractLayer) -> int | None:
    """The batch a stateful layer fixes, or None when the batch axis is free."""
    for _, layer in model.named_layers():
        batch = getattr(layer, "batch_size", None)
        if isinstance(batch, int):
            return batch
    return None


def _save_torch(model: AbstractLayer, native: Any, shape: Sequence[int], path: Path) -> None:
    import torch

    batch = _fixed_batch(model)
    example = torch.from_numpy(_example(model, shape, batch or 2))
    dynamic = None if batch else ({0: torch.export.Dim("batch", min=1)},)
    program = torch.export.export(native, (example,), dynamic_shapes=dynamic)
    torch.export.save(program, path)


def _save_jax(model: AbstractLayer, native: Any, shape: Sequence[int], path: Path) -> None:
    import jax
    from safetensors.numpy import save_file

    batch = _fixed_batch(model)
    size: Any = batch or jax.export.symbolic_shape("batch")[0]
    example = _example(model, shape, 1)
    argument = jax.ShapeDtypeStruct((size, *shape), example.dtype)
    params = {name: jax.ShapeDtypeStruct(p.shape, p.dtype) for name, p in native.params.items()}
    exported = jax.export.export(jax.jit(native.apply))(params, argument)
    path.write_bytes(exported.serialize())
    tensors = {name: np.asarray(value) for name, value in native.params.items()}
    save_file(tensors, str(path.with_suffix(".safetensors")))


def save_native(
    model: AbstractLayer, native: Any, framework: str, shape: Sequence[int], path: Path
) -> list[Path]:
    """Write ``native`` (``model``'s export to ``framework``) for inputs of one example's
    ``shape``; return the files written."""
    if framework == "torch":
        _save_torch(model, native, shape, path)
        return [path]
    if framework == "keras":
        native.save(path)
        return [path]
    _save_jax(model, native, shape, path)
    return [path, path.with_suffix(".safetensors")]
