"""The Trainer: one training loop for every backend, exact to resume, with no per-step sync.

The loop owns what is the same everywhere — epochs, batching, accumulation, the learning
rate, callbacks, checkpoints, metric bookkeeping — and leaves forward, backward and the
update to a :class:`unitrain.backend.Backend`. Per-update losses stay on the device, collected
without a framework op; they are read back (one batched transfer) and summed in float64 only
at logging points, checkpoints and epoch ends.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import _inference, rng
from unitrain._errors import CheckpointError, ConfigError, DataError, NonFiniteError
from unitrain._lock import locked
from unitrain._run_state import TrainState, restore, snapshot
from unitrain._running import RunningLoss
from unitrain.backend import (
    Backend,
    BackendOptions,
    DeviceData,
    DeviceOutputs,
    FusedStep,
    MultiStep,
    Predict,
    Prefetch,
)
from unitrain.callbacks._base import CallbackList
from unitrain.callbacks.model_checkpoint import ModelCheckpoint
from unitrain.checkpoint import CheckpointWriter, list_checkpoints, save_checkpoint
from unitrain.checkpoint._write import remove_leftovers
from unitrain.config import TrainerConfig, check_run_length
from unitrain.data import ArrayLoader, BatchSource, as_batch_source, check_source
from unitrain.metrics import MetricTotals, resolve_metrics
from unitrain.models import MLP
from unitrain.optim import SGD, Optimizer
from unitrain.registry import get_backend
from unitrain.schedules import AbstractSchedule, Constant
from unitrain.strategy import (
    Strategy,
    check_splittable,
    evaluate_over_workers,
    strategy_for,
    training_shards,
)

__all__ = ["TrainState", "Trainer"]

Batch = tuple[Any, Any]


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
        loss: ``"cross_entropy"`` or ``"mse"`` (or a native loss the backend accepts).
        callbacks: objects with any of the ``on_*`` hooks of :class:`unitrain.callbacks.Callback`.
        config: a :class:`TrainerConfig`.
        strategy: how the run is spread over workers (:mod:`unitrain.strategy`): None runs
            on the workers of the launcher that started this process (``torchrun``, ...) or
            on this process alone; an int N computes N workers' shares here, as N workers
            would. With several workers every process calls ``fit`` alike; only rank 0
            writes checkpoints, logs and the lock.
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
        strategy: Strategy | int | None = None,
        metrics: Iterable[Any] = (),
    ) -> None:
        self.config = config = config or TrainerConfig()
        self.model = model
        self.optimizer = optimizer or SGD()
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
            )
            self.backend = get_backend(backend)(model, options)
        self.strategy = strategy_for(self.backend, strategy)
        self._parallel = self.strategy.world_size > 1
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
        # Workers weight their slice's loss before the engine reduces gradients, which needs
        # backward(scale) apart from step: fused and multi-step calls are single-worker paths.
        fused_ok = config.grad_accum_steps == 1 and not self._parallel
        self._fused = isinstance(self.backend, FusedStep) and fused_ok
        self._skipped_before = 0  # skipped updates counted by backends of earlier sessions
        self._skipped_reported = 0
        self._multi_step = (
            isinstance(self.backend, MultiStep) and config.steps_per_call > 1 and not self._parallel
        )
        if config.steps_per_call > 1 and not self._multi_step:
            warnings.warn(
                f"steps_per_call={config.steps_per_call}, but the {self.backend.name} backend "
                "has no multi-step call; running one update per call",
                stacklevel=2,
            )
        self._device_source: BatchSource | None = None  # the source copied to the device
        self._running = RunningLoss(getattr(self.backend, "to_host", None))
        self._writer = CheckpointWriter()
        self._last_lr = self.lr
        rng.seed_everything(config.seed)

    # -- public API ---------------------------------------------------------------------------

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        return self.schedule(self.state.step) * self.lr_factor

    @property
    def skipped_steps(self) -> int:
        """Updates skipped so far because of a NaN or infinite gradient (reads the backend)."""
        return self._skipped_before + self.backend.skipped_steps

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

    def fit(
        self, train_data: Any, val_data: Any = None, *, resume: str | Path | None = None
    ) -> list[dict[str, Any]]:
        """Train for ``config.epochs`` epochs; return one metrics dict per epoch.

        Args:
            train_data: ``(inputs, targets)`` arrays, an :class:`~unitrain.data.ArrayLoader`,
                or a re-iterable of batches.
            val_data: the same kinds, evaluated after every ``val_every_n_epochs`` epochs.
            resume: ``"latest"`` (newest valid checkpoint in ``config.checkpoint_dir``) or a
                checkpoint path; training continues exactly where that checkpoint stopped.
                Resuming a finished run warns and trains nothing (so a job that relaunches
                itself with ``resume="latest"`` ends cleanly).

        Raises:
            DataError, ConfigError: bad data or contradictory settings, before any update.
            CheckpointError: ``resume`` finds no valid checkpoint of this model, or another
                run holds ``checkpoint_dir`` (see :mod:`unitrain._lock`).
        """
        source = self._source(train_data, "train_data", shuffle=True)
        val_source = None if val_data is None else self._source(val_data, "val_data", False)
        self.has_validation, self.batches_per_epoch = val_source is not None, len(source)
        self.val_source = val_source
        self.stop_reason = None
        check_run_length(self.config, self.schedule, len(source))
        check_splittable(source, self.strategy.world_size)
        # Held until fit returns or raises: a second run on these directories is refused
        # instead of pruning and resuming this run's checkpoints. Rank 0 holds it for all.
        mine = [c.dirpath for c in self.callbacks.callbacks if isinstance(c, ModelCheckpoint)]
        directories = [Path(d) for d in [self.config.checkpoint_dir, *mine] if d is not None]
        directories = directories if self.strategy.is_main else []
        with locked(directories):
            for directory in directories:  # safe now: no other run writes there
                remove_leftovers(directory)
            self.strategy.barrier()  # the others read checkpoints once rank 0 cleaned up
            try:
                self._fit(source, val_source, resume)
            except BaseException as error:
                try:
                    self._writer.wait()  # no save may outlive the lock
                except CheckpointError as failed:
                    error.add_note(f"also, a checkpoint save in the background failed: {failed}")
                raise
            self._writer.wait()
            self.strategy.barrier()  # no worker returns before the last checkpoint is durable
        return self.history

    def _fit(self, source: BatchSource, val_source: BatchSource | None, resume: Any) -> None:
        self._place_on_device(source)
        resumed = None
        if resume == "latest" and self._nothing_to_resume():
            warnings.warn(
                f"resume='latest': no checkpoint in {self.config.checkpoint_dir} yet; "
                "starting from scratch",
                stacklevel=3,
            )
        elif resume is not None:
            resumed = restore(self, resume)
            if not self.strategy.is_main:  # the saved loss total is the sum over workers
                self._running.reset()
        self.callbacks.call("on_train_begin", self)
        if resumed is not None:
            path, callback_states = resumed
            try:
                self.callbacks.load_state_dict(callback_states)
            except CheckpointError as error:
                raise CheckpointError(f"{path}/trainer.json: {error}") from None
            if self.state.stop_training or self.state.epoch >= self.config.epochs:
                warnings.warn(
                    f"the resumed run had already finished (epoch {self.state.epoch} of "
                    f"{self.config.epochs}, stopped early: {self.state.stop_training}); nothing "
                    "left to train. Raise epochs to train further (a run that stopped early "
                    "keeps that decision: start a new run).",
                    stacklevel=3,
                )
        while self.state.epoch < self.config.epochs and not self.state.stop_training:
            self._run_epoch(source, val_source)
        self.callbacks.call("on_train_end", self)

    def validate(self, data: Any) -> dict[str, float]:
        """Evaluate on ``data`` in eval mode; metrics are prefixed ``val_``."""
        return self._validate(self._source(data, "val_data", shuffle=False))

    def test(self, data: Any) -> dict[str, float]:
        """Evaluate on held-out ``data``; metrics are prefixed ``test_``."""
        source = self._source(data, "test_data", shuffle=False)
        return {f"test_{k}": v for k, v in self._evaluate(source, "test_data").items()}

    def predict(self, data: Any) -> np.ndarray:
        """The model's outputs (eval mode) for ``data``, as one numpy array.

        Args:
            data: an inputs array (run in batches of ``config.batch_size``), ``(inputs,
                targets)`` arrays, an :class:`~unitrain.data.ArrayLoader` or an iterable of
                batches (targets are ignored).
        """
        return _inference.predict(self.backend, data, self.config.batch_size)

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

        Under several workers every worker calls this (the running loss is summed over them);
        rank 0 writes, and the others wait until it has.
        """
        if not self.strategy.is_main:
            self.running_totals()  # rank 0's snapshot sums the running loss with this worker's
            self.strategy.barrier()
            return Path(path)
        state = snapshot(self)
        if background:
            saved = self._writer.save(path, then=then, **state)
        else:
            self._writer.wait()
            saved = save_checkpoint(path, **state)
            if then is not None:
                then()
        self.strategy.barrier()
        return saved

    # -- the loop -----------------------------------------------------------------------------

    def _run_epoch(self, source: BatchSource, val_source: BatchSource | None) -> None:
        epoch, started = self.state.epoch, time.perf_counter()
        if self.state.batch == 0:
            self._reset_running()
        self.callbacks.call("on_epoch_begin", self, epoch)
        one_batch_updates = self.config.grad_accum_steps == 1 and not self._multi_step
        one_batch_updates = one_batch_updates and not self._parallel
        if one_batch_updates and self._device_source is not source:
            batches = source.batches(epoch, self.state.batch)
            if isinstance(self.backend, Prefetch):
                batches = self.backend.prefetch(batches)
            self._train_batches(batches)
        else:
            for kind, payload, steps, batch_size in self._units(source, epoch):
                if kind == "group":
                    self._train_group(payload)
                else:
                    self._train_steps(kind, payload, steps, batch_size)
                if self.state.stop_training:
                    break
        logs = {"epoch": epoch + 1, "step": self.state.step, "lr": self._last_lr}
        logs.update(self._read_running())
        last = epoch + 1 == self.config.epochs or self.state.stop_training
        if val_source is not None and ((epoch + 1) % self.config.val_every_n_epochs == 0 or last):
            logs.update(self._validate(val_source))  # checked once, when fit began
        logs["seconds"] = time.perf_counter() - started
        self.history.append(logs)
        self.state.epoch, self.state.batch = epoch + 1, 0
        self._reset_running()
        self.callbacks.call("on_epoch_end", self, epoch, logs)

    def _units(self, source: BatchSource, epoch: int) -> Iterator[tuple[str, Any, int, int]]:
        """The epoch's work from the current position: ``(kind, payload, updates, batch)``.

        ``group`` units are one update from ``grad_accum_steps`` micro-batches; ``stacked``
        and ``indexed`` units are ``steps_per_call`` updates in one compiled call, on host
        batches stacked together or on indices into the data kept on the device. Batches
        that do not fill a whole call (the end of an epoch) go one update at a time.
        """
        start, k = self.state.batch, self.config.steps_per_call
        if self._device_source is source:
            assert isinstance(source, ArrayLoader)
            order, size = source.order(epoch), source.batch_size
            full = len(order) // size
            while start + k <= full:
                yield "indexed", order[start * size : (start + k) * size].reshape(k, size), k, size
                start += k
        batches = source.batches(epoch, start)
        if k > 1 and self._multi_step:
            while chunk := list(islice(batches, k)):
                sizes = {len(batch[0]) for batch in chunk}
                if len(chunk) < k or len(sizes) > 1:
                    yield from (("group", [batch], 1, len(batch[0])) for batch in chunk)
                    continue
                stacked = (np.stack([b[0] for b in chunk]), np.stack([b[1] for b in chunk]))
                yield "stacked", stacked, k, sizes.pop()
            return
        while group := list(islice(batches, self.config.grad_accum_steps)):
            yield "group", group, 1, 0

    def _train_batches(self, batches: Iterator[Batch]) -> None:
        """One update per batch: the default path, kept free of per-step overhead.

        Equal to :meth:`_train_group` on one-batch groups. What cannot change within the
        epoch is looked up once; per update the loop computes the LR, runs the backend's
        fused step (or forward, backward and step), records the loss (no host sync) and
        counts. Hooks are called only when some callback defines them.
        """
        backend, callbacks, running = self.backend, self.callbacks, self._running
        update = backend.train_step if self._fused else self._update
        begin = callbacks.hooks["on_batch_begin"]
        for batch in batches:
            lr = self.schedule(self.state.step) * self.lr_factor
            if begin:
                callbacks.call("on_batch_begin", self, self.state.batch)
            running.add(update(batch, lr), len(batch[0]))
            self._after_update(1, 1, lr)
            if self.state.stop_training:
                break

    def _update(self, batch: Batch, lr: float) -> Any:
        """``forward; backward; step``: one update from one batch, for unfused backends."""
        loss = self.backend.forward(batch)
        self.backend.backward()
        self.backend.step(lr)
        return loss

    def _train_steps(self, kind: str, payload: Any, steps: int, batch_size: int) -> None:
        """``steps`` updates in one compiled call of the backend."""
        state = self.state
        lrs = np.array([self.schedule(state.step + i) for i in range(steps)]) * self.lr_factor
        self.callbacks.call("on_batch_begin", self, state.batch)
        run = self.backend.train_steps_on_device if kind == "indexed" else self.backend.train_steps
        self._running.add(run(payload, lrs), batch_size, steps)
        self._after_update(steps, steps, float(lrs[-1]))

    def _train_group(self, group: list[Batch]) -> None:
        """One optimizer update from ``group``'s micro-batches, weighted by their sizes."""
        backend, state = self.backend, self.state
        lr = self.schedule(state.step) * self.lr_factor
        self.callbacks.call("on_batch_begin", self, state.batch)
        if self._fused:
            self._running.add(backend.train_step(group[0], lr), len(group[0][0]))
        else:
            sizes = [len(batch[0]) for batch in group]
            total = sum(sizes)
            for batch, n in zip(group, sizes):
                for shard, weight in training_shards(self.strategy, batch):
                    self._running.add(backend.forward(shard), len(shard[0]))
                    backend.backward(weight * n / total)
            backend.step(lr)
        self._after_update(1, len(group), lr)

    def _after_update(self, steps: int, batches: int, lr: float) -> None:
        """Count ``steps`` updates over ``batches`` batches; log and call ``on_batch_end``.

        Between logging points, with no ``on_batch_end`` hook, only the counting is done.
        """
        state = self.state
        state.step += steps
        state.batch += batches
        self._last_lr = lr
        every, hooked = self.config.log_every_n_steps, self.callbacks.hooks["on_batch_end"]
        logging = state.step // every > (state.step - steps) // every
        if not (logging or hooked):
            return
        logs: dict[str, Any] = {"step": state.step, "lr": lr}
        if logging:
            logs.update(self._read_running())
        if hooked:
            self.callbacks.call("on_batch_end", self, state.batch, logs)

    def _reset_running(self) -> None:
        self._running.reset()
        self._last_lr = self.lr

    def _read_running(self) -> dict[str, Any]:
        """Read the running metrics back to the host (the only sync point) and check them."""
        skipped = self.skipped_steps
        if skipped > self._skipped_reported:
            self._on_nonfinite(skipped - self._skipped_reported)
            self._skipped_reported = skipped
        total, count = self.running_totals()
        return {"loss": total / count if count else float("nan"), "skipped_steps": skipped}

    def running_totals(self) -> tuple[float, int]:
        """The epoch's summed training loss and example count so far, over all workers."""
        total, count = self.strategy.all_sum([self._running.total(), self._running.count])
        return total, round(count)

    def _on_nonfinite(self, new: int) -> None:
        where = f"{new} update(s) up to step {self.state.step}"
        policy = self.config.nonfinite
        if policy == "raise":
            raise NonFiniteError(
                f"non-finite loss or gradient in {where}; those updates were skipped, so the "
                "weights hold no NaN. Lower the learning rate, clip gradients "
                "(grad_clip_norm), check the data, or set nonfinite='skip_batch' to go on."
            )
        if policy == "stop":
            warnings.warn(f"stopping: non-finite loss or gradient in {where}", stacklevel=3)
            self.stop(f"non-finite loss or gradient in {where} (nonfinite='stop')")

    def _place_on_device(self, source: BatchSource) -> None:
        """Copy the training arrays to the device once, when configured and possible."""
        if not self.config.data_on_device or self._device_source is source:
            return
        if self._parallel:
            warnings.warn(
                "data_on_device=True is a single-worker path; with several workers each one "
                "takes its slice of every batch from the host",
                stacklevel=3,
            )
        elif not isinstance(self.backend, DeviceData):
            warnings.warn(
                f"data_on_device=True, but the {self.backend.name} backend cannot keep data on "
                "the device; batches are sent from the host",
                stacklevel=3,
            )
        elif isinstance(source, ArrayLoader):
            self.backend.set_device_data(source.inputs, source.targets)
            self._device_source = source

    def _validate(self, source: BatchSource) -> dict[str, float]:
        self.callbacks.call("on_validation_begin", self)
        metrics = {f"val_{k}": v for k, v in self._evaluate(source, "val_data").items()}
        self.callbacks.call("on_validation_end", self, metrics)
        return metrics

    def _evaluate(self, source: BatchSource, label: str) -> dict[str, float]:
        if self._parallel and not self.metrics:  # each worker its slices, summed over them
            return evaluate_over_workers(self.backend, self.strategy, source.batches(0), label)
        # One worker, or metrics beyond the loss: every worker evaluates every example.
        sums: dict[str, Any] = {}
        count = 0
        totals = MetricTotals(self.metrics)
        for batch in source.batches(0):
            n = len(batch[0])
            for key, value in self.backend.evaluate(batch).items():
                sums[key] = sums.get(key, 0.0) + value * n
            count += n
            if self.metrics and isinstance(self.backend, DeviceOutputs):
                outputs, targets = self.backend.outputs(batch)  # stay on the device
                totals.add(outputs, targets, batch[1], self.backend.array_ops)
            elif self.metrics:
                totals.add(self.backend.predict(batch[0]), batch[1], batch[1])
        if count == 0:
            raise DataError(f"{label} yielded no batches; pass at least one example")
        return {**{key: float(value) / count for key, value in sums.items()}, **totals.results()}

    # -- data and resume ----------------------------------------------------------------------

    def _source(self, data: Any, label: str, shuffle: bool) -> BatchSource:
        source = as_batch_source(data, self.config.batch_size, self.config.seed, shuffle, label)
        if isinstance(self.model, MLP):
            classes = self.model.out_features if self.loss == "cross_entropy" else None
            check_source(
                source, in_features=self.model.in_features, num_classes=classes, name=label
            )
        return source

    def _nothing_to_resume(self) -> bool:
        """Whether ``resume="latest"`` finds no checkpoint at all (a first run, not an error).

        Checkpoints that exist but are all damaged are an error, raised by the resolver."""
        if self.config.checkpoint_dir is None:
            raise ConfigError("resume='latest' needs TrainerConfig(checkpoint_dir=...)")
        return not list_checkpoints(self.config.checkpoint_dir)
