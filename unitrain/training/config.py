"""The Trainer's settings, validated when they are made so mistakes surface before training."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from unitrain._errors import ConfigError
from unitrain.backends.precision import LossScaler, check_matmul_precision, check_precision
from unitrain.ops.random import check_generator
from unitrain.schedules import AbstractSchedule, Warmup
from unitrain.training._preemption import DEFAULT_SIGNALS, check_signal_names

__all__ = ["NONFINITE_POLICIES", "TrainerConfig", "check_run_length", "run_updates"]

#: What to do when a step's loss or gradient is NaN or infinite. In every case that step's
#: update is skipped (weights and optimizer state untouched); the policies differ in what
#: happens next: ``raise`` a NonFiniteError, ``stop`` training cleanly, or ``skip_batch`` and
#: go on. The check reads a counter kept by the backend at logging points and epoch ends, so
#: it costs no host sync per step; set ``log_every_n_steps=1`` to react at the very step.
NONFINITE_POLICIES = ("raise", "skip_batch", "stop")


def _optional_positive_int(name: str, value: Any, advice: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(
            f"TrainerConfig: {name} must be an int >= 1 or None, got {name}={value!r}; {advice}"
        )


def _positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"TrainerConfig: {name} must be an int >= {minimum}, got {name}={value!r}"
        )


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """How to train: epochs, batching, accumulation, clipping, seeding, logging cadence.

    Args:
        epochs: passes over the training data.
        max_steps: stop after this many optimizer updates (skipped ones included), mid-epoch
            if need be; None: no limit. With ``epochs``, whichever is reached first ends the
            run (nanoGPT's ``max_iters``, Lightning's ``max_steps``).
        batch_size: examples per batch when ``fit`` is given plain ``(inputs, targets)`` arrays.
        eval_batch_size: examples per batch when validating, testing or predicting on plain
            arrays; None: ``batch_size``.
        grad_accum_steps: micro-batches whose gradients are added before one optimizer step;
            micro-batches are weighted by size, so k batches of n equal one batch of k*n.
        grad_clip_norm: clip gradients to this global L2 norm (torch's formula), or None.
        seed: seeds weights, data order, dropout and the global RNGs.
        deterministic: ask the backend for deterministic kernels (same numbers run after
            run); it no longer decides the matmul precision, ``matmul_precision`` does.
        matmul_precision: ``"highest"`` (float32 matmuls in float32: the same numbers on every
            backend), ``"high"`` (TF32 on NVIDIA GPUs) or ``"medium"`` (bfloat16 passes); see
            :mod:`unitrain.backends.precision`. No effect on a CPU.
        precision: ``"32"`` (or the number 32), ``"bf16-mixed"`` or ``"16-mixed"``
            (Lightning's names): float32 master weights and optimizer state, forward and
            backward in the low precision.
        loss_scaler: the dynamic loss-scaling rule of ``"16-mixed"``.
        random: the generator of dropout masks (and of a layer's ``scope.random_key()``):
            ``"portable"`` (:mod:`unitrain.ops.random`, the same masks on every backend, so
            a model with dropout trains to the same numbers everywhere) or ``"native"`` (the
            framework's own generator: faster, each backend's masks its own, the masks of
            earlier versions).
        log_every_n_steps: how often running metrics are read back to the host.
        val_every_n_epochs: validate after every n-th epoch (and after the last).
        val_every_n_steps: validate after every n-th update instead of at epoch ends (and
            after the last update); each such validation is a row of its own in the history
            (nanoGPT's ``eval_interval``). None: validate by epochs.
        val_batches: validate on at most this many batches, the first ones of the
            validation data (nanoGPT's ``eval_iters``, Lightning's ``limit_val_batches``);
            None: all of them.
        device: ``"cpu"``, ``"gpu"`` or ``"auto"``.
        dtype: parameter dtype.
        nonfinite: one of :data:`NONFINITE_POLICIES`.
        checkpoint_dir: where ModelCheckpoint writes and ``resume="latest"`` looks.
        steps_per_call: run this many updates per compiled call when the backend offers
            ``train_steps`` (JAX, TensorFlow); results equal single steps. Batch hooks then
            fire once per call, and logging/step checkpoints happen at call boundaries.
        data_on_device: with an :class:`~unitrain.data.ArrayLoader` and a backend offering
            ``set_device_data``, copy the training set to the device once and gather batches
            there by index.
        preemption_signals: the signals on which ``fit`` saves a checkpoint of the step it
            reaches and exits 143 (see :mod:`unitrain.training._preemption`); empty: none handled.
            Slurm's early warning is SIGUSR1 with ``--signal=USR1@SECONDS``.

    Examples:
        >>> TrainerConfig(epochs=3).epochs
        3
    """

    epochs: int = 10
    batch_size: int = 32
    grad_accum_steps: int = 1
    grad_clip_norm: float | None = None
    seed: int = 0
    deterministic: bool = True
    log_every_n_steps: int = 50
    val_every_n_epochs: int = 1
    device: str = "auto"
    dtype: str = "float32"
    nonfinite: str = "raise"
    checkpoint_dir: str | None = None
    steps_per_call: int = 1
    data_on_device: bool = False
    matmul_precision: str = "highest"
    precision: str = "32"
    loss_scaler: LossScaler = dataclasses.field(default_factory=LossScaler)
    preemption_signals: tuple[str, ...] = DEFAULT_SIGNALS
    max_steps: int | None = None
    val_every_n_steps: int | None = None
    val_batches: int | None = None
    eval_batch_size: int | None = None
    random: str = "portable"

    def __post_init__(self) -> None:
        check_matmul_precision(self.matmul_precision)
        check_generator(self.random)
        object.__setattr__(self, "precision", check_precision(self.precision))
        if not isinstance(self.loss_scaler, LossScaler):
            raise ConfigError(
                "TrainerConfig: loss_scaler must be a unitrain.backends.precision.LossScaler, "
                f"got {type(self.loss_scaler).__name__}"
            )
        if self.precision != "32" and self.dtype != "float32":
            raise ConfigError(
                f"TrainerConfig: precision={self.precision!r} keeps float32 master weights; "
                f"it needs dtype='float32', got dtype={self.dtype!r}"
            )
        object.__setattr__(self, "preemption_signals", check_signal_names(self.preemption_signals))
        _positive_int("epochs", self.epochs)
        _positive_int("batch_size", self.batch_size)
        _positive_int("grad_accum_steps", self.grad_accum_steps)
        _positive_int("log_every_n_steps", self.log_every_n_steps)
        _positive_int("val_every_n_epochs", self.val_every_n_epochs)
        _positive_int("seed", self.seed, minimum=0)
        _positive_int("steps_per_call", self.steps_per_call)
        _optional_positive_int(
            "max_steps", self.max_steps, "it counts optimizer updates; None trains by epochs"
        )
        _optional_positive_int(
            "val_every_n_steps",
            self.val_every_n_steps,
            "it counts optimizer updates; None validates by epochs (val_every_n_epochs)",
        )
        _optional_positive_int(
            "val_batches", self.val_batches, "None validates on the whole validation data"
        )
        _optional_positive_int(
            "eval_batch_size", self.eval_batch_size, "None evaluates in batches of batch_size"
        )
        if self.val_every_n_steps is not None and self.val_every_n_epochs != 1:
            raise ConfigError(
                "TrainerConfig: val_every_n_steps and val_every_n_epochs both set the "
                f"validation cadence (got val_every_n_steps={self.val_every_n_steps}, "
                f"val_every_n_epochs={self.val_every_n_epochs}); set only one of them"
            )
        if self.steps_per_call > 1 and self.grad_accum_steps > 1:
            raise ConfigError(
                "TrainerConfig: steps_per_call > 1 runs whole updates per call and cannot "
                "accumulate gradients; use one of steps_per_call or grad_accum_steps"
            )
        if self.grad_clip_norm is not None and (
            isinstance(self.grad_clip_norm, bool)
            or not isinstance(self.grad_clip_norm, (int, float))
            or not math.isfinite(self.grad_clip_norm)
            or self.grad_clip_norm <= 0
        ):
            raise ConfigError(
                "TrainerConfig: grad_clip_norm must be a positive finite number or None, "
                f"got grad_clip_norm={self.grad_clip_norm!r}"
            )
        if self.device not in ("cpu", "gpu", "auto"):
            raise ConfigError(
                f"TrainerConfig: device must be 'cpu', 'gpu' or 'auto', got device={self.device!r}"
            )
        if self.nonfinite not in NONFINITE_POLICIES:
            raise ConfigError(
                f"TrainerConfig: nonfinite must be one of {NONFINITE_POLICIES}, "
                f"got nonfinite={self.nonfinite!r}"
            )
        if self.dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise ConfigError(f"TrainerConfig: unsupported dtype={self.dtype!r}")
        if self.checkpoint_dir is not None and (
            not isinstance(self.checkpoint_dir, (str, os.PathLike)) or not str(self.checkpoint_dir)
        ):
            raise ConfigError(
                "TrainerConfig: checkpoint_dir must be a non-empty path or None, "
                f"got checkpoint_dir={self.checkpoint_dir!r}"
            )
        if self.checkpoint_dir is not None:  # a Path is kept as text: checkpoints store it
            object.__setattr__(self, "checkpoint_dir", os.fspath(self.checkpoint_dir))


def run_updates(config: TrainerConfig, batches_per_epoch: int) -> int:
    """The optimizer updates the whole run makes: ``epochs`` epochs, or ``max_steps`` if fewer.

    One epoch is ``ceil(batches_per_epoch / grad_accum_steps)`` updates. A schedule sized
    from the run (the digits recipe's cosine, a recipe's ``"(config.epochs - 1) epochs"``)
    takes its length from here, so ``max_steps`` shortens it as it shortens the run.

    Examples:
        >>> run_updates(TrainerConfig(epochs=3), 45)
        135
        >>> run_updates(TrainerConfig(epochs=3, max_steps=100), 45)
        100
    """
    per_epoch = -(-batches_per_epoch // config.grad_accum_steps)
    total = config.epochs * per_epoch
    return total if config.max_steps is None else min(total, config.max_steps)


def check_run_length(
    config: TrainerConfig, schedule: AbstractSchedule, batches_per_epoch: int
) -> None:
    """Refuse a warmup longer than the whole run: nearly always a mix-up of units.

    The rule: with a :class:`~unitrain.schedules.Warmup` schedule and a known number of
    updates ``T`` (:func:`run_updates`: ``epochs * ceil(batches_per_epoch /
    grad_accum_steps)``, or ``max_steps`` if fewer), ``T`` must be at least ``warmup_steps``,
    or the learning rate never reaches its peak. A run that ends just as the warmup does is
    allowed (a one-epoch smoke test of a recipe with a one-epoch warmup). Nothing is checked
    when the number of batches is unknown (0).

    Examples:
        >>> from unitrain.schedules import Constant, Warmup
        >>> schedule = Warmup(Constant(0.1), warmup_steps=500)
        >>> check_run_length(TrainerConfig(epochs=2), schedule, 100)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unitrain._errors.ConfigError: schedule: ... whole run of 200 updates (2 epochs x 100 ...
    """
    if not isinstance(schedule, Warmup) or not batches_per_epoch:
        return
    per_epoch = -(-batches_per_epoch // config.grad_accum_steps)
    total = run_updates(config, batches_per_epoch)
    if total < schedule.warmup_steps:
        length = f"{config.epochs} epochs x {per_epoch} updates"
        if total < config.epochs * per_epoch:
            length = f"max_steps={config.max_steps}"
        raise ConfigError(
            f"schedule: Warmup(warmup_steps={schedule.warmup_steps}) is longer than this whole "
            f"run of {total} updates ({length}); "
            "warmup_steps counts optimizer updates, not examples or epochs: shorten the warmup "
            "or train longer"
        )
