"""Seeded faults whose FAILED line must point at the bug, not only fail.

Each is one slip a third party made while writing a backend from the docs (an MLX port): the
kit failed them, but with lines that named neither the tensor nor the cause.
``tests/conformance/test_conformance_faults.py`` asserts the verdict and the words of each message.

:class:`SwallowsAWorkersFailure` is launched by the kit, so its workers import it by name:
the test puts this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import types
from typing import Any

import numpy as np

from unitrain import models, ops
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.numpy._ops_array import unary
from unitrain.backends.torch import TorchBackend
from unitrain.models._norm import _move, scale_shift, wide


def _numpy_ops_with(**overrides: Any) -> types.ModuleType:
    """The reference's ops with some functions replaced: one faulty op in a correct set."""
    module = types.ModuleType("faulty_numpy_ops")
    module.__dict__.update(vars(NumpyBackend.ops))
    module.__dict__.update(overrides)
    return module


def _tanh_in_float32(x: Any) -> Any:
    def value(v: Any) -> Any:
        return np.tanh(np.asarray(v, np.float32)).astype(np.asarray(v).dtype)

    return unary(x, value, lambda g, _, out: g * (1 - out * out))


class Float32Tanh(NumpyBackend):
    """tanh evaluated in float32 whatever the dtype, as a framework whose transcendental
    kernels have no float64 path computes it (MLX's exp, erf and sigmoid)."""

    ops = _numpy_ops_with(tanh=_tanh_in_float32)


class _BiasedBatchNorm(models.BatchNorm):
    """BatchNorm whose running variance moves towards the batch's biased variance."""

    def forward(self, scope: Any, x: Any) -> Any:
        if not scope.training:
            return super().forward(scope, x)
        low, x = ops.dtype(x), wide(x)
        mean, var = ops.moments(x, tuple(range(len(ops.shape(x)) - 1)))
        _move(scope, "running_mean", mean, self.momentum)
        _move(scope, "running_var", var, self.momentum)  # the slip: no M / (M - 1)
        return scale_shift(scope, (x - mean) * ops.rsqrt(var + self.eps), low)


def _biased(layer: Any) -> Any:
    """``layer`` with every BatchNorm of its tree replaced by the biased one."""
    changes = {}
    for field in dataclasses.fields(layer):
        value = getattr(layer, field.name)
        if isinstance(value, models.AbstractLayer):
            changes[field.name] = _biased(value)
        elif isinstance(value, tuple) and any(isinstance(v, models.AbstractLayer) for v in value):
            changes[field.name] = tuple(_biased(v) for v in value)
    layer = dataclasses.replace(layer, **changes) if changes else layer
    if type(layer) is models.BatchNorm:
        return _BiasedBatchNorm(
            **{f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)}
        )
    return layer


class BiasedRunningVariance(NumpyBackend):
    """Moves BatchNorm's running variance towards the biased batch variance (Keras' and
    MLX's convention) where unitrain pins torch's unbiased one."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        self.model = _biased(self.model)


class StaleMicroBatchCounter(NumpyBackend):
    """Keys dropout by its own micro-batch count, not the one its caller passes, and counts
    from its construction instead of from each update's start: every pass still draws new
    dropout masks, but a resumed backend counts from 0 again, so its masks are not the
    uninterrupted run's."""

    def forward(
        self, batch: Any, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        return super().forward(batch, step=step)

    def step(self, lr: float) -> None:
        count = self._numbers.micro_batch
        super().step(lr)
        self._numbers.micro_batch = count


class StateDictSharesTensorMemory(TorchBackend):
    """Forgets the copy after ``tensor.detach().cpu().numpy()``: on the CPU ``.cpu()`` is
    the tensor itself, so the arrays returned are views of the parameters, and the next
    in-place optimizer update rewrites a state the caller already holds."""

    def state_dict(self) -> dict[str, np.ndarray]:
        state = super().state_dict()
        for name, tensor in self._model_tensors().items():
            state[f"model.{name}"] = tensor.detach().cpu().numpy()
        return state


class SwallowsAWorkersFailure(TorchBackend):
    """Launches torchrun through a shell wrapper that exits 0 whatever torchrun returns,
    while worker 1 dies building its strategy: the launch looks successful."""

    capabilities = dataclasses.replace(TorchBackend.capabilities, dtypes=("float32",))

    def launched_strategy(self) -> Any:
        if os.environ.get("RANK") == "1":
            raise RuntimeError("worker 1 could not allocate its gradient buckets (seeded)")
        return super().launched_strategy()

    @staticmethod
    def launch_command(workers: int) -> list[str]:
        torchrun = " ".join(shlex.quote(part) for part in TorchBackend.launch_command(workers))
        return ["sh", "-c", f'{torchrun} "$@"; exit 0', "sh"]
