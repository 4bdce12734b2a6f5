"""The kit catches faults: deliberately broken backends, one fault each, must fail a check.

Each class below is a small subclass of a good backend (numpy or torch) with exactly one
fault from issue 4's list. ``FAULTS`` is the table a reader wants: fault -> the check that
catches it. Each test runs that one check on the faulty backend (it must fail) and on the
good base class (it must pass), so a test failure says which side broke.

The float32 in-graph schedule fault emulates optax and Keras, which evaluate a schedule in
float32 inside the compiled graph. Its faulty backend takes the first LR it is given as the
schedule's peak and recomputes every LR as ``float32(peak) * (1 - float32(1 - lr / peak))``:
the fraction passes through float32 the way ``0.5 * (1 + cos(pi * t / T))`` does in-graph,
so it carries about 3e-8 absolute error, which near a cosine schedule's minimum (1% of the
peak) is ~1e-6 relative - what the anchors measured for optax/Keras (1.4-2.1e-6). Far from
the minimum the error is float32 rounding and passes, as it should.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np
import pytest

from unitrain import optim
from unitrain.backends.numpy import NumpyBackend
from unitrain.callbacks import EarlyStopping
from unitrain.conformance import check_backend
from unitrain.precision import LossScaler

torch = pytest.importorskip("torch")
from unitrain.backends.torch import TorchBackend  # noqa: E402


class LrOneStepLate(NumpyBackend):
    """Applies the LR it was given at the previous update (a stale LR variable)."""

    _previous: float | None = None

    def step(self, lr: float) -> None:
        applied = lr if self._previous is None else self._previous
        self._previous = lr
        super().step(applied)


class KerasMomentum(NumpyBackend):
    """SGD momentum as Keras: ``m = mu * m - lr * g; w += m`` (the LR inside the buffer)."""

    def step(self, lr: float) -> None:
        mu = getattr(self.options.optimizer, "momentum", 0.0)
        if not mu:
            return super().step(lr)
        for name, p in self.params.items():
            buffer = mu * self.opt_state[f"{name}.momentum"] - lr * self.grads[name]
            self.opt_state[f"{name}.momentum"] = buffer
            self.params[name] = p + buffer
        self.opt_state["step"] = np.asarray(int(self.opt_state["step"]) + 1, np.int64)
        for g in self.grads.values():
            g.fill(0)


class Float32InGraphSchedule(NumpyBackend):
    """Re-derives each LR in float32 from the first one (see the module docstring)."""

    _peak: float | None = None

    def step(self, lr: float) -> None:
        if self._peak is None and lr > 0:
            self._peak = lr
        if self._peak is not None:
            fraction = np.float32(1.0) - np.float32(1.0 - lr / self._peak)
            lr = float(np.float32(self._peak) * fraction)
        super().step(lr)


class AdamEpsilonOutside(NumpyBackend):
    """Adam as Keras: eps added to sqrt(v) before the bias correction, not to sqrt(v_hat)."""

    def step(self, lr: float) -> None:
        spec = self.options.optimizer
        if type(spec) is not optim.Adam:
            return super().step(lr)
        t = int(self.opt_state["step"]) + 1
        self.opt_state["step"] = np.asarray(t, np.int64)
        lr_t = lr * math.sqrt(1 - spec.beta2**t) / (1 - spec.beta1**t)
        for name, p in self.params.items():
            g = self.grads[name]
            m = spec.beta1 * self.opt_state[f"{name}.exp_avg"] + (1 - spec.beta1) * g
            v = spec.beta2 * self.opt_state[f"{name}.exp_avg_sq"] + (1 - spec.beta2) * g * g
            self.opt_state[f"{name}.exp_avg"], self.opt_state[f"{name}.exp_avg_sq"] = m, v
            self.params[name] = p - lr_t * m / (np.sqrt(v) + spec.eps)
            g.fill(0)


class DropoutInEvaluate(TorchBackend):
    """Leaves the module in train mode in evaluate, so dropout stays on."""

    def evaluate(self, batch: Any) -> dict[str, Any]:
        x, y = self._tensors(batch)
        self.module.train()
        with torch.no_grad():
            out = self.module(x)
            metrics = {"loss": self._compute_loss(out, y)}
            metrics["accuracy"] = (out.argmax(dim=1) == y).to(torch.float32).mean()
        return metrics


class OptimizerStateMissing(NumpyBackend):
    """Saves parameters and the step count but not the momentum buffers (and loads zeros)."""

    def state_dict(self) -> dict[str, np.ndarray]:
        state = super().state_dict()
        return {k: v for k, v in state.items() if k.startswith("model.") or k == "optimizer.step"}

    def load_state_dict(self, state: Any) -> None:
        full = {k: np.zeros_like(v) for k, v in super().state_dict().items()}
        full.update(state)
        super().load_state_dict(full)


class RngNotSaved(TorchBackend):
    """Draws dropout masks from one generator seeded once, which rng_state does not save."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        if getattr(self.module, "generator", None) is not None:
            self.module.generator.manual_seed(self.options.seed)

    def forward(self, batch: Any) -> Any:
        x, y = self._tensors(batch)
        self.module.train()
        self._loss = self._compute_loss(self.module(x), y)  # no per-step reseeding
        self._micro_batch += 1
        return self._loss.detach()


class FlippedEarlyStopping(EarlyStopping):
    """Counts ``current < best + min_delta`` as an improvement (the sign of min_delta flipped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.monitor.min_delta = -self.monitor.min_delta


class MinDeltaFlipped(NumpyBackend):
    """Ships its own EarlyStopping (declared for the kit) with min_delta's sign flipped."""

    conformance_callbacks: ClassVar[dict[str, type]] = {"EarlyStopping": FlippedEarlyStopping}


class EvaluateUpdatesStatistics(TorchBackend):
    """Updates a running statistic of the inputs during evaluate, as a BatchNorm left in
    train mode does (folded into the first bias, the MLP's only place for it)."""

    def evaluate(self, batch: Any) -> dict[str, Any]:
        metrics = super().evaluate(batch)
        x, _ = self._tensors(batch)
        with torch.no_grad():
            bias = self.params["layers.0.bias"]
            bias.mul_(0.9).add_(0.1 * (x @ self.params["layers.0.weight"]).mean(0))
        return metrics


class PrecisionIgnored(NumpyBackend):
    """Accepts a mixed precision and computes in float32 anyway (no speed, no warning)."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        self._low = lambda a: a


class ScaleGrowsOneLate(NumpyBackend):
    """Doubles the loss scale after growth_interval + 1 finite updates (an off-by-one)."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        rule = self.options.loss_scaler
        slower = LossScaler(rule.initial_scale, rule.growth_interval + 1)
        self.options = dataclasses.replace(self.options, loss_scaler=slower)


class GradientsLeftScaled(NumpyBackend):
    """Updates with the scaled gradients: the unscaling before the update is forgotten."""

    def step(self, lr: float) -> None:
        if self.scaler is not None:
            for g in self.grads.values():
                g *= self.scaler[0]  # undoes the unscaling that step does
        super().step(lr)


class ScalerNotRestored(NumpyBackend):
    """Saves the loss scaler's state but starts from the initial scale after loading."""

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(state)
        if self.scaler is not None:
            self.scaler = self.options.loss_scaler.initial_state()


#: fault -> (faulty backend, the check that catches it)
FAULTS = {
    "LR applied one step late": (LrOneStepLate, "schedules::cosine_decay[cpu-float32]"),
    "Keras-style momentum": (KerasMomentum, "optimizers::sgd_momentum[cpu-float32]"),
    "float32 in-graph schedule": (Float32InGraphSchedule, "schedules::cosine_decay[cpu-float32]"),
    "Adam eps outside the bias correction": (
        AdamEpsilonOutside,
        "optimizers::adam_small_gradients[cpu-float32]",
    ),
    "dropout left on in evaluate": (DropoutInEvaluate, "eval_mode::dropout_off[cpu-float32]"),
    "optimizer state missing from state_dict": (
        OptimizerStateMissing,
        "checkpoints::canonical_keys_sgd_momentum[cpu-float32]",
    ),
    "RNG not saved": (RngNotSaved, "resume::mid_epoch[cpu-float32]"),
    "min_delta sign flipped": (MinDeltaFlipped, "early_stopping::scripted_min_delta[cpu-float32]"),
    "evaluate updating batch statistics": (
        EvaluateUpdatesStatistics,
        "eval_mode::no_state_change[cpu-float32]",
    ),
    "mixed precision ignored": (PrecisionIgnored, "mixed_precision::gradients_bf16[cpu-float32]"),
    "loss scale grows one update late": (
        ScaleGrowsOneLate,
        "mixed_precision::loss_scale_trajectory[cpu-float32]",
    ),
    "gradients left scaled": (GradientsLeftScaled, "mixed_precision::gradients_fp16[cpu-float32]"),
    "loss scaler not restored": (
        ScalerNotRestored,
        "mixed_precision::loss_scale_resume[cpu-float32]",
    ),
}


def _only(backend: Any, check_id: str) -> Any:
    results = check_backend(backend, device="cpu", dtypes=["float32"], keyword=check_id)
    assert [r.id for r in results] == [check_id]
    return results[0]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_kit_fails_the_faulty_backend(fault: str) -> None:
    faulty, check_id = FAULTS[fault]
    caught = _only(faulty, check_id)
    assert caught.status == "failed", f"{fault}: {check_id} did not catch it ({caught.reason})"
    base = next(c for c in faulty.__mro__[1:] if c in (NumpyBackend, TorchBackend))
    control = _only(base, check_id)
    assert control.status == "passed", f"{check_id} fails the good {base.name} backend too"
