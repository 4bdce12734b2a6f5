"""The numpy reference backend: small, obviously correct, and the oracle of parity checks.

It trains :class:`unitrain.models.MLP` with hand-written backpropagation and the reference
optimizer rules of :mod:`unitrain.optim`, in float32 or float64. Nothing here is fast; every
line is meant to be checked by reading it.

Mixed precision is emulated the way mixed-precision kernels compute: every matmul operand
and every layer output (and, backwards, every gradient flowing between layers) is rounded to
the compute dtype, products are accumulated in float32, the loss is computed in float32,
and the gradients land in float32 master buffers. ``"16-mixed"`` runs the loss scaler of
:mod:`unitrain.precision`; a scaled gradient past float16's range rounds to inf there, as
on the frameworks, and the update is skipped.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import special

from unitrain import optim
from unitrain._errors import ConfigError
from unitrain.backend import BackendOptions, Batch, Capabilities
from unitrain.models import MLP
from unitrain.precision import (
    GOOD_STEPS_KEY,
    SCALE_KEY,
    compute_dtype,
    next_loss_scale,
    require_precision,
    take_scaler_state,
)
from unitrain.state import check_state, split_state

__all__ = ["NumpyBackend"]

_SQRT_2PI = np.sqrt(2.0 * np.pi)


def _activate(name: str, z: np.ndarray) -> np.ndarray:
    if name == "relu":
        return np.maximum(z, 0)
    if name == "tanh":
        return np.tanh(z)
    if name == "sigmoid":
        return special.expit(z)
    return 0.5 * z * (1.0 + special.erf(z / np.sqrt(2.0)))  # exact gelu


def _activation_grad(name: str, z: np.ndarray, a: np.ndarray) -> np.ndarray:
    if name == "relu":
        return (z > 0).astype(z.dtype)
    if name == "tanh":
        return 1 - a * a
    if name == "sigmoid":
        return a * (1 - a)
    cdf = 0.5 * (1.0 + special.erf(z / np.sqrt(2.0)))
    return cdf + z * np.exp(-0.5 * z * z) / _SQRT_2PI


def _round_float16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _round_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    a = np.asarray(a, np.float32)
    bits = a.view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(a), a, rounded.view(np.float32))


def _no_rounding(a: np.ndarray) -> np.ndarray:
    return a


_ROUNDING = {"float32": _no_rounding, "bfloat16": _round_bfloat16, "float16": _round_float16}


class NumpyBackend:
    """Reference implementation of the :class:`unitrain.backend.Backend` protocol."""

    name = "numpy"
    capabilities = Capabilities(
        devices=("cpu",),
        dtypes=("float32", "float64"),
        precisions={"cpu": ("32", "bf16-mixed", "16-mixed")},
    )

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """Always the CPU."""
        return ("cpu",)

    def __init__(self, model: MLP, options: BackendOptions | None = None) -> None:
        if not isinstance(model, MLP):
            raise ConfigError(
                f"the numpy backend trains unitrain.models.MLP only, got {type(model).__name__}"
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
        require_precision(self.name, self.capabilities.precisions["cpu"], options.precision, "cpu")
        if options.precision != "32" and options.dtype != "float32":
            raise ConfigError(f"precision={options.precision!r} needs dtype='float32'")
        self._low = _ROUNDING[compute_dtype(options.precision)]
        #: The loss scaler's ``(scale, good_steps)`` under "16-mixed", else None.
        self.scaler = (
            options.loss_scaler.initial_state() if options.precision == "16-mixed" else None
        )
        self.model, self.dtype = model, np.dtype(options.dtype)
        self.params = model.init_params(options.seed, self.dtype)
        self.opt_state = optim.init_state(options.optimizer, self.params)
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._cache: list[tuple[np.ndarray, ...]] = []
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

    def _run(self, x: np.ndarray, train: bool) -> np.ndarray:
        """Forward pass; in train mode keeps per-layer (input, pre-activation, output, mask)."""
        self._cache = []
        low = self._low
        h = low(np.asarray(x, self.dtype))
        rng = None
        if train and self.model.dropout:
            step = int(self.opt_state["step"])
            rng = np.random.default_rng([self.options.seed, step, self._micro_batch])
        last = self.model.num_layers - 1
        for i in range(self.model.num_layers):
            weight, bias = low(self.params[f"layers.{i}.weight"]), self.params[f"layers.{i}.bias"]
            z = low(h @ weight + low(bias))
            if i == last:
                self._cache.append((h, z, z, None))
                return z
            a = low(_activate(self.model.activation, z))
            mask = None
            if rng is not None:
                keep = 1.0 - self.model.dropout
                mask = (rng.random(a.shape) < keep).astype(self.dtype) / self.dtype.type(keep)
            self._cache.append((h, z, a, mask))
            h = a if mask is None else low(a * mask)
        raise AssertionError("unreachable")

    def _loss(self, out: np.ndarray, y: np.ndarray) -> tuple[Any, np.ndarray]:
        """Return the mean loss and its gradient with respect to ``out``."""
        n = len(out)
        if self.options.loss == "mse":
            diff = out - np.asarray(y, self.dtype).reshape(out.shape)
            return np.mean(diff * diff), 2 * diff / self.dtype.type(diff.size)
        shifted = out - out.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        labels = np.asarray(y).astype(np.int64)
        loss = -np.mean(log_probs[np.arange(n), labels])
        grad = np.exp(log_probs)
        grad[np.arange(n), labels] -= 1
        return loss, grad / self.dtype.type(n)

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
        low = self._low
        if self.scaler is not None:
            scale = scale * float(self.scaler[0])  # a power of two: exact
        delta = low(self._grad_out * self.dtype.type(scale))
        for i in reversed(range(self.model.num_layers)):
            h, z, a, mask = self._cache[i]
            if i != self.model.num_layers - 1:
                if mask is not None:
                    delta = low(delta * mask)
                delta = low(delta * _activation_grad(self.model.activation, z, a))
            self.grads[f"layers.{i}.weight"] += low(h.T @ delta)
            self.grads[f"layers.{i}.bias"] += low(delta.sum(axis=0))
            delta = low(delta @ low(self.params[f"layers.{i}.weight"]).T)

    def step(self, lr: float) -> None:
        """Clip, check for non-finite gradients, apply the reference update, zero the grads."""
        if self.scaler is not None:
            for g in self.grads.values():
                g *= np.float32(1.0) / self.scaler[0]  # unscale; exact, the scale is 2**k
        with np.errstate(all="ignore"):
            norm = optim.global_norm(self.grads)
        finite = bool(np.isfinite(norm))
        if self.scaler is not None:
            scale, good = next_loss_scale(
                self.options.loss_scaler, *self.scaler, np.bool_(finite), np.where
            )
            self.scaler = np.float32(scale), np.int32(good)
        if not finite:
            self._skipped += 1
        else:
            if self.options.grad_clip_norm is not None:
                optim.clip_by_global_norm(self.grads, self.options.grad_clip_norm)
            optim.apply_update(self.options.optimizer, self.params, self.grads, self.opt_state, lr)
        for g in self.grads.values():
            g.fill(0)
        self._micro_batch = 0

    def evaluate(self, batch: Batch) -> dict[str, Any]:
        """Mean loss (and accuracy for classification) in eval mode: no dropout, no state."""
        x, y = batch
        with np.errstate(all="ignore"):
            out = self._run(x, train=False)
            loss, _ = self._loss(out, y)
        self._cache = []
        metrics = {"loss": loss}
        if self.options.loss == "cross_entropy":
            metrics["accuracy"] = np.mean(out.argmax(axis=1) == np.asarray(y))
        return metrics

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the parameters and optimizer state under canonical names."""
        state = {f"model.{k}": v.copy() for k, v in self.params.items()}
        state.update({f"optimizer.{k}": np.array(v) for k, v in self.opt_state.items()})
        if self.scaler is not None:
            state[f"optimizer.{SCALE_KEY}"] = np.array(self.scaler[0], np.float32)
            state[f"optimizer.{GOOD_STEPS_KEY}"] = np.array(self.scaler[1], np.int64)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace parameters and optimizer state; shapes and names must match exactly."""
        check_state(self.state_dict(), state)
        model, opt = split_state(state)
        if self.scaler is not None:
            self.scaler = take_scaler_state(opt)
        self.params = {k: np.array(v, self.dtype) for k, v in model.items()}
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
