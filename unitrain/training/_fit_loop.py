"""The Trainer's fit loop: epochs of updates, the running loss, logging points and hooks.

:class:`FitLoop` is the part of :class:`unitrain.Trainer` that runs once ``fit`` has checked
its inputs: it walks an epoch's batches in the unit the configuration asks for (one batch,
an accumulation group, or several updates in one compiled call), gives each update its
learning rate, keeps the per-update losses on the device until a logging point, and calls
the callbacks. The Trainer holds one (``Trainer._loop``) and hands it the run; the loop reads
and advances the run's position (``state``), appends its history rows and calls the hooks
with the Trainer, and keeps its own counters (running loss, skipped updates, the last LR
applied), which the Trainer reads through it.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import numpy as np

from unitrain._errors import ConfigError, NonFiniteError
from unitrain.backends.numbering import NumberedCalls
from unitrain.backends.protocol import DeviceData, FusedStep, MultiStep, Prefetch, ToHost
from unitrain.backends.strategy import check_splittable, loss_count, training_shards
from unitrain.data import ArrayLoader, BatchSource
from unitrain.structure import batch_weight, num_examples
from unitrain.training._evaluation import evaluate
from unitrain.training._running import RunningLoss
from unitrain.training.config import check_run_length

__all__ = ["FitLoop"]

Batch = tuple[Any, Any]


class FitLoop:
    """The training loop of a :class:`unitrain.Trainer` (see the module doc).

    Args:
        run: the Trainer: its backend, config, strategy, callbacks, metrics and schedule,
            its position, history and validation data, all read from it each time (a resume
            replaces the position and history; a caller may replace the callbacks).
        attend: called when the run needs the Trainer's attention (a signal, a lost lock, a
            failed background save) after an update, and at every epoch's end.
    """

    def __init__(self, run: Any, attend: Callable[[], None]) -> None:
        self.run, self._attend = run, attend
        backend, config = run.backend, run.config
        self.parallel = run.strategy.world_size > 1
        #: The backend's update calls, given each update's numbers for its dropout keys.
        self._calls = NumberedCalls(backend)
        # Workers weight their slice's loss before the engine reduces gradients, which needs
        # backward(scale) apart from step: fused and multi-step calls are single-worker paths.
        self._fused = isinstance(backend, FusedStep) and (
            config.grad_accum_steps == 1 and not self.parallel
        )
        multi_step = isinstance(backend, MultiStep) and config.steps_per_call > 1
        self._multi_step = multi_step and not self.parallel
        if config.steps_per_call > 1 and not self._multi_step:
            warnings.warn(
                f"steps_per_call={config.steps_per_call}, but the {backend.name} backend "
                "has no multi-step call; running one update per call",
                stacklevel=3,  # the user's Trainer(...) line
            )
        self._device_source: BatchSource | None = None  # the source copied to the device
        to_host = backend.to_host if isinstance(backend, ToHost) else None
        self._running = RunningLoss(to_host)
        self.start_counters(0.0, 0, 0)
        #: Set from outside the loop (a signal handler, the checkpoint writer's thread) when
        #: something needs the Trainer's attention; tested once per update.
        self.attention = False

    def start_counters(self, loss_sum: float, loss_count: int, skipped: int) -> None:
        """Continue from a running loss and a count of skipped updates (zero, or a resume's)."""
        self._running.reset(loss_sum, loss_count)
        self._skipped_before = skipped  # skipped updates counted by backends of earlier sessions
        self._skipped_reported = skipped
        self._last_lr = self.run.lr_at(self.run.state.step)

    @property
    def skipped_steps(self) -> int:
        """Updates skipped so far because of a NaN or infinite gradient (reads the backend)."""
        return self._skipped_before + self.run.backend.skipped_steps

    def check_run(self, source: BatchSource) -> None:
        """Refuse, before any update, what this fit cannot do: a warmup longer than the run,
        data that cannot be split over the workers, a validation cadence or limit when the
        fit has no validation data."""
        check_run_length(self.run.config, self.run.schedule, len(source))
        check_splittable(source, self.run.strategy.world_size)
        for name in ("val_every_n_steps", "val_batches"):
            value = getattr(self.run.config, name)
            if value is not None and self.run.val_source is None:
                raise ConfigError(
                    f"TrainerConfig: {name}={value} needs validation data; pass val_data to "
                    f"fit() (in a recipe: data with a validation split) or leave {name} unset"
                )

    def warn_if_finished(self) -> None:
        """Say so when a resumed run has nothing left to train (``fit`` then returns at once)."""
        if self.run.training_left():
            return
        state, config = self.run.state, self.run.config
        limit = "" if config.max_steps is None else f", step {state.step} of {config.max_steps}"
        warnings.warn(
            f"the resumed run had already finished (epoch {state.epoch} of {config.epochs}"
            f"{limit}, stopped early: {state.stop_training}); nothing left to train. Raise "
            "epochs (or max_steps) to train further (a run that stopped early keeps that "
            "decision: start a new run).",
            stacklevel=4,  # the user's fit(...) line
        )

    def running_totals(self) -> tuple[float, int]:
        """The epoch's summed training loss and example count so far, over all workers."""
        total, count = self.run.strategy.all_sum([self._running.total(), self._running.count])
        return total, round(count)

    def run_epoch(self, source: BatchSource, val_source: BatchSource | None) -> None:
        epoch, started = self.run.state.epoch, time.perf_counter()
        if self.run.state.batch == 0:
            self._reset_running()
        self.run.callbacks.call("on_epoch_begin", self.run, epoch)
        one_batch_updates = self.run.config.grad_accum_steps == 1 and not self._multi_step
        one_batch_updates = one_batch_updates and not self.parallel
        if one_batch_updates and self._device_source is not source:
            batches = source.batches(epoch, self.run.state.batch)
            if isinstance(self.run.backend, Prefetch):
                batches = self.run.backend.prefetch(batches)
            self._train_batches(batches)
        else:
            for kind, payload, steps, batch_size in self._units(source, epoch):
                if kind == "group":
                    self._train_group(payload)
                else:
                    self._train_steps(kind, payload, steps, batch_size)
                if self.run.state.stop_training or not self.run.steps_left:
                    break
        logs = {"epoch": epoch + 1, "step": self.run.state.step, "lr": self._last_lr}
        logs.update(self._read_running())
        # Reaching max_steps mid-epoch ends the epoch there, as a stop does: its row covers
        # the batches trained, and a checkpoint counts it as finished.
        last = (
            epoch + 1 == self.run.config.epochs
            or self.run.state.stop_training
            or not self.run.steps_left
        )
        if val_source is not None and self._validates_at_epoch_end(epoch, last):
            logs.update(self.validate(val_source))  # checked once, when fit began
        logs["seconds"] = time.perf_counter() - started
        self.run.history.append(logs)
        self.run.state.epoch, self.run.state.batch = epoch + 1, 0
        self._reset_running()
        self.run.callbacks.call("on_epoch_end", self.run, epoch, logs)
        self._attend()  # a signal during validation or the hooks; a lost run lock

    def _validates_at_epoch_end(self, epoch: int, last: bool) -> bool:
        """Every ``val_every_n_epochs``-th epoch and the last; by steps, only the run's last
        update, unless a validation by steps has just measured it."""
        if self.run.config.val_every_n_steps is None:
            return (epoch + 1) % self.run.config.val_every_n_epochs == 0 or last
        measured = (
            self.run.step_history and self.run.step_history[-1]["step"] == self.run.state.step
        )
        return last and not measured

    def _units(self, source: BatchSource, epoch: int) -> Iterator[tuple[str, Any, int, int]]:
        """The epoch's work from the current position: ``(kind, payload, updates, batch)``.

        ``group`` units are one update from ``grad_accum_steps`` micro-batches; ``stacked``
        and ``indexed`` units are ``steps_per_call`` updates in one compiled call, on host
        batches stacked together or on indices into the data kept on the device. Batches
        that do not fill a whole call (the end of an epoch, or fewer updates left before
        ``max_steps`` than a call makes) go one update at a time. The loop takes the units one
        by one, so ``steps_left`` is read after the previous unit has run.
        """
        start, k = self.run.state.batch, self.run.config.steps_per_call
        if self._device_source is source:
            assert isinstance(source, ArrayLoader)
            order, size = source.order(epoch), source.batch_size
            full = len(order) // size
            while start + k <= full and self.run.steps_left >= k:
                yield "indexed", order[start * size : (start + k) * size].reshape(k, size), k, size
                start += k
        batches = source.batches(epoch, start)
        if k > 1 and self._multi_step:
            while chunk := list(islice(batches, min(k, self.run.steps_left))):
                sizes = {num_examples(batch) for batch in chunk}
                if len(chunk) < k or len(sizes) > 1 or len(chunk[0]) != 2:
                    yield from (("group", [batch], 1, num_examples(batch)) for batch in chunk)
                    continue
                stacked = (np.stack([b[0] for b in chunk]), np.stack([b[1] for b in chunk]))
                yield "stacked", stacked, k, sizes.pop()
            return
        while group := list(islice(batches, self.run.config.grad_accum_steps)):
            yield "group", group, 1, 0

    def _train_batches(self, batches: Iterator[Batch]) -> None:
        """One update per batch: the default path, kept free of per-step overhead.

        Equal to :meth:`_train_group` on one-batch groups. What cannot change within the
        epoch is looked up once; per update the loop computes the LR, runs the backend's
        fused step (or forward, backward and step), records the loss (no host sync) and
        counts. Hooks are called only when some callback defines them.
        """
        callbacks, running, lr_at, state = (
            self.run.callbacks,
            self._running,
            self.run.lr_at,
            self.run.state,
        )
        update = self._calls.train_step if self._fused else self._update
        begin = callbacks.hooks["on_batch_begin"]
        max_steps = self.run.config.max_steps or sys.maxsize
        for batch in batches:
            lr = lr_at(state.step)
            if begin:
                callbacks.call("on_batch_begin", self.run, state.batch)
            running.add(update(batch, lr, step=state.step), num_examples(batch))
            self._after_update(1, 1, lr)
            if state.stop_training or state.step >= max_steps:
                break

    def _update(self, batch: Batch, lr: float, step: int) -> Any:
        """``forward; backward; step``: one update from one batch, for unfused backends."""
        loss = self._calls.forward(batch, step=step, micro_batch=0)
        self.run.backend.backward()
        self.run.backend.step(lr)
        return loss

    def _train_steps(self, kind: str, payload: Any, steps: int, batch_size: int) -> None:
        """``steps`` updates in one compiled call of the backend."""
        state = self.run.state
        lrs = np.array([self.run.lr_at(state.step + i) for i in range(steps)])
        self.run.callbacks.call("on_batch_begin", self.run, state.batch)
        calls = self._calls
        run = calls.train_steps_on_device if kind == "indexed" else calls.train_steps
        self._running.add(run(payload, lrs, step=state.step), batch_size, steps)
        self._after_update(steps, steps, float(lrs[-1]))

    def _train_group(self, group: list[Batch]) -> None:
        """One optimizer update from ``group``'s micro-batches, weighted by their sizes.

        Each forward is numbered by how many this backend already ran for the update: the
        ``k``-th micro-batch of a launched worker is ``k``, and simulated workers' slices,
        all run here, follow one another (``dropout_index``).
        """
        backend, state, calls = self.run.backend, self.run.state, self._calls
        lr = self.run.lr_at(state.step)
        self.run.callbacks.call("on_batch_begin", self.run, state.batch)
        if self._fused:
            loss = calls.train_step(group[0], lr, step=state.step)
            self._running.add(loss, num_examples(group[0]))
        else:
            sizes = [batch_weight(batch) for batch in group]
            total, micro_batch = sum(sizes), 0
            for batch, n in zip(group, sizes):
                for shard, weight in training_shards(self.run.strategy, batch):
                    loss = calls.forward(shard, step=state.step, micro_batch=micro_batch)
                    share = loss_count(batch, shard, n)  # its share of a weighted batch
                    self._running.add(loss, num_examples(shard), counts_as=share)
                    backend.backward(weight * n / total)
                    micro_batch += 1
            backend.step(lr)
        self._after_update(1, len(group), lr)

    def _after_update(self, steps: int, batches: int, lr: float) -> None:
        """Count ``steps`` updates over ``batches`` batches; log and call ``on_batch_end``.

        Between logging points, with no ``on_batch_end`` hook, only the counting is done (and
        one test of the attention flag, which a preemption signal or a failed background
        save sets: the Trainer then checkpoints and stops, or recovers the save).
        """
        state = self.run.state
        state.step += steps
        state.batch += batches
        self._last_lr = lr
        every, hooked = self.run.config.log_every_n_steps, self.run.callbacks.hooks["on_batch_end"]
        logging = state.step // every > (state.step - steps) // every
        val_every = self.run.config.val_every_n_steps or 0
        validating = val_every and state.step // val_every > (state.step - steps) // val_every
        if validating and self.run.val_source is not None:
            # Before on_batch_end: a checkpoint of this step then holds the row and what the
            # monitors decided on it, so a resume neither repeats nor misses this validation.
            self._validate_by_steps(self.run.val_source, lr)
        if logging or hooked:
            logs: dict[str, Any] = {"step": state.step, "lr": lr}
            if logging:
                logs.update(self._read_running())
            if hooked:
                self.run.callbacks.call("on_batch_end", self.run, state.batch, logs)
        # Workers agree at logging points, which they all reach at the same step; a single
        # process acts on the flag after the very update.
        if (logging and self.parallel) or (self.attention and not self.parallel):
            self._attend()

    def _reset_running(self) -> None:
        self._running.reset()
        self._last_lr = self.run.lr_at(self.run.state.step)

    def _read_running(self) -> dict[str, Any]:
        """Read the running metrics back to the host (the only sync point) and check them."""
        skipped = self.skipped_steps
        if skipped > self._skipped_reported:
            self._on_nonfinite(skipped - self._skipped_reported)
            self._skipped_reported = skipped
        total, count = self.running_totals()
        return {"loss": total / count if count else float("nan"), "skipped_steps": skipped}

    def _on_nonfinite(self, new: int) -> None:
        where = f"{new} update(s) up to step {self.run.state.step}"
        policy = self.run.config.nonfinite
        if policy == "raise":
            raise NonFiniteError(
                f"non-finite loss or gradient in {where}; those updates were skipped, so the "
                "weights hold no NaN. Lower the learning rate, clip gradients "
                "(grad_clip_norm), check the data, or set nonfinite='skip_batch' to go on."
            )
        if policy == "stop":
            warnings.warn(f"stopping: non-finite loss or gradient in {where}", stacklevel=3)
            self.run.stop(f"non-finite loss or gradient in {where} (nonfinite='stop')")

    def place_on_device(self, source: BatchSource) -> None:
        """Copy the training arrays to the device once, when configured and possible."""
        if not self.run.config.data_on_device or self._device_source is source:
            return
        if self.parallel:
            warnings.warn(
                "data_on_device=True is a single-worker path; with several workers each one "
                "takes its slice of every batch from the host",
                stacklevel=3,
            )
        elif not isinstance(self.run.backend, DeviceData):
            warnings.warn(
                f"data_on_device=True, but the {self.run.backend.name} backend cannot keep data on "
                "the device; batches are sent from the host",
                stacklevel=3,
            )
        elif isinstance(source, ArrayLoader) and not source.structured:
            self.run.backend.set_device_data(source.inputs, source.targets)
            self._device_source = source

    def _validate_by_steps(self, source: BatchSource, lr: float) -> None:
        """A validation of ``val_every_n_steps``: a row of :attr:`step_history`, given to the
        callbacks' ``on_step_validation_end`` (loggers write it, monitors judge it).

        Its ``loss`` is the epoch's mean training loss so far (reading it changes no sum).
        """
        started = time.perf_counter()
        row = {"epoch": self.run.state.epoch + 1, "step": self.run.state.step, "lr": lr}
        row.update(self._read_running())
        row.update(self.validate(source))
        row["seconds"] = time.perf_counter() - started
        self.run.step_history.append(row)
        self.run.callbacks.call("on_step_validation_end", self.run, row)

    def validate(self, source: BatchSource) -> dict[str, float]:
        """One validation pass with its hooks; metrics are prefixed ``val_``.

        It reads at most ``val_batches`` batches, the first ones in the data's order.
        """
        self.run.callbacks.call("on_validation_begin", self.run)
        results = evaluate(
            self.run.backend,
            self.run.strategy,
            self.run.metrics,
            source,
            "val_data",
            self.run.config.val_batches,
        )
        metrics = {f"val_{k}": v for k, v in results.items()}
        self.run.callbacks.call("on_validation_end", self.run, metrics)
        return metrics
