"""The numpy reference backend: small, obviously correct, and the oracle of parity checks.

It trains any :mod:`unitrain.models` architecture with hand-written backpropagation
(:mod:`._numpy_layers`, :mod:`._numpy_model`) and the reference optimizer rules of
:mod:`unitrain.optim`, in float32 or float64. Nothing here is fast; every line is meant to be
checked by reading it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import numpy as np

from unitrain import optim
from unitrain._errors import ConfigError
from unitrain.backend import BackendOptions, Batch, Capabilities
from unitrain.backends._numpy_layers import Run
from unitrain.backends._numpy_model import build
from unitrain.models import AbstractLayer, InputCheck
from unitrain.state import check_state, split_state

__all__ = ["NumpyBackend"]


class NumpyBackend:
    """Reference implementation of the :class:`unitrain.backend.Backend` protocol."""

    name = "numpy"
    capabilities = Capabilities(
        devices=("cpu",), dtypes=("float32", "float64"), portable_layers=True
    )

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """Always the CPU."""
        return ("cpu",)

    def __init__(self, model: AbstractLayer, options: BackendOptions | None = None) -> None:
        if not isinstance(model, AbstractLayer):
            raise ConfigError(
                "the numpy backend trains unitrain.models architectures only, "
                f"got {type(model).__name__}"
            )
        self.options = options = options or BackendOptions()
        if options.device not in ("cpu", "auto"):
            raise ConfigError(
                f"the numpy backend runs on 'cpu' only, got device={options.device!r}"
            )
        if options.dtype not in self.capabilities.dtypes:
            raise ConfigError(
                f"the numpy backend trains in {self.capabilities.dtypes}, "
                f"got dtype={options.dtype!r}"
            )
        if options.loss not in ("cross_entropy", "mse"):
            raise ConfigError(f"unknown loss {options.loss!r}; choose 'cross_entropy' or 'mse'")
        self.model, self.dtype = model, np.dtype(options.dtype)
        self.params = model.init_params(options.seed, self.dtype)
        self.model_state = model.init_state(self.dtype)
        self.opt_state = optim.init_state(options.optimizer, self.params)
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._root = build(model)
        self._input_check = InputCheck(model)
        self._micro_batch = 0
        self._skipped = 0

    @property
    def device(self) -> str:
        """Always ``"cpu"``."""
        return "cpu"

    @property
    def skipped_steps(self) -> int:
        """Updates skipped because a gradient was not finite."""
        return self._skipped

    # -- computation ---------------------------------------------------------------------

    def _run(self, x: Any, train: bool) -> np.ndarray:
        """Forward pass; in train mode every node keeps what its backward needs."""
        self._input_check(x)
        x = np.asarray(x) if self._input_check.tokens else np.asarray(x, self.dtype)
        seed = [self.options.seed, int(self.opt_state["step"]), self._micro_batch]
        run = Run(self.params, self.model_state, self.grads, train=train, dropout_seed=seed)
        return self._root.forward(x, run)

    def _loss(self, out: np.ndarray, y: np.ndarray) -> tuple[Any, np.ndarray]:
        """Return the mean loss and its gradient with respect to ``out``.

        Cross-entropy reads the last axis as classes and averages over every other position
        (every token of a sequence model's ``(N, L, V)`` logits).
        """
        if self.options.loss == "mse":
            diff = out - np.asarray(y, self.dtype).reshape(out.shape)
            return np.mean(diff * diff), 2 * diff / self.dtype.type(diff.size)
        logits = out.reshape(-1, out.shape[-1])
        n = len(logits)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        labels = np.asarray(y).astype(np.int64).reshape(-1)
        loss = -np.mean(log_probs[np.arange(n), labels])
        grad = np.exp(log_probs)
        grad[np.arange(n), labels] -= 1
        return loss, (grad / self.dtype.type(n)).reshape(out.shape)

    # NaN and Inf are the Trainer's to handle (step skips the update, the policy decides), so
    # numpy's floating-point warnings about them are silenced: they would only be noise, or
    # errors under ``-W error``. The other backends' frameworks do not warn either.

    def forward(self, batch: Batch) -> Any:
        """Run in train mode and keep the activations; return the mean loss."""
        x, y = batch
        with np.errstate(all="ignore"):
            out = self._run(x, train=True)
            loss, self._grad_out = self._loss(out, y)
        self._micro_batch += 1
        return loss

    def backward(self, scale: float = 1.0) -> None:
        """Backpropagate the last loss and add ``scale`` times its gradients to the buffers."""
        with np.errstate(all="ignore"):
            self._backward(scale)

    def _backward(self, scale: float) -> None:
        run = Run(self.params, self.model_state, self.grads, train=True)
        self._root.backward(self._grad_out * self.dtype.type(scale), run)

    def step(self, lr: float) -> None:
        """Clip, check for non-finite gradients, apply the reference update, zero the grads."""
        with np.errstate(all="ignore"):
            norm = optim.global_norm(self.grads)
        if not np.isfinite(norm):
            self._skipped += 1
        else:
            if self.options.grad_clip_norm is not None:
                optim.clip_by_global_norm(self.grads, self.options.grad_clip_norm)
            optim.apply_update(self.options.optimizer, self.params, self.grads, self.opt_state, lr)
        for g in self.grads.values():
            g.fill(0)
        self._micro_batch = 0

    def evaluate(self, batch: Batch) -> dict[str, Any]:
        """Mean loss (and accuracy for classification) in eval mode: no dropout, the running
        statistics used and left unchanged."""
        x, y = batch
        with np.errstate(all="ignore"):
            out = self._run(x, train=False)
            loss, _ = self._loss(out, y)
        metrics = {"loss": loss}
        if self.options.loss == "cross_entropy":
            labels = np.asarray(y).reshape(out.shape[:-1])
            metrics["accuracy"] = np.mean(out.argmax(axis=-1) == labels)
        return metrics

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's outputs for ``inputs`` in eval mode."""
        with np.errstate(all="ignore"):
            out = self._run(inputs, train=False)
        self._cache = []
        return out

    #: The array functions metrics use (see :meth:`outputs`).
    array_ops = np

    def outputs(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Eval-mode outputs and the targets, for metrics."""
        return self.predict(batch[0]), np.asarray(batch[1])

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the parameters, model state and optimizer state under canonical names."""
        state = {f"model.{k}": v.copy() for k, v in (self.params | self.model_state).items()}
        state.update({f"optimizer.{k}": np.array(v) for k, v in self.opt_state.items()})
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace parameters, model state and optimizer state; names and shapes must match."""
        expected = {f"model.{k}": v for k, v in (self.params | self.model_state).items()}
        expected.update({f"optimizer.{k}": v for k, v in self.opt_state.items()})
        check_state(expected, state)
        model, opt = split_state(state)
        self.params = {k: np.array(model[k], self.dtype) for k in self.params}
        self.model_state = {k: np.array(model[k], self.dtype) for k in self.model_state}
        self.opt_state = {
            k: np.array(v, np.int64 if k == "step" else self.dtype) for k, v in opt.items()
        }
        self._micro_batch = 0

    def rng_state(self) -> dict[str, Any]:
        """Nothing: dropout masks come from ``(seed, step, micro_batch)``."""
        return {}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""

    def versions(self) -> dict[str, str]:
        """numpy's version."""
        return {"numpy": importlib.metadata.version("numpy")}
