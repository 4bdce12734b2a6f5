"""What a checkpoint holds of a run, and putting it back.

The Trainer owns its run state and hands it out as a :class:`RunState` value
(``Trainer.run_state()``) and takes one back (``Trainer.restore_run_state(...)``).
:func:`snapshot` gathers that value with the tensors, schedule, callbacks' states and RNG
states into the arguments of ``save_checkpoint``; :func:`restore` checks a checkpoint against
a run and applies it. Both see the run only through its public surface (:class:`Run`), so
this module imports no Trainer and writes no private field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import unitrain
from unitrain._errors import CheckpointError
from unitrain.backends.state import pack_tensors, split_state, unpack_tensors
from unitrain.checkpoint import _resume
from unitrain.checkpoint._discovery import load_resolved
from unitrain.models import AbstractLayer
from unitrain.schedules import from_dict
from unitrain.training import rng

__all__ = ["Run", "RunState", "TrainState", "model_description", "restore", "snapshot"]


@dataclasses.dataclass
class TrainState:
    """Where training stands; saved in every checkpoint.

    Attributes:
        epoch: index of the current epoch (= epochs completed).
        step: optimizer updates applied so far (the schedule's argument).
        batch: batches consumed in the current epoch.
        stop_training: set by a callback (early stopping) to end training after this update.
    """

    epoch: int = 0
    step: int = 0
    batch: int = 0
    stop_training: bool = False


@dataclasses.dataclass(frozen=True)
class RunState:
    """Everything a Trainer counts during a run that a resume must put back, tensors aside.

    Attributes:
        position: the epoch, step and batch reached, and whether training was told to stop.
        loss_sum: the current epoch's summed training loss so far (over all workers).
        loss_count: the examples that sum covers.
        lr_factor: the multiplier of the schedule's learning rate (ReduceLROnPlateau's).
        skipped_steps: updates skipped so far for a non-finite gradient.
        history: one metrics dict per finished epoch.
        step_history: one metrics dict per validation by steps (``val_every_n_steps``).
    """

    position: TrainState
    loss_sum: float = 0.0
    loss_count: int = 0
    lr_factor: float = 1.0
    skipped_steps: int = 0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    step_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class Run(Protocol):
    """The parts of a Trainer that a checkpoint records (``Trainer`` has them all)."""

    model: Any
    backend: Any
    optimizer: Any
    schedule: Any
    config: Any
    callbacks: Any
    batches_per_epoch: int
    lineage: Any  # a unitrain.training._lineage.Lineage, or None outside fit
    strategy: Any  # a unitrain.backends.strategy.Strategy

    def run_state(self) -> RunState: ...

    def restore_run_state(self, state: RunState) -> None: ...


def model_description(model: Any) -> dict[str, Any]:
    """How a checkpoint names its model: a portable model's spec, or a native model's class."""
    if isinstance(model, AbstractLayer):
        return model.to_dict()
    return {"type": "native", "class": type(model).__qualname__}


def join_snapshot(run: Run) -> None:
    """What a worker other than rank 0 does while rank 0 takes :func:`snapshot`: the same
    collectives in the same order. Its running loss joins rank 0's sum; where reading the
    backend's state is itself a collective (a sharded model's parameters are gathered: the
    strategy's ``collective_state``), it reads the state too, and otherwise leaves it alone
    (a data-parallel worker would copy its whole state to the host for nothing)."""
    if getattr(run.strategy, "collective_state", False):
        snapshot(run)
    else:
        run.run_state()


def snapshot(run: Run, *, local: bool = False) -> dict[str, Any]:
    """The state of the run now, as the keyword arguments of ``save_checkpoint``: ``trainer``
    (the trainer.json state), ``model``, ``optimizer`` and ``callbacks`` (arrays). ``local``:
    each sharded tensor as this worker's rows (the backend's ``local_state_dict``)."""
    tensors = run.backend.local_state_dict() if local else run.backend.state_dict()
    model, optimizer = split_state(tensors)
    state = run.run_state()  # over all workers: resumable on any number
    callback_tensors: dict[str, Any] = {}
    callback_states = pack_tensors(run.callbacks.state_dict(), "callbacks", callback_tensors)
    info = {
        **dataclasses.asdict(state.position),
        "running": {"loss_sum": state.loss_sum, "count": state.loss_count},
        "lr_factor": state.lr_factor,
        "skipped_steps": state.skipped_steps,
        "schedule": run.schedule.to_dict(),
        "optimizer": run.optimizer.to_dict(),
        "model": model_description(run.model),
        "config": dataclasses.asdict(run.config),
        "callbacks": callback_states,
        "history": state.history,
        "step_history": state.step_history,
        "rng": {**rng.get_rng_state(), "backend": run.backend.rng_state()},
        "backend": {
            "name": run.backend.name,
            "device": run.backend.device,
            "versions": run.backend.versions(),
        },
        "unitrain_version": unitrain.__version__,
    }
    if run.lineage is not None:
        info["run"] = run.lineage.to_dict()
    return {"trainer": info, "model": model, "optimizer": optimizer, "callbacks": callback_tensors}


def restore(run: Run, resume: str | Path) -> tuple[Path, dict[str, Any]]:
    """Load a checkpoint into ``run`` and its backend; return it and the callbacks' states.

    A checkpoint may come from anyone, so it is checked before it is used (see
    :mod:`unitrain.checkpoint._resume`); every problem is a CheckpointError naming the
    file. A failed resume may leave the Trainer half restored: build a new one.
    """
    checkpoint = load_resolved(str(resume), run.config.checkpoint_dir or ".")
    path = checkpoint.path
    info, file = checkpoint.trainer, path / "trainer.json"
    mine = {"model": model_description(run.model), "optimizer": run.optimizer.to_dict()}
    _resume.check_same_run(path, info, mine)
    state = {f"model.{k}": v for k, v in checkpoint.model.items()}
    state.update({f"optimizer.{k}": v for k, v in checkpoint.optimizer.items()})
    _resume.check_tensors(path, state, run.backend.state_dict())
    point = _resume.read_resume_point(info, file, run.batches_per_epoch)
    step_history = _read_step_history(info, file, point.step)
    try:
        run.backend.load_state_dict(state)
        if point.rng is not None:
            rng.set_rng_state(point.rng)
            backend_rng = point.rng.get("backend", {})
            if not isinstance(backend_rng, dict):  # a backend would look keys up in a string
                raise TypeError(f"'rng.backend' must be an object, got {backend_rng!r:.40}")
            run.backend.set_rng_state(backend_rng)
        schedule = None if point.schedule is None else from_dict(point.schedule)
        callbacks = dict(unpack_tensors(point.callbacks, checkpoint.callbacks))
    except Exception as error:  # hostile input: whatever it breaks is the file's fault
        raise CheckpointError(
            f"{file}: cannot be restored ({type(error).__name__}: {error}); it is damaged "
            "or was not written by unitrain — use an earlier checkpoint"
        ) from error
    if schedule is not None and schedule != run.schedule:
        mine["schedule"] = run.schedule.to_dict()
    _resume.warn_other_settings(path, info, mine, dataclasses.asdict(run.config))
    position = TrainState(point.epoch, point.step, point.batch, point.stop_training)
    run.restore_run_state(
        RunState(
            position,
            loss_sum=point.loss_sum,
            loss_count=point.loss_count,
            lr_factor=point.lr_factor,
            skipped_steps=point.skipped_steps,
            history=point.history,
            step_history=step_history,
        )
    )
    return path, callbacks


def _read_step_history(info: dict[str, Any], file: Path, step: int) -> list[dict[str, Any]]:
    """``trainer.json``'s rows of validations by steps, checked (absent: none were made).

    Each row is an object whose ``step`` is an int, in increasing order and not after the
    checkpoint's step: later rows would repeat validations that the resumed run makes again.
    """
    rows = info.get("step_history", [])
    if isinstance(rows, list) and all(isinstance(row, dict) for row in rows):
        steps = [row.get("step") for row in rows]
        ordered = all(type(n) is int for n in steps) and steps == sorted(set(steps))
        if ordered and (not steps or steps[-1] <= step):
            return list(rows)
    raise CheckpointError(
        f"{file}: 'step_history' must be a list of objects with increasing int 'step's up to "
        f"the checkpoint's step ({step}), got {rows!r:.80}; the file is damaged or was not "
        "written by unitrain — use an earlier checkpoint"
    )
