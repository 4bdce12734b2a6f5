"""The kit catches faults: deliberately broken backends, one fault each, must fail a check.

Each faulty backend is a small subclass of a good one (numpy, torch, or the fused numpy
step of tests/conformance/_faulty_backends.py) with exactly one realistic fault: the classes
below and those in ``_faulty_backends``. ``FAULTS`` is the table a reader wants: fault -> the check
that catches it, covering every check family. Each test runs that one check on the faulty
backend (it must fail) and on its good base class (it must pass), so a test failure says
which side broke. Everything runs in float32 on the CPU, mostly on numpy: a few seconds.

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
import os
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import _faulty_backends as f
import _faulty_messages as fm
import _faulty_optimizers as fo
import _faulty_precision as fp
import numpy as np
import pytest

from unitrain import models, optim
from unitrain.backends.numpy import NumpyBackend
from unitrain.callbacks import EarlyStopping
from unitrain.conformance import check_backend, run
from unitrain.conformance._registry import FAMILIES

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

    def forward(
        self, batch: Any, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        x, y = self._tensors(batch)
        self.module.train()
        self._loss = self._compute_loss(self.module(x), y)  # no per-step reseeding
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


def _rewritten(layer: Any, change: Any) -> Any:
    """``layer`` with ``change`` applied to it and to every layer its fields hold."""
    fields = {}
    for field in dataclasses.fields(layer):
        value = getattr(layer, field.name)
        if isinstance(value, models.AbstractLayer):
            fields[field.name] = _rewritten(value, change)
        elif isinstance(value, tuple) and any(isinstance(v, models.AbstractLayer) for v in value):
            fields[field.name] = tuple(_rewritten(v, change) for v in value)
    return change(dataclasses.replace(layer, **fields) if fields else layer)


class _PortableLayerFault(TorchBackend):
    """Rewrites the description the torch module computes from, after building."""

    layer_type: ClassVar[type]
    changes: ClassVar[dict[str, Any]]

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        self.module.spec = _rewritten(self.module.spec, self._change)

    def _change(self, layer: Any) -> Any:
        if type(layer) is not self.layer_type:
            return layer
        return dataclasses.replace(layer, **self.changes)


class KerasLayerNormEps(_PortableLayerFault):
    """LayerNorm with Keras' eps 1e-3 instead of torch's 1e-5."""

    layer_type, changes = models.LayerNorm, {"eps": 1e-3}


class KerasBatchNormMomentum(_PortableLayerFault):
    """BatchNorm momentum 0.9 read as torch's (Keras' 0.9 is torch's 0.1)."""

    layer_type, changes = models.BatchNorm, {"momentum": 0.9}


class TensorFlowSamePadding(_PortableLayerFault):
    """Convolutions padded as TensorFlow's "SAME" does at stride 2: for a 3x3 kernel on an
    even size, 0 rows/columns before and 1 after, where ``padding=1`` pads 1 and 1."""

    layer_type, changes = models.Conv2d, {"padding": "same"}

    def _change(self, layer: Any) -> Any:
        return super()._change(layer) if max(getattr(layer, "stride", (1,))) > 1 else layer


class _SavesArraysInAnotherLayout(TorchBackend):
    """Converts some arrays on the way out of ``state_dict`` and back on the way in, so its
    own round trips are exact and only another backend reading its checkpoint can tell."""

    def _convert(self, state: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return self._convert(super().state_dict())

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(self._convert(dict(state)))


class ConvKernelsSwapHeightAndWidth(_SavesArraysInAnotherLayout):
    """Conv kernels (and their momentum) saved ``(kw, kh, in, out)``: torch's OIHW kernel
    permuted with ``(3, 2, 1, 0)`` where ``(2, 3, 1, 0)`` is right. Square kernels keep
    their shape, so the checkpoint loads anywhere."""

    only_optimizer: ClassVar[bool] = False

    def _convert(self, state: dict[str, Any]) -> dict[str, Any]:
        for key, value in state.items():
            chosen = key.startswith("optimizer.") or not self.only_optimizer
            if chosen and np.ndim(value) == 4 and ".weight" in key:
                state[key] = np.ascontiguousarray(np.swapaxes(value, 0, 1))
        return state


class ConvMomentumSwapsHeightAndWidth(ConvKernelsSwapHeightAndWidth):
    """Only the conv kernels' momentum buffers are saved ``(kw, kh, in, out)``: the weights
    are right, so evaluation agrees and only training on after a hand-off drifts."""

    only_optimizer = True


class AttentionMomentumQueryKeySwapped(_SavesArraysInAnotherLayout):
    """The attention momentum buffers of the query and key projections saved under each
    other's names (a packed ``in_proj`` split in the wrong order)."""

    def _convert(self, state: dict[str, Any]) -> dict[str, Any]:
        for key in list(state):
            if key.startswith("optimizer.") and ".attention.query." in key:
                other = key.replace(".attention.query.", ".attention.key.")
                state[key], state[other] = state[other], state[key]
        return state


#: fault -> (faulty backend, the check that catches it)
def _torch_ops_with(**overrides: Any) -> types.ModuleType:
    """The torch ops module with some functions replaced: one faulty op in a correct set."""
    module = types.ModuleType("faulty_torch_ops")
    module.__dict__.update(vars(TorchBackend.ops))
    module.__dict__.update(overrides)
    return module


class MaximumTiesToOneSide(TorchBackend):
    """``maximum`` whose gradient at a tie goes all to the first operand (TensorFlow's own)."""

    ops = _torch_ops_with(maximum=lambda x, y: torch.where(x >= y, x, y))


class LogsumexpNotShifted(TorchBackend):
    """``logsumexp`` as written in a paper, without subtracting the maximum first."""

    ops = _torch_ops_with(
        logsumexp=lambda x, axis=-1, keepdims=False: torch.log(
            torch.sum(torch.exp(x), dim=axis, keepdim=keepdims)
        )
    )


class LauncherSwallowsWorkers(TorchBackend):
    """A launcher that exits 0 without the workers ever running (a wrapper that drops their
    exit status)."""

    @staticmethod
    def launch_command(workers: int) -> list[str]:
        return [sys.executable, "-c", "print('workers started')"]


FAULTS = {
    "maximum's tie gradient all to one side": (
        MaximumTiesToOneSide,
        "ops::maximum.ties[cpu-float32]",
    ),
    "a launcher that exits 0 for workers that never ran": (
        LauncherSwallowsWorkers,
        "data_parallel::workers_match_global_batch[cpu-float32]",
    ),
    "logsumexp not shifted by the maximum": (
        LogsumexpNotShifted,
        "ops::logsumexp.large[cpu-float32]",
    ),
    # losses
    "cross-entropy ignores label smoothing": (
        f.LabelSmoothingIgnored,
        "losses::label_smoothing[cpu-float32]",
    ),
    # schedules
    "LR applied one step late": (LrOneStepLate, "schedules::cosine_decay[cpu-float32]"),
    "float32 in-graph schedule": (Float32InGraphSchedule, "schedules::cosine_decay[cpu-float32]"),
    "LR frozen at the first call": (f.LrFrozenAtFirstCall, "schedules::step_decay[cpu-float32]"),
    # optimizers
    "Keras-style momentum": (KerasMomentum, "optimizers::sgd_momentum[cpu-float32]"),
    "Adam eps outside the bias correction": (
        AdamEpsilonOutside,
        "optimizers::adam_small_gradients[cpu-float32]",
    ),
    "Nesterov ignored": (f.NesterovIgnored, "optimizers::sgd_nesterov[cpu-float32]"),
    "SGD weight decay ignored": (
        f.SgdWeightDecayIgnored,
        "optimizers::sgd_weight_decay[cpu-float32]",
    ),
    "Adam without bias correction": (f.AdamWithoutBiasCorrection, "optimizers::adam[cpu-float32]"),
    "AdamW decay coupled into the gradient": (
        f.AdamWCoupledDecay,
        "optimizers::adamw[cpu-float32]",
    ),
    "RMSprop eps inside the square root": (
        fo.RMSpropEpsInsideSqrt,
        "optimizers::rmsprop[cpu-float32]",
    ),
    "RMSprop centered ignored": (
        fo.RMSpropCenteredIgnored,
        "optimizers::rmsprop_centered[cpu-float32]",
    ),
    "RMSprop square_avg not restored": (
        fo.SquareAvgNotRestored,
        "optimizers::rmsprop[cpu-float32]",
    ),
    "Lion sign of the beta2 interpolation": (fo.LionSignOfBeta2, "optimizers::lion[cpu-float32]"),
    "Lion decay without the LR": (
        fo.LionDecayWithoutLr,
        "optimizers::lion_weight_decay[cpu-float32]",
    ),
    # checkpoints
    "optimizer state missing from state_dict": (
        OptimizerStateMissing,
        "checkpoints::canonical_keys_sgd_momentum[cpu-float32]",
    ),
    "load broadcasts a (1, n) row or a scalar": (
        f.LoadBroadcasts,
        "checkpoints::rejects_broadcastable_shape[cpu-float32]",
    ),
    "load ignores extra keys": (
        f.LoadIgnoresExtraKeys,
        "checkpoints::rejects_extra_key[cpu-float32]",
    ),
    "load keeps values of missing keys": (
        f.LoadKeepsMissingKeys,
        "checkpoints::rejects_missing_key[cpu-float32]",
    ),
    "state_dict returns live arrays": (
        f.StateDictAliases,
        "checkpoints::state_dict_is_a_copy[cpu-float32]",
    ),
    "state_dict returns views of the CPU tensors": (
        fm.StateDictSharesTensorMemory,
        "checkpoints::state_dict_is_a_copy[cpu-float32]",
    ),
    # resume
    "RNG not saved": (RngNotSaved, "resume::mid_epoch[cpu-float32]"),
    "update counter not restored": (f.LoadSkipsStepCounter, "resume::mid_epoch_adam[cpu-float32]"),
    "micro-batches counted from the backend's start": (
        fm.StaleMicroBatchCounter,
        "resume::mid_epoch[cpu-float32]",
    ),
    "rng_state not JSON data": (f.RngStateNotJson, "resume::rng_state_roundtrip[cpu-float32]"),
    # early_stopping
    "min_delta sign flipped": (MinDeltaFlipped, "early_stopping::scripted_min_delta[cpu-float32]"),
    "best weights restored only after an early stop": (
        f.ships("EarlyStopping", f.RestoresOnlyWhenStopped),
        "early_stopping::restore_best_weights_full_run[cpu-float32]",
    ),
    "baseline compared without min_delta": (
        f.ships("EarlyStopping", f.BaselineWithoutMinDelta),
        "early_stopping::scripted_baseline_min_delta[cpu-float32]",
    ),
    # callbacks
    "checkpoint saved before early stopping decides": (
        f.ships("ModelCheckpoint", f.SavesBeforeOthers),
        "callbacks::checkpoint_listed_first_resume[cpu-float32]",
    ),
    "LR monitor one update behind": (
        f.ships("LRMonitor", f.LRMonitorOneBehind),
        "callbacks::lr_monitor[cpu-float32]",
    ),
    "evaluate without accuracy": (f.EvaluateWithoutAccuracy, "callbacks::epoch_logs[cpu-float32]"),
    # eval_mode
    "dropout left on in evaluate": (DropoutInEvaluate, "eval_mode::dropout_off[cpu-float32]"),
    "evaluate updating batch statistics": (
        EvaluateUpdatesStatistics,
        "eval_mode::no_state_change[cpu-float32]",
    ),
    "short final batch padded": (f.PadsShortBatch, "eval_mode::short_final_batch[cpu-float32]"),
    "MSE averaged over examples only": (
        f.MseMeanOverRows,
        "eval_mode::matches_reference_mse[cpu-float32]",
    ),
    "evaluate shifts training's dropout masks": (
        f.EvaluateAdvancesDropout,
        "eval_mode::no_effect_on_training[cpu-float32]",
    ),
    # dropout
    "dropout mask fixed across updates": (
        f.MaskFixedAcrossUpdates,
        "dropout::new_mask_each_update[cpu-float32]",
    ),
    "dropout mask shared by micro-batches": (
        f.MaskSharedByMicroBatches,
        "dropout::new_mask_each_micro_batch[cpu-float32]",
    ),
    "dropout keyed by its own count, not the numbers passed": (
        f.IgnoresUpdateNumbers,
        "dropout::keyed_by_the_callers_numbers[cpu-float32]",
    ),
    "portable dropout key folded from the next step": (
        f.PortableKeyOneStepAhead,
        "dropout::portable_masks[cpu-float32]",
    ),
    "dropout without inverted scaling": (
        f.DropoutNotInverted,
        "dropout::inverted_scaling[cpu-float32]",
    ),
    "dropout keep and drop rates swapped": (
        f.DropoutRateAsKeep,
        "dropout::inverted_scaling[cpu-float32]",
    ),
    # accumulation
    "micro-batch gradients summed, not averaged": (
        f.AccumulationIgnoresScale,
        "accumulation::two_micro_batches[cpu-float32]",
    ),
    # clipping
    "float32-only backend clipping without epsilon": (
        f.ClipWithoutEpsilon,
        "clipping::small_norm[cpu-float32]",
    ),
    "each micro-batch clipped": (f.ClipsEachMicroBatch, "clipping::with_accumulation[cpu-float32]"),
    # fused
    "fused step skips clipping": (
        f.FusedStepSkipsClipping,
        "fused::train_step_clipped[cpu-float32]",
    ),
    "fused step reuses one dropout mask": (
        f.FusedStepReusesMask,
        "fused::train_step_sgd_momentum[cpu-float32]",
    ),
    # determinism
    "seed ignored for initial weights": (
        f.SeedIgnoredForInit,
        "determinism::initial_weights[cpu-float32]",
    ),
    "NaN gradient applied": (
        f.SkipsNothingOnNaN,
        "determinism::nonfinite_skips_update[cpu-float32]",
    ),
    # devices
    "device reported as the framework's string": (
        f.ReportsWrongDevice,
        "devices::reports_device[cpu-float32]",
    ),
    # layers and model state
    "LayerNorm eps 1e-3 (Keras)": (KerasLayerNormEps, "layers::layer_norm[cpu-float32]"),
    "BatchNorm momentum read the Keras way": (
        KerasBatchNormMomentum,
        "model_state::statistics_after_steps[cpu-float32]",
    ),
    "BatchNorm running variance biased": (
        fm.BiasedRunningVariance,
        "model_state::statistics_after_steps[cpu-float32]",
    ),
    "TensorFlow SAME padding at stride 2": (
        TensorFlowSamePadding,
        "layers::conv_stride2_pad1[cpu-float32]",
    ),
    # cross-backend checkpoint hand-off
    "conv kernels saved with height and width swapped": (
        ConvKernelsSwapHeightAndWidth,
        "handoff::cnn_numpy[cpu-float32]",
    ),
    "conv momentum saved with height and width swapped": (
        ConvMomentumSwapsHeightAndWidth,
        "handoff::cnn_numpy[cpu-float32]",
    ),
    "attention query and key momentum swapped on save": (
        AttentionMomentumQueryKeySwapped,
        "handoff::transformer_numpy[cpu-float32]",
    ),
    # mixed precision
    "mixed precision ignored": (
        fp.PrecisionIgnored,
        "mixed_precision::gradients_bf16[cpu-float32]",
    ),
    "loss scale grows one update late": (
        fp.ScaleGrowsOneLate,
        "mixed_precision::loss_scale_trajectory[cpu-float32]",
    ),
    "gradients left scaled": (
        fp.GradientsLeftScaled,
        "mixed_precision::gradients_fp16[cpu-float32]",
    ),
    "loss scaler not restored": (
        fp.ScalerNotRestored,
        "mixed_precision::loss_scale_resume[cpu-float32]",
    ),
}

#: The correct backends the faulty ones derive from; each fault's control is the nearest.
GOOD = (f.FusedNumpy, NumpyBackend, TorchBackend)


def _only(backend: Any, check_id: str) -> Any:
    results = check_backend(backend, device="cpu", dtypes=["float32"], keyword=check_id)
    assert [r.id for r in results] == [check_id]
    return results[0]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_kit_fails_the_faulty_backend(fault: str) -> None:
    faulty, check_id = FAULTS[fault]
    caught = _only(faulty, check_id)
    assert caught.status == "failed", f"{fault}: {check_id} did not catch it ({caught.reason})"
    base = next(c for c in faulty.__mro__[1:] if c in GOOD)
    control = _only(base, check_id)
    assert control.status == "passed", f"{check_id} fails the good {base.name} backend too"


def test_the_faults_cover_every_family() -> None:
    caught_by = {check_id.split("::")[0] for _, check_id in FAULTS.values()}
    # data_parallel's and sharded's seeded faults run in launched workers that import them by
    # name: they are test_data_parallel's traps and test_sharded's (the kit fails each).
    caught_by.update({"data_parallel", "sharded"})
    assert len(FAULTS) >= 30
    assert caught_by == set(FAMILIES)


class DeclaresItsDropoutFault(f.DropoutNotInverted):
    """The dropout fault, declared as a known failure the way a third party would."""

    conformance_xfails: ClassVar[dict[str, str]] = {
        "dropout::inverted_scaling": "kept units are not rescaled in training"
    }


def test_a_verdict_with_declared_failures_says_so_on_its_last_line() -> None:
    report = run(
        DeclaresItsDropoutFault, device="cpu", dtypes=["float32"], keyword="inverted_scaling"
    )
    assert report.counts()["xfailed"] == 1 and report.verdict() == "conforms"
    assert report.table().splitlines()[-1] == "verdict: conforms, with 1 declared deviation"
    assert report.summary()["verdict_line"] == "conforms, with 1 declared deviation"
    clean = run(NumpyBackend, device="cpu", dtypes=["float32"], keyword="inverted_scaling")
    assert clean.table().splitlines()[-1] == "verdict: conforms"


class UpdatesInFloat32(NumpyBackend):
    """Applies each float64 update through float32 (a kernel with no float64 path)."""

    def step(self, lr: float) -> None:
        super().step(lr)
        self.params = {k: v.astype(np.float32).astype(v.dtype) for k, v in self.params.items()}


_STALE = "the runs agreed right after resuming at update 9 and first differ after update 10"

#: fault -> (faulty backend, the check that catches it, what its FAILED line must say): the
#: tensor (with its layer or slot) or the cause, not only a number over a bar.
MESSAGES = {
    "tanh computed in float32 in a float64 row": (
        fm.Float32Tanh,
        "eval_mode::matches_reference_cross_entropy[cpu-float64]",
        ["evaluate loss: relative error", "looks like a float32 computation"],
    ),
    "updates rounded through float32 in a float64 row": (
        UpdatesInFloat32,
        "optimizers::sgd_momentum[cpu-float64]",
        [
            "furthest off: 'model.layers.0.weight' (parameter 'weight' of layer 'layers.0', "
            "a Linear)",
            "looks like a float32 computation",
        ],
    ),
    "BatchNorm running variance biased": (
        fm.BiasedRunningVariance,
        "model_state::statistics_after_steps[cpu-float32]",
        ["furthest off: 'model.1.running_var' (state 'running_var' of layer '1', a BatchNorm)"],
    ),
    "BatchNorm running variance biased, one layer": (
        fm.BiasedRunningVariance,
        "layers::batch_norm[cpu-float32]",
        ["model state after one update", "furthest off: 'model.1.running_var'"],
    ),
    "micro-batches counted from the backend's start": (
        fm.StaleMicroBatchCounter,
        "resume::mid_epoch[cpu-float32]",
        [_STALE + " (the first update after resuming)", "a micro-batch or step counter"],
    ),
    "state_dict returns views of the CPU tensors": (
        fm.StateDictSharesTensorMemory,
        "checkpoints::state_dict_is_a_copy[cpu-float32]",
        [
            "a state_dict() taken before one more update, after it: 'model.layers.0.weight'",
            "they share the backend's memory",
        ],
    ),
    "update counter not restored": (
        f.LoadSkipsStepCounter,
        "resume::mid_epoch_adam[cpu-float32]",
        [
            "the state right after resuming at update 8 already differs",
            "'optimizer.step' (the optimizer's update counter)",
        ],
    ),
}


def _failed_line(report: Any, check_id: str) -> str:
    lines = report.table().splitlines()
    return next(line for line in lines if line.startswith(f"FAILED   {check_id}: "))


@pytest.mark.parametrize("fault", list(MESSAGES))
def test_the_failed_line_names_the_tensor_or_the_cause(fault: str) -> None:
    faulty, check_id, phrases = MESSAGES[fault]
    dtype = check_id.rpartition("-")[2].rstrip("]")
    report = run(faulty, device="cpu", dtypes=[dtype], keyword=check_id)
    (caught,) = report.results
    assert caught.status == "failed", f"{fault}: {check_id} did not catch it ({caught.reason})"
    line = _failed_line(report, check_id)
    missing = [phrase for phrase in phrases if phrase not in line]
    assert not missing, f"{fault}: {missing} not in\n{line}"
    assert caught.likely_cause and line.endswith(f"(likely: {caught.likely_cause})")
    record = report.to_dict()["checks"][0]
    assert record["likely_cause"] == caught.likely_cause and record["reason"] == caught.reason
    base = next(c for c in faulty.__mro__[1:] if c in GOOD)
    (control,) = check_backend(base, device="cpu", dtypes=[dtype], keyword=check_id)
    assert control.status == "passed", f"{check_id} fails the good {base.name} backend too"


def test_a_launcher_that_exits_0_when_a_worker_died_fails_with_the_workers_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tests = str(Path(__file__).parent)  # the launched workers import the fault from here
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    )
    check_id = "data_parallel::workers_match_global_batch[cpu-float32]"
    report = run("_faulty_messages:SwallowsAWorkersFailure", dtypes=["float32"], keyword=check_id)
    (caught,) = report.results
    assert caught.status == "failed", caught.reason
    assert caught.reason.startswith(
        "2 workers exited 0, but not every worker finished (float32: workers 0, 1 of 2); "
        "the workers' errors:\nRuntimeError: worker 1 could not allocate its gradient buckets"
    )
    assert caught.likely_cause == "a launcher that exits 0 although a worker failed or never ran"
    assert f"FAILED   {check_id}: 2 workers exited 0" in report.table()
