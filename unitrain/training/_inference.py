"""Using a trained model: its outputs for new data, and weights loaded from a checkpoint."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from unitrain._errors import CheckpointError, ConfigError, DataError
from unitrain.backends.protocol import Predict
from unitrain.checkpoint import load_checkpoint
from unitrain.checkpoint._resume import check_tensors
from unitrain.data import as_batch_source
from unitrain.structure import is_structured, num_examples

__all__ = ["load_weights", "predict"]


def predict(backend: Any, data: Any, batch_size: int) -> np.ndarray:
    """``backend``'s outputs for ``data`` (see :meth:`unitrain.Trainer.predict`)."""
    if not isinstance(backend, Predict):
        raise ConfigError(f"the {backend.name} backend has no predict(inputs)")
    if isinstance(data, dict):  # several inputs, no targets
        data = (data, np.zeros(num_examples((data,)), np.int64))
    if isinstance(data, tuple) or not hasattr(data, "shape"):
        source = as_batch_source(data, batch_size, 0, False, "data")
        inputs: Iterable[Any] = (batch[0] for batch in source.batches(0))
    else:  # one inputs array: no targets to pair it with
        inputs = (data[i : i + batch_size] for i in range(0, len(data), batch_size))
    outputs = [backend.predict(batch) for batch in inputs]
    if not outputs:
        raise DataError("predict: data holds no examples")
    if is_structured(outputs[0]):  # several outputs: each joined over the batches
        return _join(outputs)
    return np.concatenate([np.asarray(out) for out in outputs])


def _join(outputs: list[Any]) -> Any:
    """Batches of structured outputs (tuples or dicts of arrays) joined leaf by leaf."""
    first = outputs[0]
    if isinstance(first, dict):
        return {key: _join([out[key] for out in outputs]) for key in first}
    if isinstance(first, tuple):
        return tuple(_join([out[i] for out in outputs]) for i in range(len(first)))
    return np.concatenate([np.asarray(out) for out in outputs])


def load_weights(backend: Any, path: str | Path) -> None:
    """Put a checkpoint's model tensors into ``backend`` (see ``Trainer.load_weights``).

    The tensors are checked as a resume checks them (names, shapes, exact dtypes, finite
    values; :func:`unitrain.checkpoint._resume.check_tensors`) before any reaches the backend,
    so a refused checkpoint leaves the model as it was.
    """
    checkpoint = load_checkpoint(path)
    state = backend.state_dict()
    mine = {key: value for key, value in state.items() if key.startswith("model.")}
    loaded = {f"model.{name}": value for name, value in checkpoint.model.items()}
    check_tensors(checkpoint.path, loaded, mine)
    state.update(loaded)
    try:
        backend.load_state_dict(state)
    except ConfigError as error:  # what the checks above cannot see, such as a layout
        raise CheckpointError(f"{path}: {error}") from None
