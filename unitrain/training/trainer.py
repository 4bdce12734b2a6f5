"""The Trainer: one training loop for every backend, exact to resume, with no per-step sync.

The loop owns what is the same everywhere — epochs, batching, accumulation, the learning rate,
callbacks, checkpoints, metric bookkeeping — and leaves forward, backward and the update to a
:class:`unitrain.backends.protocol.Backend`. Per-update losses stay on the device, collected without
a framework op; they are read back (one batched transfer) and summed in float64 only at logging
points, checkpoints and epoch ends.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from unitrain._errors import CheckpointError, ConfigError
from unitrain.backends.protocol import Backend, BackendOptions, Predict
from unitrain.backends.registry import get_backend
from unitrain.backends.strategy import Sharded, Strategy, strategy_for
from unitrain.callbacks._base import CallbackList
from unitrain.checkpoint import (
    CheckpointWarning,
    CheckpointWriter,
    remove_leftovers,
)
from unitrain.data import BatchSource, as_batch_source, check_source
from unitrain.metrics import resolve_metrics
from unitrain.models import MLP, AbstractLayer
from unitrain.optim import SGD, Optimizer
from unitrain.schedules import AbstractSchedule, Constant
from unitrain.training import _inference, rng
from unitrain.training._evaluation import evaluate
from unitrain.training._fit_loop import FitLoop
from unitrain.training._lineage import Lineage, claim_folders, lineage_for
from unitrain.training._lock import RunLock, check_locks, locked
from unitrain.training._preemption import Preempted, SignalWatch, restart_resume
from unitrain.training._run_state import RunState, TrainState, restore
from unitrain.training._saving import (
    checkpoint_folders,
    checkpoint_path,
    nothing_to_resume,
    save_run,
)
from unitrain.training.config import TrainerConfig

__all__ = ["RunState", "TrainState", "Trainer"]


class Trainer:
    """Trains one model on one backend with a schedule, callbacks and checkpoints.

    Args:
        model: a :mod:`unitrain.models` model (portable: same weights and checkpoint layout on
            every backend) or a model native to the backend.
        backend: a name (``"torch"``), ``"package.module:Class"``, a backend class, or an
            already built backend instance; None picks ``UNITRAIN_BACKEND`` or the first
            installed framework.
        optimizer: an optimizer description from :mod:`unitrain.optim`.
        schedule: the learning rate per update, from :mod:`unitrain.schedules`.
        loss: a :mod:`unitrain.losses` loss (``losses.CrossEntropy(label_smoothing=0.1)``,
            one of your own written in ops), its type name (``"cross_entropy"``, ``"mse"``),
            or a native loss the backend accepts.
        callbacks: objects with any of the ``on_*`` hooks of :class:`unitrain.callbacks.Callback`.
        config: a :class:`TrainerConfig`.
        strategy: how the run is spread over workers (:mod:`unitrain.backends.strategy`): None runs
            on the workers of the launcher that started this process (``torchrun``, ...) or
            on this process alone; an int N computes N workers' shares here; ``Sharded()``
            splits the model over the launched workers. Every worker calls ``fit`` alike;
            only rank 0 writes checkpoints, logs and the lock.
        metrics: computed on every validation and test pass besides the loss (see
            :mod:`unitrain.metrics`): ``Metric`` objects or built-in names such as
            ``"top5_accuracy"``; they need a backend with ``predict``.

    Examples:
        >>> import numpy as np
        >>> from unitrain import Trainer, TrainerConfig, models
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int64")
        >>> trainer = Trainer(models.MLP((4, 8, 2)), backend="numpy",
        ...                   config=TrainerConfig(epochs=2, batch_size=16))
        >>> [sorted(row) for row in trainer.fit((x, y))][0]
        ['epoch', 'loss', 'lr', 'seconds', 'skipped_steps', 'step']
    """

    def __init__(
        self,
        model: Any,
        *,
        backend: Any = None,
        optimizer: Optimizer | None = None,
        schedule: AbstractSchedule | None = None,
        loss: Any = "cross_entropy",
        callbacks: Iterable[Any] = (),
        config: TrainerConfig | None = None,
        strategy: Strategy | Sharded | int | None = None,
        metrics: Iterable[Any] = (),
    ) -> None:
        self.config = config = config or TrainerConfig()
        self.model, self.optimizer = model, optimizer or SGD()
        self.schedule = schedule or Constant(0.01)
        if not isinstance(self.schedule, AbstractSchedule):
            raise ConfigError(
                f"schedule must be a unitrain.schedules object, got {type(schedule).__name__}; "
                "wrap a constant learning rate as schedules.Constant(lr)"
            )
        self.loss = loss
        if isinstance(backend, Backend) and not isinstance(backend, type):
            self.backend: Any = backend
        else:
            options = BackendOptions(
                loss=loss,
                optimizer=self.optimizer,
                grad_clip_norm=config.grad_clip_norm,
                device=config.device,
                seed=config.seed,
                deterministic=config.deterministic,
                dtype=config.dtype,
                matmul_precision=config.matmul_precision,
                precision=config.precision,
                loss_scaler=config.loss_scaler,
                random=config.random,
            )
            self.backend = get_backend(backend)(model, options)
        self.strategy = strategy_for(self.backend, strategy)
        if not self.strategy.is_main:  # progress bars and log files are rank 0's
            callbacks = [c for c in callbacks if not getattr(c, "main_process_only", False)]
        self.callbacks = CallbackList(callbacks)
        self.metrics = resolve_metrics(metrics)
        if self.metrics and not isinstance(self.backend, Predict):
            raise ConfigError(
                f"metrics need the backend's outputs, and the {self.backend.name} backend has no "
                "predict(inputs); drop metrics= or use a backend that offers it"
            )
        self.state = TrainState()
        #: Whether the current fit has validation data (callbacks check their monitors by it).
        self.has_validation = False
        #: Batches in one epoch of the current fit (0 when a native loader has no length).
        self.batches_per_epoch = 0
        #: The validation data of the current fit (monitors read its metric names from it).
        self.val_source: BatchSource | None = None
        self.history: list[dict[str, Any]] = []
        #: Multiplies the schedule's value; ReduceLROnPlateau lowers it.
        self.lr_factor = 1.0
        #: Why the last fit stopped before its last epoch (set by :meth:`stop`), else None.
        self.stop_reason: str | None = None
        #: The run this Trainer's checkpoints belong to, decided when ``fit`` starts.
        self.lineage: Lineage | None = None
        #: One row per validation by steps (``val_every_n_steps``); ``history`` keeps one
        #: row per epoch.
        self.step_history: list[dict[str, Any]] = []
        self._loop = FitLoop(self, self._attend)  # runs the epochs of fit
        # Both set the loop's attention flag, read after every update (see _attend).
        self._writer = CheckpointWriter(on_failure=self._ask_attention)
        self._signals = SignalWatch(config.preemption_signals, self._ask_attention)
        self._last_save: tuple[int, Path] | None = None  # (step, path) of the newest save
        self._locks: list[RunLock] = []  # held during fit, by rank 0 (see unitrain.training._lock)
        rng.seed_everything(config.seed)

    # -- public API ---------------------------------------------------------------------------

    def lr_at(self, step: int) -> float:
        """The learning rate of update number ``step`` (0 is the first update).

        The one place the LR is computed: the schedule's value times :attr:`lr_factor`. The
        loop passes it to the backend, and logs, callbacks and checkpoints read what it gave.
        """
        return self.schedule(step) * self.lr_factor

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        return self.lr_at(self.state.step)

    @property
    def epoch_number(self) -> int:
        """The epoch the last update belongs to, counting from 1 (0 before any update).

        The one number users see: console lines, ``logs["epoch"]`` in metric files and
        checkpoint names all use it, so a step has one name whether it is saved by step or at
        the end of its epoch. (Hooks receive the 0-based epoch *index*, as Keras's do.)
        """
        return self.state.epoch + (1 if self.state.batch else 0)

    def stop(self, reason: str) -> None:
        """End training after the current update; ``reason`` says why, for the user."""
        self.state.stop_training = True
        self.stop_reason = reason

    @property
    def skipped_steps(self) -> int:
        """Updates skipped so far because of a NaN or infinite gradient (reads the backend)."""
        return self._loop.skipped_steps

    @property
    def steps_left(self) -> int:
        """Updates left before ``max_steps`` (``sys.maxsize`` without it); the loop stops at 0."""
        if self.config.max_steps is None:
            return sys.maxsize
        return max(self.config.max_steps - self.state.step, 0)

    def training_left(self) -> bool:
        """Whether the run has epochs and updates left and was not told to stop."""
        state = self.state
        return state.epoch < self.config.epochs and not state.stop_training and self.steps_left > 0

    @property
    def eval_batch_size(self) -> int:
        """Examples per batch when validating, testing or predicting on plain arrays."""
        return self.config.eval_batch_size or self.config.batch_size

    def running_totals(self) -> tuple[float, int]:
        """The epoch's summed training loss and example count so far, over all workers."""
        return self._loop.running_totals()

    def fit(
        self,
        train_data: Any,
        val_data: Any = None,
        *,
        resume: str | Path | None = None,
        archive_existing: bool = False,
    ) -> list[dict[str, Any]]:
        """Train ``config.epochs`` epochs or ``max_steps`` updates; return one dict per epoch.

        Args:
            train_data: ``(inputs, targets)`` arrays, an :class:`~unitrain.data.ArrayLoader`,
                or a re-iterable of batches.
            val_data: the same kinds, validated by ``val_every_n_epochs`` or ``val_every_n_steps``.
            resume: ``"auto"`` (the newest valid checkpoint in ``config.checkpoint_dir`` if
                there is one, else a fresh start: what a restarted job wants), ``"latest"``
                (the same, but warns when there is none) or a checkpoint path; training
                continues exactly where that checkpoint stopped. Resuming a finished run warns
                and trains nothing (so a job that relaunches itself ends cleanly). None is
                ``"auto"`` in a restarted torchrun worker (``TORCHELASTIC_RESTART_COUNT`` > 0)
                or a requeued Slurm job (``SLURM_RESTART_COUNT`` > 0).
            archive_existing: a fresh run in a checkpoint folder that holds checkpoints moves
                them into ``archive/<time>-<run id>/`` there; without it, it is refused.

        Raises:
            DataError, ConfigError: bad data or contradictory settings, before any update.
            CheckpointError: ``resume`` finds no valid checkpoint of this model, another
                run holds ``checkpoint_dir`` (see :mod:`unitrain.training._lock`), or a fresh run
                finds another run's checkpoints there (see :mod:`unitrain.training._lineage`).
            Preempted: a preemption signal (``config.preemption_signals``) arrived; the run
                saved a checkpoint of the step it reached first (see
                :mod:`unitrain.training._preemption`). It is a ``SystemExit`` with status 143.
        """
        if self.config.checkpoint_dir is not None:
            resume = restart_resume(resume)
        source = self._source(train_data, "train_data", shuffle=True)
        val_source = None if val_data is None else self._source(val_data, "val_data", False)
        self.has_validation, self.batches_per_epoch = val_source is not None, len(source)
        self.val_source = val_source
        self.stop_reason = None
        self._loop.check_run(source)
        # Held until fit returns or raises: a second run on these directories is refused
        # instead of pruning and resuming this run's checkpoints. Rank 0 holds it for all.
        directories = checkpoint_folders(self) if self.strategy.is_main else []
        # A signal from here on is answered after the next update; none can end the run
        # between taking the lock and training.
        with self._signals, locked(directories) as self._locks:
            for directory in directories:  # safe now: no other run writes there
                remove_leftovers(directory)
            self.strategy.barrier()  # the others read checkpoints once rank 0 cleaned up
            try:
                self._fit(source, val_source, resume, directories, archive_existing)
            except BaseException as error:
                try:
                    self._writer.wait()  # no save may outlive the lock
                except CheckpointError as failed:
                    error.add_note(f"also, a checkpoint save in the background failed: {failed}")
                raise
            self._writer.wait()
            self.strategy.barrier()  # no worker returns before the last checkpoint is durable
        return self.history

    def _fit(
        self,
        source: BatchSource,
        val_source: BatchSource | None,
        resume: Any,
        folders: list[Path],
        archive_existing: bool,
    ) -> None:
        self._loop.place_on_device(source)
        resumed = None
        if resume in ("latest", "auto") and nothing_to_resume(self.config, resume):
            if resume == "latest":
                warnings.warn(
                    f"resume='latest': no checkpoint in {self.config.checkpoint_dir} yet; "
                    "starting from scratch",
                    stacklevel=3,
                )
        elif resume is not None:
            resumed = restore(self, "latest" if resume == "auto" else resume)
        if resumed is not None or self.lineage is None:  # a second fit goes on with its run
            if resumed is None:
                claim_folders(folders, archive=archive_existing)
            self.lineage = lineage_for(folders, resumed and resumed[0], self.state.step)
        self.callbacks.call("on_train_begin", self)
        if resumed is not None:
            path, callback_states = resumed
            try:
                self.callbacks.load_state_dict(callback_states)
            except CheckpointError as error:
                raise CheckpointError(f"{path}/trainer.json: {error}") from None
            self._loop.warn_if_finished()
        while self.training_left():
            self._loop.run_epoch(source, val_source)
        self.callbacks.call("on_train_end", self)

    def validate(self, data: Any) -> dict[str, float]:
        """Evaluate on ``data`` (``config.val_batches`` batches at most); metrics ``val_*``."""
        return self._loop.validate(self._source(data, "val_data", shuffle=False))

    def test(self, data: Any) -> dict[str, float]:
        """Evaluate on held-out ``data``, all of it; metrics are prefixed ``test_``."""
        source = self._source(data, "test_data", shuffle=False)
        results = evaluate(self.backend, self.strategy, self.metrics, source, "test_data")
        return {f"test_{k}": v for k, v in results.items()}

    def predict(self, data: Any) -> np.ndarray:
        """The model's outputs (eval mode) for ``data``, as one numpy array.

        Args:
            data: an inputs array (run in batches of ``config.eval_batch_size``), ``(inputs,
                targets)`` arrays, an :class:`~unitrain.data.ArrayLoader` or an iterable of
                batches (targets are ignored).
        """
        return _inference.predict(self.backend, data, self.eval_batch_size)

    def load_weights(self, path: str | Path) -> None:
        """Put a checkpoint's model tensors (parameters and state) into this Trainer's model.

        For inference or fine-tuning: the optimizer state, the step and the callbacks stay as
        they are (``fit(resume=...)`` restores those too). The checkpoint may come from any
        backend that builds the same portable model.

        Raises:
            CheckpointError: the checkpoint is damaged or holds other tensors than the model.
        """
        _inference.load_weights(self.backend, path)

    def save_checkpoint(
        self,
        path: str | Path,
        *,
        background: bool = False,
        then: Callable[[], None] | None = None,
    ) -> Path:
        """Write a checkpoint of everything needed to continue exactly from here.

        Args:
            path: the checkpoint directory (see :func:`unitrain.checkpoint.save_checkpoint`).
            background: return once the files are written and let a background thread digest,
                fsync and rename them (:class:`~unitrain.checkpoint.CheckpointWriter`); the
                checkpoint appears at ``path`` when it is durable, and ``fit`` waits for it
                before returning. Otherwise it is durable when this returns.
            then: called once the checkpoint is in place (on the background thread, with
                ``background``); where older checkpoints can be deleted safely.

        Under several workers every worker calls this (the running loss is summed over
        them); rank 0 writes, and the others wait until it has. Sharded workers each write
        their own rows of the model and optimizer state (a gather where the engine cannot).
        """
        self._last_save = (self.state.step, Path(path))  # on every worker: they decide alike
        return save_run(
            self, Path(path), self._writer, self._locks, background=background, then=then
        )

    def wait_for_checkpoints(self) -> None:
        """Return once every checkpoint save started in the background is durable (a
        callback that ships the newest checkpoint somewhere waits for it this way)."""
        self._writer.wait()

    def run_state(self) -> RunState:
        """Where the run stands besides its tensors: what a checkpoint records of the Trainer.

        Under several workers every worker calls this: the running loss is summed over them.
        """
        loss_sum, loss_count = self.running_totals()
        return RunState(
            dataclasses.replace(self.state),
            loss_sum=loss_sum,
            loss_count=loss_count,
            lr_factor=self.lr_factor,
            skipped_steps=self.skipped_steps,
            history=list(self.history),
            step_history=list(self.step_history),
        )

    def restore_run_state(self, state: RunState) -> None:
        """Continue from ``state`` (as :meth:`run_state` gave it, or a checkpoint held it).

        The backend's skipped updates of this session start at zero, so the saved count is
        kept apart and added; under several workers rank 0 takes the saved loss total (the
        sum over all workers) and the others start from zero.
        """
        self.state = dataclasses.replace(state.position)
        self.lr_factor = state.lr_factor
        self.history, self.step_history = list(state.history), list(state.step_history)
        main = self.strategy.is_main
        loss_sum, loss_count = (state.loss_sum, state.loss_count) if main else (0.0, 0)
        self._loop.start_counters(loss_sum, loss_count, state.skipped_steps)

    # -- data and resume ----------------------------------------------------------------------

    def _source(self, data: Any, label: str, shuffle: bool) -> BatchSource:
        """``data`` as a batch source, checked against a portable model before any update.

        Inputs must fit the model; labels (cross-entropy) or targets (mse) its outputs, whose
        shape comes from the model's description. A native model has none: its backend
        checks what it can. Arrays are batched by ``batch_size`` or ``eval_batch_size``.
        """
        size = self.config.batch_size if label == "train_data" else self.eval_batch_size
        source = as_batch_source(data, size, self.config.seed, shuffle, label)
        if isinstance(self.model, AbstractLayer):
            # An MLP keeps its own message about the feature size.
            in_features = self.model.in_features if isinstance(self.model, MLP) else None
            check_source(
                source, in_features=in_features, model=self.model, loss=self.loss, name=label
            )
        return source

    # -- what the loop attends to between updates ---------------------------------------------

    def _ask_attention(self) -> None:
        """Called by the signal handler and the checkpoint writer's thread: look after an update."""
        self._loop.attention = True

    def _attend(self) -> None:
        """Act on a lost run lock, a failed background save or a preemption signal.

        The loop calls it at every epoch's end, and after an update that raised the
        attention flag (see :class:`~unitrain.training._fit_loop.FitLoop`).

        With several workers this runs at every logging point and epoch end on all of them
        (not on the flag, which only some may have): they agree there on whether any was
        signalled, so all stop at the same step and rank 0 saves it.
        """
        self._loop.attention = False
        check_locks(self._locks)  # a flag the lock's heartbeat sets: no file system access
        if self._writer.failed:
            self._recover_failed_save()
        signalled = self._signals.received
        if self._loop.parallel:
            if self.strategy.all_sum([signalled is not None])[0] == 0:
                return
            signalled = signalled or "a signal to another worker"
        if signalled is not None:
            self._preempt(signalled)

    def _recover_failed_save(self) -> None:
        """A background save failed: save this step synchronously, or stop with both errors."""
        try:
            self._writer.wait()
        except CheckpointError as failed:
            path = checkpoint_path(self)
            if path is None or self._loop.parallel:  # other workers cannot join a save now
                raise
            try:
                self.save_checkpoint(path)
            except CheckpointError as again:
                raise CheckpointError(
                    f"a checkpoint save in the background failed: {failed}; saving step "
                    f"{self.state.step} synchronously failed too: {again}"
                ) from failed
            warnings.warn(
                f"a checkpoint save in the background failed: {failed}; saved {path} "
                "synchronously instead, and training goes on",
                CheckpointWarning,
                stacklevel=4,
            )

    def _preempt(self, signal_name: str) -> None:
        """Checkpoint this step (durably), say where, and raise :class:`Preempted`."""
        step, path = self.state.step, checkpoint_path(self)
        if path is not None and self._last_save == (step, path):
            self._writer.wait()  # this very step is being saved already
        elif path is not None:
            path = self.save_checkpoint(path)
        where = (
            f"checkpoint {path}; continue with resume='auto' (unitrain train --resume auto)"
            if path is not None
            else "nothing saved: set TrainerConfig(checkpoint_dir=...) to checkpoint on signals"
        )
        message = f"unitrain: {signal_name}: stopped at step {step} (epoch {self.epoch_number}); "
        message += where
        if self.strategy.is_main:
            print(message, file=sys.stderr, flush=True)
        raise Preempted(signal_name, path, message)
