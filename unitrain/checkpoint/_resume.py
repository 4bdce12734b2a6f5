"""Checks that a loaded checkpoint can continue *this* run, made before anything of it is used.

:func:`~unitrain.checkpoint.load_checkpoint` proves that a checkpoint is intact and well
formed; a checkpoint may still come from someone else, from another model, or from a run
that diverged. The Trainer calls the checks here on resume, and every problem they find is a
:class:`~unitrain.CheckpointError` naming the file and what to do:

- :func:`check_same_run`: the model and the optimizer type must be this run's;
  :func:`warn_other_settings` warns about other optimizer hyperparameters or trajectory
  settings (called last, so that a checkpoint that is refused gets no warning first).
- :func:`check_tensors`: names, shapes and dtypes must be exactly this run's, and floating
  tensors finite.
- :func:`read_resume_point`: every field of ``trainer.json`` the Trainer reads has its type
  and range checked.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from unitrain._errors import CheckpointError, ConfigError
from unitrain.backends.state import check_state

__all__ = [
    "ResumePoint",
    "check_same_run",
    "check_tensors",
    "read_resume_point",
    "warn_other_settings",
]

#: Counters above this are refused: no run gets near it, and larger values would lose
#: precision in the float64 schedule arithmetic done with them.
MAX_COUNT = 2**53
#: Config fields that change the trajectory; resuming with other values warns.
TRAJECTORY_FIELDS = ("batch_size", "grad_accum_steps", "grad_clip_norm", "seed", "dtype")

_DAMAGED = "the trainer state is damaged or was not written by unitrain — use an earlier checkpoint"


class ResumePoint(NamedTuple):
    """The fields of ``trainer.json`` the Trainer continues from, each checked."""

    epoch: int
    step: int
    batch: int
    stop_training: bool
    loss_sum: float
    loss_count: int
    lr_factor: float
    skipped_steps: int
    history: list[dict[str, Any]]
    rng: dict[str, Any] | None
    schedule: Any
    callbacks: dict[str, Any]


def check_same_run(path: Path, info: dict[str, Any], mine: dict[str, dict[str, Any]]) -> None:
    """Refuse a checkpoint of another model or another optimizer type.

    Args:
        path: the checkpoint directory, for messages.
        info: its trainer state.
        mine: this run's ``{"model": description, "optimizer": description}``.
    """
    file = path / "trainer.json"
    for what in ("model", "optimizer"):
        theirs = _typed(info, what, dict, file, None)
        if theirs is not None and (
            theirs.get("type") != mine[what].get("type")
            or (what == "model" and _current_form(theirs) != mine[what])
        ):
            raise CheckpointError(
                f"{path}: written for {what} {theirs!r:.300}, but this run uses {mine[what]}; "
                f"resume with the same {what}, or start a new run"
            )
    _typed(info, "config", dict, file, {})


def _current_form(model: dict[str, Any]) -> dict[str, Any]:
    """A model description as this version writes it: a layer that gained an option since
    the checkpoint was written (``bias``, ``dilation``, ...) writes its default now, and the
    checkpoint's description, without it, is the same model. Anything that does not rebuild
    (a native model's description, a layer from a package not imported) is compared as is."""
    from unitrain.models import model_from_dict

    try:
        return model_from_dict(model).to_dict()
    except Exception:  # not a portable description (a native model): compare the raw dicts
        return model


def warn_other_settings(
    path: Path, info: dict[str, Any], mine: dict[str, dict[str, Any]], config: dict[str, Any]
) -> None:
    """Warn when the optimizer's hyperparameters, the schedule or trajectory settings differ.

    Args:
        path: the checkpoint directory, for messages.
        info: its trainer state, already checked by :func:`check_same_run`.
        mine: this run's ``{"model": ..., "optimizer": ...}`` descriptions, and ``"schedule"``
            when the caller found that its schedule differs from the saved one.
        config: this run's ``TrainerConfig`` as a dict.
    """
    saved = info.get("config", {})
    changed = [
        f"{name}={saved[name]!r:.40} -> {config[name]!r}"
        for name in TRAJECTORY_FIELDS
        if name in saved and saved[name] != config[name]
    ]
    for what in ("optimizer", "schedule"):
        if what in mine and what in info and info[what] != mine[what]:
            changed.append(f"{what} {info[what]} -> {mine[what]}")
    if changed:
        warnings.warn(
            f"{path} was written by a run with other settings ({'; '.join(changed)}); this run "
            "continues with its own, so it will not equal an uninterrupted run",
            stacklevel=5,
        )


def check_tensors(path: Path, state: dict[str, np.ndarray], expected: dict[str, Any]) -> None:
    """Refuse loaded tensors that do not fit this run: names, shapes, dtypes, NaN or Inf.

    Floating tensors must have exactly the dtype this run keeps them in (a float16 or float64
    checkpoint is another run's, not a rounding of this one) and be finite: updates with a
    non-finite gradient are skipped, so NaN weights mean a damaged file or a diverged run.
    Integer tensors (the update counter) must be integers >= 0.

    Args:
        path: the checkpoint directory, for messages.
        state: the loaded ``model.*`` and ``optimizer.*`` tensors.
        expected: this run's own state (``backend.state_dict()``).
    """
    try:
        check_state(expected, state)
    except ConfigError as error:
        raise CheckpointError(f"{path}: {error}") from None
    for key, reference in expected.items():
        kind, _, name = key.partition(".")
        file = path / f"{kind}.safetensors"
        want, got = np.asarray(reference).dtype, state[key]
        if (want.kind == "f" and got.dtype != want) or (
            want.kind in "iu" and got.dtype.kind not in "iu"
        ):
            raise CheckpointError(
                f"{file}: tensor {name!r} has dtype {got.dtype}, but this run keeps it in "
                f"{want}; resume with the dtype the checkpoint was trained in "
                "(TrainerConfig(dtype=...)), or start a new run"
            )
        if got.dtype.kind == "f" and not np.isfinite(got).all():
            bad = int(np.count_nonzero(~np.isfinite(got)))
            raise CheckpointError(
                f"{file}: tensor {name!r} holds {bad} NaN or infinite values; the run had "
                "diverged or the file was edited — resume from an earlier checkpoint"
            )
        if got.dtype.kind == "i" and (got < 0).any():
            raise CheckpointError(f"{file}: tensor {name!r} must be >= 0; {_DAMAGED}")


def read_resume_point(info: dict[str, Any], file: Path, batches_per_epoch: int) -> ResumePoint:
    """Check and return the fields of ``trainer.json`` that the Trainer continues from.

    Args:
        info: the trainer state, as loaded.
        file: its path, for messages.
        batches_per_epoch: batches in one epoch of this run's data (0 when unknown); a
            checkpoint written at a later batch came from other data or another batch size.
    """
    batch = _count(info, "batch", file)
    if batches_per_epoch and batch > batches_per_epoch:
        raise CheckpointError(
            f"{file}: written at batch {batch} of an epoch, but this data has "
            f"{batches_per_epoch} batches per epoch; resume with the data and batch_size the "
            "run was started with"
        )
    running = _typed(info, "running", dict, file, {})
    history = _typed(info, "history", list, file, [])
    if not all(isinstance(row, dict) for row in history):
        raise CheckpointError(f"{file}: 'history' must be a list of objects; {_DAMAGED}")
    # Row i of a run's history is the i-th finished epoch, numbered from 1, so the rows end at
    # the checkpoint's count of finished epochs (each history row is one epoch's console line).
    epoch = _count(info, "epoch", file)
    numbers = [row.get("epoch") for row in history]
    first = epoch - len(numbers) + 1
    if first < 1 or any(type(n) is not int or n != first + i for i, n in enumerate(numbers)):
        raise CheckpointError(
            f"{file}: 'history' must hold one row per finished epoch, numbered consecutively "
            f"up to the checkpoint's 'epoch' ({epoch}), got {numbers!r:.80}; {_DAMAGED}"
        )
    skipped = _count(info, "skipped_steps", file)
    return ResumePoint(
        epoch=epoch,
        step=_count(info, "step", file),
        batch=batch,
        stop_training=_typed(info, "stop_training", bool, file, False),
        loss_sum=_real(running, "loss_sum", file, 0.0, finite=False),
        loss_count=_count(running, "count", file),
        lr_factor=_real(info, "lr_factor", file, 1.0, finite=True),
        skipped_steps=skipped,
        history=history,
        rng=_typed(info, "rng", dict, file, None),
        schedule=info.get("schedule"),
        callbacks=_typed(info, "callbacks", dict, file, {}),
    )


def _typed(info: dict[str, Any], key: str, kind: type, file: Path, default: Any) -> Any:
    """``info[key]`` (``default`` when absent), refused unless exactly of type ``kind``."""
    if key not in info:
        return default
    value = info[key]
    if type(value) is not kind:
        raise CheckpointError(
            f"{file}: {key!r} must be a {kind.__name__}, got {value!r:.80}; {_DAMAGED}"
        )
    return value


def _count(info: dict[str, Any], key: str, file: Path) -> int:
    value = info.get(key, 0)
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise CheckpointError(
            f"{file}: {key!r} must be an int in [0, 2**53], got {value!r:.80}; {_DAMAGED}"
        )
    return value


def _real(info: dict[str, Any], key: str, file: Path, default: float, *, finite: bool) -> float:
    """A number; with ``finite``, also finite and >= 0 (a running loss sum may be NaN)."""
    value = info.get(key, default)
    valid = type(value) in (int, float)
    if valid:
        try:
            value = float(value)
        except OverflowError:  # an int beyond float range
            valid = False
    if not valid or (finite and not (math.isfinite(value) and value >= 0)):
        wanted = "a finite number >= 0" if finite else "a number"
        raise CheckpointError(f"{file}: {key!r} must be {wanted}, got {value!r:.80}; {_DAMAGED}")
    return float(value)
