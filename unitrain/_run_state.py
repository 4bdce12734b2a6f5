"""What a checkpoint holds of a Trainer's run, and putting it back.

:func:`snapshot` gathers everything needed to continue exactly where a run stands (weights,
optimizer state, counters, running metrics, schedule, callbacks' states, RNG states,
history); :func:`restore` checks a checkpoint against the Trainer and applies it. The
Trainer calls both; they live here so that ``trainer.py`` is the training loop.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import unitrain
from unitrain import rng
from unitrain._errors import CheckpointError
from unitrain.checkpoint import _resume
from unitrain.checkpoint._discovery import load_resolved
from unitrain.models import AbstractLayer
from unitrain.schedules import from_dict
from unitrain.state import pack_tensors, split_state, unpack_tensors

if TYPE_CHECKING:
    from unitrain.trainer import Trainer

__all__ = ["TrainState", "model_description", "restore", "snapshot"]


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


def model_description(model: Any) -> dict[str, Any]:
    """How a checkpoint names its model: a portable model's spec, or a native model's class."""
    if isinstance(model, AbstractLayer):
        return model.to_dict()
    return {"type": "native", "class": type(model).__qualname__}


def snapshot(trainer: Trainer) -> dict[str, Any]:
    """The state of the run now, as the keyword arguments of ``save_checkpoint``: ``trainer``
    (the trainer.json state), ``model``, ``optimizer`` and ``callbacks`` (arrays)."""
    model, optimizer = split_state(trainer.backend.state_dict())
    loss_sum, count = trainer.running_totals()  # over all workers: resumable on any number
    callback_tensors: dict[str, Any] = {}
    callback_states = pack_tensors(trainer.callbacks.state_dict(), "callbacks", callback_tensors)
    info = {
        **dataclasses.asdict(trainer.state),
        "running": {"loss_sum": loss_sum, "count": count},
        "lr_factor": trainer.lr_factor,
        "skipped_steps": trainer.skipped_steps,
        "schedule": trainer.schedule.to_dict(),
        "optimizer": trainer.optimizer.to_dict(),
        "model": model_description(trainer.model),
        "config": dataclasses.asdict(trainer.config),
        "callbacks": callback_states,
        "history": trainer.history,
        "rng": {**rng.get_rng_state(), "backend": trainer.backend.rng_state()},
        "backend": {
            "name": trainer.backend.name,
            "device": trainer.backend.device,
            "versions": trainer.backend.versions(),
        },
        "unitrain_version": unitrain.__version__,
    }
    return {"trainer": info, "model": model, "optimizer": optimizer, "callbacks": callback_tensors}


def restore(trainer: Trainer, resume: str | Path) -> tuple[Path, dict[str, Any]]:
    """Load a checkpoint into ``trainer`` and its backend; return it and the callbacks' states.

    A checkpoint may come from anyone, so it is checked before it is used (see
    :mod:`unitrain.checkpoint._resume`); every problem is a CheckpointError naming the
    file. A failed resume may leave the Trainer half restored: build a new one.
    """
    checkpoint = load_resolved(str(resume), trainer.config.checkpoint_dir or ".")
    path = checkpoint.path
    info, file = checkpoint.trainer, path / "trainer.json"
    mine = {"model": model_description(trainer.model), "optimizer": trainer.optimizer.to_dict()}
    _resume.check_same_run(path, info, mine)
    state = {f"model.{k}": v for k, v in checkpoint.model.items()}
    state.update({f"optimizer.{k}": v for k, v in checkpoint.optimizer.items()})
    _resume.check_tensors(path, state, trainer.backend.state_dict())
    point = _resume.read_resume_point(info, file, trainer.batches_per_epoch)
    try:
        trainer.backend.load_state_dict(state)
        if point.rng is not None:
            rng.set_rng_state(point.rng)
            backend_rng = point.rng.get("backend", {})
            if not isinstance(backend_rng, dict):  # a backend would look keys up in a string
                raise TypeError(f"'rng.backend' must be an object, got {backend_rng!r:.40}")
            trainer.backend.set_rng_state(backend_rng)
        schedule = None if point.schedule is None else from_dict(point.schedule)
        callbacks = dict(unpack_tensors(point.callbacks, checkpoint.callbacks))
    except Exception as error:  # hostile input: whatever it breaks is the file's fault
        raise CheckpointError(
            f"{file}: cannot be restored ({type(error).__name__}: {error}); it is damaged "
            "or was not written by unitrain — use an earlier checkpoint"
        ) from error
    if schedule is not None and schedule != trainer.schedule:
        mine["schedule"] = trainer.schedule.to_dict()
    _resume.warn_other_settings(path, info, mine, dataclasses.asdict(trainer.config))
    trainer.state = TrainState(point.epoch, point.step, point.batch, point.stop_training)
    trainer._running.reset(point.loss_sum, point.loss_count)
    trainer.lr_factor = point.lr_factor
    trainer._skipped_before = trainer._skipped_reported = point.skipped_steps
    trainer.history = point.history
    trainer._last_lr = trainer.lr
    return path, callbacks
