"""Realistic backend bugs, one per class, for the seeded-fault suite (test_conformance_faults).

Each class is a small subclass of a correct backend with exactly one fault of the kind a
third-party author writes: a shortcut in dropout, a padded evaluation batch, a lenient
``load_state_dict``, an optimizer formula from another framework, a callback of its own that
runs in the wrong order. The numpy reference is the base where it can be (the kit runs fast
on it); :class:`FusedNumpy` is a correct fused-step base for the ``fused`` family.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from unitrain import losses, ops, optim
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.protocol import Capabilities
from unitrain.backends.strategy import SimulatedWorkers
from unitrain.callbacks import EarlyStopping, LRMonitor, ModelCheckpoint
from unitrain.models import Pass, Scope


class _VariantScope(Scope):
    """The core's scope with the dropout rate and scaling asked of the backend (``owner``).

    Every scope of the pass is one of these (``child`` makes its own kind), so the fault
    reaches every dropout of the model, Dropout layers and a Transformer block's alike.
    """

    __slots__ = ()
    owner: ClassVar[_DropoutVariant]

    def child(self, name: str) -> Scope:
        return type(self)(super().child(name).layer, self._pass, self.name(name))

    def dropout(self, x: Any, p: float) -> Any:
        if not (self.training and p):
            return x
        keep = self.owner.keep_probability(p)
        dtype = np.dtype(ops.dtype(x))
        if self._pass.key is not None:  # the portable generator (the default)
            kept = ops.random.bernoulli(self._pass.site_key(self._prefix), keep, ops.shape(x))
        else:
            kept = self._pass.draw(ops.shape(x), dtype.name) < keep
        return x * (kept * self.owner.kept_scale(keep)).astype(dtype)


class _DropoutVariant(NumpyBackend):
    """The reference's forward pass with the dropout details left to two hooks."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        self._scope = type("OwnedScope", (_VariantScope,), {"__slots__": (), "owner": self})

    def keep_probability(self, p: float) -> float:
        return 1.0 - p

    def kept_scale(self, keep: float) -> float:
        return 1.0 / keep

    def _apply(self, x: Any, run: Pass) -> tuple[Any, dict[str, Any]]:
        with ops.using(self.ops):
            out = self.model.forward(self._scope(self.model, run), x)
        return out, {**run.state, **run.new_state}


# -- dropout --------------------------------------------------------------------------------


class MaskFixedAcrossUpdates(NumpyBackend):
    """Seeds dropout from ``(seed, micro_batch)``: every update reuses the same masks."""

    def _dropout_seed(self, step: int, micro_batch: int) -> list[int]:
        return [self.options.seed, micro_batch]


class MaskSharedByMicroBatches(NumpyBackend):
    """Seeds dropout from ``(seed, step)``: the micro-batches of one update share a mask."""

    def _dropout_seed(self, step: int, micro_batch: int) -> list[int]:
        return [self.options.seed, step]


class IgnoresUpdateNumbers(NumpyBackend):
    """Keys dropout by its own count, dropping the ``step`` and ``micro_batch`` it is given."""

    def forward(
        self, batch: Any, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        return super().forward(batch)


class PortableKeyOneStepAhead(NumpyBackend):
    """Folds ``step + 1`` into the portable key (a counter advanced before the forward reads
    it): masks still change every update and follow the numbers passed, but are not the ones
    every other backend draws for that step."""

    def _dropout_seed(self, step: int, micro_batch: int) -> list[int]:
        return [self.options.seed, step + 1, micro_batch]


class DropoutNotInverted(_DropoutVariant):
    """Zeroes units in training without scaling the kept ones by ``1 / (1 - p)``."""

    def kept_scale(self, keep: float) -> float:
        return 1.0


class DropoutRateAsKeep(_DropoutVariant):
    """Keeps units with probability ``p`` and drops ``1 - p`` (the two mixed up)."""

    def keep_probability(self, p: float) -> float:
        return p


# -- evaluation -----------------------------------------------------------------------------


class PadsShortBatch(NumpyBackend):
    """Pads every evaluation batch to the first one's size (one compiled shape) and averages
    over the padded batch."""

    _eval_size: int | None = None

    def evaluate(self, batch: Any) -> dict[str, Any]:
        x, y = (np.asarray(v) for v in batch)
        self._eval_size = self._eval_size or len(x)
        missing = self._eval_size - len(x)
        if missing > 0:
            x = np.concatenate([x, np.zeros((missing, *x.shape[1:]), x.dtype)])
            y = np.concatenate([y, np.zeros((missing, *y.shape[1:]), y.dtype)])
        return super().evaluate((x, y))


class MseMeanOverRows(NumpyBackend):
    """Evaluates mean squared error as the mean over examples of the sum over outputs."""

    def evaluate(self, batch: Any) -> dict[str, Any]:
        metrics = super().evaluate(batch)
        if self.options.loss == "mse":
            outputs = np.asarray(batch[1]).reshape(len(batch[1]), -1).shape[1]
            metrics["loss"] = metrics["loss"] * outputs
        return metrics


class LabelSmoothingIgnored(NumpyBackend):
    """Computes cross-entropy without its label smoothing, as a native kernel called without
    the option would."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        if isinstance(self.loss, losses.CrossEntropy):
            self.loss = dataclasses.replace(self.loss, label_smoothing=0.0)


class EvaluateAdvancesDropout(NumpyBackend):
    """Counts an evaluation as a micro-batch, shifting the dropout masks of training."""

    def evaluate(self, batch: Any) -> dict[str, Any]:
        self._numbers.micro_batch += 1
        return super().evaluate(batch)


class EvaluateWithoutAccuracy(NumpyBackend):
    """Reports only the loss from evaluate (no accuracy for classification)."""

    def evaluate(self, batch: Any) -> dict[str, Any]:
        return {"loss": super().evaluate(batch)["loss"]}


# -- state ----------------------------------------------------------------------------------


class LoadBroadcasts(NumpyBackend):
    """Loads by broadcasting into the current arrays' shapes (``w[...] = value``)."""

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        current = self.state_dict()
        fitted = {}
        for key, value in state.items():
            if key in current:
                value = np.broadcast_to(np.asarray(value), current[key].shape)
            fitted[key] = value
        super().load_state_dict(fitted)


class LoadIgnoresExtraKeys(NumpyBackend):
    """Loads the keys it knows and silently drops the rest."""

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        known = self.state_dict()
        super().load_state_dict({k: v for k, v in state.items() if k in known})


class LoadKeepsMissingKeys(NumpyBackend):
    """Loads what is given and keeps its current values for missing keys (a partial load)."""

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict({**self.state_dict(), **state})


class LoadSkipsStepCounter(NumpyBackend):
    """Restores parameters and moments but restarts its update counter at 0, so Adam's bias
    correction starts over after a resume."""

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict({**state, "optimizer.step": np.asarray(0, np.int64)})


class StateDictAliases(NumpyBackend):
    """Returns its live arrays from state_dict instead of copies."""

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {f"model.{k}": v for k, v in self.params.items()}
        state.update({f"optimizer.{k}": v for k, v in self.opt_state.items()})
        return state


# -- optimizers, clipping, accumulation ------------------------------------------------------


class _UpdateRule(NumpyBackend):
    """Applies ``self.update(spec, grads, lr)`` for the optimizer types it overrides."""

    overrides: ClassVar[tuple[type, ...]] = ()

    def step(self, lr: float) -> None:
        spec = self.options.optimizer
        if type(spec) not in self.overrides:
            return super().step(lr)
        t = int(self.opt_state["step"]) + 1
        self.opt_state["step"] = np.asarray(t, np.int64)
        for name, p in self.params.items():
            self.params[name] = self.update(spec, name, p, self.grads[name], lr, t)
        for g in self.grads.values():
            g.fill(0)
        self._numbers.updated()

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        raise NotImplementedError


class NesterovIgnored(_UpdateRule):
    """Treats ``nesterov=True`` as plain heavy-ball momentum."""

    overrides = (optim.SGD,)

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        g = g + spec.weight_decay * p
        if not spec.momentum:
            return p - lr * g
        buffer = spec.momentum * self.opt_state[f"{name}.momentum"] + g
        self.opt_state[f"{name}.momentum"] = buffer
        return p - lr * buffer


class SgdWeightDecayIgnored(NesterovIgnored):
    """Drops SGD's weight decay (a config field never passed to the framework)."""

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        if spec.momentum:
            return super().update(spec, name, p, g, lr, t)
        return p - lr * g


def _moments(backend: NumpyBackend, spec: Any, name: str, g: np.ndarray) -> tuple[Any, Any]:
    m = spec.beta1 * backend.opt_state[f"{name}.exp_avg"] + (1 - spec.beta1) * g
    v = spec.beta2 * backend.opt_state[f"{name}.exp_avg_sq"] + (1 - spec.beta2) * g * g
    backend.opt_state[f"{name}.exp_avg"], backend.opt_state[f"{name}.exp_avg_sq"] = m, v
    return m, v


class AdamWithoutBiasCorrection(_UpdateRule):
    """Adam without the bias corrections of the first and second moments."""

    overrides = (optim.Adam,)

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        m, v = _moments(self, spec, name, g + spec.weight_decay * p)
        return p - lr * m / (np.sqrt(v) + spec.eps)


class AdamWCoupledDecay(_UpdateRule):
    """AdamW with the decay added to the gradient (Adam's L2 penalty), not decoupled."""

    overrides = (optim.AdamW,)

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        m, v = _moments(self, spec, name, g + spec.weight_decay * p)
        m_hat, v_hat = m / (1 - spec.beta1**t), v / (1 - spec.beta2**t)
        return p - lr * m_hat / (np.sqrt(v_hat) + spec.eps)


class ClipWithoutEpsilon(NumpyBackend):
    """A float32-only backend that clips by ``max_norm / norm`` (no epsilon)."""

    capabilities = Capabilities(devices=("cpu",), dtypes=("float32",))

    def step(self, lr: float) -> None:
        clip = self.options.grad_clip_norm
        norm = optim.global_norm(self.grads)
        if clip is not None and math.isfinite(norm) and norm > clip:
            for name, g in self.grads.items():
                self.grads[name] = g * g.dtype.type(clip / norm)
        self.options = _replace_clip(self.options, None)
        try:
            super().step(lr)
        finally:
            self.options = _replace_clip(self.options, clip)


def _replace_clip(options: Any, clip: float | None) -> Any:
    return dataclasses.replace(options, grad_clip_norm=clip)


class ClipsEachMicroBatch(NumpyBackend):
    """Clips every micro-batch's gradient in backward instead of the accumulated sum."""

    def backward(self, scale: float = 1.0) -> None:
        before = {k: g.copy() for k, g in self.grads.items()}
        super().backward(scale)
        clip = self.options.grad_clip_norm
        if clip is not None:
            added = {k: self.grads[k] - before[k] for k in self.grads}
            optim.clip_by_global_norm(added, clip * scale)
            self.grads = {k: before[k] + added[k] for k in self.grads}


class AccumulationIgnoresScale(NumpyBackend):
    """Ignores backward's ``scale``: micro-batch gradients are summed, not averaged."""

    def backward(self, scale: float = 1.0) -> None:
        super().backward(1.0)


class SkipsNothingOnNaN(NumpyBackend):
    """Applies an update whatever the gradients hold (no non-finite guard)."""

    def step(self, lr: float) -> None:
        with np.errstate(all="ignore"):
            optim.apply_update(self.options.optimizer, self.params, self.grads, self.opt_state, lr)
        for g in self.grads.values():
            g.fill(0)
        self._numbers.updated()


# -- schedules, determinism, devices ----------------------------------------------------------


class LrFrozenAtFirstCall(NumpyBackend):
    """Bakes the first learning rate into its (pretend) compiled step and never updates it."""

    _frozen: float | None = None

    def step(self, lr: float) -> None:
        self._frozen = lr if self._frozen is None else self._frozen
        super().step(self._frozen)


class SeedIgnoredForInit(NumpyBackend):
    """Initialises weights from seed 0 whatever the seed asked for."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        self.params = model.init_params(0, self.dtype)


class ReportsWrongDevice(NumpyBackend):
    """Reports the framework's device string (``"cpu:0"``) instead of the canonical name."""

    @property
    def device(self) -> str:
        return "cpu:0"


class RngStateNotJson(NumpyBackend):
    """Returns a generator's raw state (an array, not JSON data) from rng_state."""

    def rng_state(self) -> dict[str, Any]:
        return {"mt19937": np.random.RandomState(self.options.seed).get_state()[1]}


# -- fused steps ------------------------------------------------------------------------------


class FusedNumpy(NumpyBackend):
    """A correct fused step: ``train_step`` is forward, backward and step in one call."""

    capabilities = Capabilities(devices=("cpu",), dtypes=("float32", "float64"))

    def train_step(self, batch: Any, lr: float, *, step: int | None = None) -> Any:
        loss = self.forward(batch, step=step, micro_batch=0)
        self.backward()
        self.step(lr)
        return loss


class MultiStepNumpy(FusedNumpy):
    """A correct multi-step call: ``train_steps`` is ``k`` fused steps, numbered on."""

    def train_steps(self, batches: Any, lrs: Any, *, step: int | None = None) -> Any:
        first, rows = self._numbers.at(step), zip(batches[0], batches[1], lrs)
        losses = [self.train_step((x, y), lr, step=first + i) for i, (x, y, lr) in enumerate(rows)]
        return np.array(losses)


class FusedStepSkipsClipping(FusedNumpy):
    """Forgets clipping in the fused path (the plain path clips)."""

    def train_step(self, batch: Any, lr: float, *, step: int | None = None) -> Any:
        clip = self.options.grad_clip_norm
        self.options = _replace_clip(self.options, None)
        try:
            return super().train_step(batch, lr, step=step)
        finally:
            self.options = _replace_clip(self.options, clip)


class FusedStepReusesMask(FusedNumpy):
    """Draws the fused step's dropout masks from the seed alone (a key split once)."""

    _fused = False

    def _dropout_seed(self, step: int, micro_batch: int) -> list[int]:
        return [self.options.seed] if self._fused else super()._dropout_seed(step, micro_batch)

    def train_step(self, batch: Any, lr: float, *, step: int | None = None) -> Any:
        self._fused = True
        try:
            return super().train_step(batch, lr, step=step)
        finally:
            self._fused = False


# -- callbacks ---------------------------------------------------------------------------------


class RestoresOnlyWhenStopped(EarlyStopping):
    """Restores the best weights only when training was stopped early."""

    def on_train_end(self, trainer: Any) -> None:
        if self.stopped_epoch is not None:
            super().on_train_end(trainer)


class BaselineWithoutMinDelta(EarlyStopping):
    """Resets ``wait`` when the metric beats the baseline by any amount (min_delta ignored)."""

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
        baseline = self.baseline
        if baseline is not None:  # shift the baseline by min_delta so the core test ignores it
            sign = 1.0 if self.monitor.mode == "min" else -1.0
            self.baseline = baseline + sign * self.monitor.min_delta
        try:
            super().on_epoch_end(trainer, epoch, logs)
        finally:
            self.baseline = baseline


class SavesBeforeOthers(ModelCheckpoint):
    """A checkpoint callback that runs in list order, so it may save before early stopping
    has recorded the epoch."""

    runs_last = False


class LRMonitorOneBehind(LRMonitor):
    """Records the learning rate of the previous update."""

    def on_batch_end(self, trainer: Any, batch: int, logs: dict[str, Any]) -> None:
        previous = getattr(self, "_previous", None)
        self._previous = logs["lr"]
        if previous is not None:
            super().on_batch_end(trainer, batch, {**logs, "lr": previous})
        else:
            super().on_batch_end(trainer, batch, logs)


def ships(name: str, callback: type) -> type:
    """A numpy backend that declares its own ``callback`` as ``name`` to the kit."""
    declared = {"conformance_callbacks": {name: callback}}
    return type(f"Ships{callback.__name__}", (NumpyBackend,), declared)


# -- data parallel ------------------------------------------------------------------------------


class SimulatesItsWorkers(NumpyBackend):
    """Declares data-parallel training and answers with the core's simulated workers in one
    process (its framework's engine not written yet): correct arithmetic, no engine tested."""

    capabilities = dataclasses.replace(NumpyBackend.capabilities, data_parallel=True)

    def launched_strategy(self) -> Any:
        return SimulatedWorkers(2)


class DeclaresDataParallelOnly(NumpyBackend):
    """Declares data-parallel training but offers neither a launcher nor a strategy."""

    capabilities = dataclasses.replace(NumpyBackend.capabilities, data_parallel=True)
