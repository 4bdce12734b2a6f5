"""early_stopping: scripted metric sequences give the reference's stop and best epochs.

The metric is scripted *through the backend*: a one-layer MSE model with zero weights and
learning rate 0 evaluates a validation batch ``(0, d)`` to exactly ``d**2``. With ``d`` a
multiple of 1/4 up to 3, every value is exact in every float format, so the sequence the
callback sees is the script, bit for bit, on every backend, and the stop epoch and best
epoch must equal the reference's exactly. hypothesis draws sequences, patience, min_delta
(including values that make improvements land exactly on the threshold), baselines (also
with ``min_delta``, which Keras applies to the baseline too) and warm-up epochs. Restoring
the best weights is checked when training stops early and when it runs to its last epoch.
A backend that ships its own ``EarlyStopping`` (declared in ``conformance_callbacks``) is
checked instead of the core's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from unitrain import optim, schedules
from unitrain.conformance._context import Context
from unitrain.conformance._hypothesis import explore
from unitrain.conformance._probes import model_state, with_zeros
from unitrain.conformance._registry import check
from unitrain.models import MLP

MODEL = MLP((2, 1))


class ScriptedValidation:
    """Validation data that is the single batch ``(0, values[epoch])`` during ``epoch``.

    It is also a callback (``on_epoch_begin``) that tells it the epoch, so extra passes over
    the validation data (a Trainer may evaluate once up front to learn the metric names)
    read the current epoch's value instead of shifting the script.
    """

    def __init__(self, values: Sequence[float], host: Any) -> None:
        self.values, self.host, self.epoch = list(values), host, 0

    def on_epoch_begin(self, trainer: Any, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        value = self.values[min(self.epoch, len(self.values) - 1)]
        yield self.host(np.zeros((1, 2))), self.host(np.full((1, 1), value))


def _stop_run(ctx: Context, backend: Any, stopper: Any, example: dict[str, Any]) -> Any:
    backend.load_state_dict(with_zeros(backend.state_dict()))
    script = ScriptedValidation([k / 4 for k in example["script"]], ctx.host)
    trainer = ctx.trainer(
        MODEL,
        backend,
        loss="mse",
        optimizer=optim.SGD(),
        schedule=schedules.Constant(0.0),
        callbacks=[script, stopper],
        config={"epochs": len(script.values), "batch_size": 1, "log_every_n_steps": 10**6},
    )
    trainer.fit([(ctx.host(np.zeros((1, 2))), ctx.host(np.zeros((1, 1))))], script)
    seen = [row["val_loss"] for row in trainer.history]
    return len(trainer.history), getattr(stopper, "best_epoch", None), seen


def _decisions(ctx: Context, example: dict[str, Any]) -> None:
    arguments = {k: v for k, v in example.items() if k != "script"}
    ours = _stop_run(
        ctx,
        ctx.make(MODEL, loss="mse", optimizer=optim.SGD()),
        ctx.callback("EarlyStopping")("val_loss", **arguments),
        example,
    )
    from unitrain.callbacks import EarlyStopping  # the reference runs the core's callback

    theirs = _stop_run(
        ctx,
        ctx.reference(MODEL, loss="mse", optimizer=optim.SGD()),
        EarlyStopping("val_loss", **arguments),
        example,
    )
    ctx.require_equal("epochs trained (stop epoch + 1)", ours[0], theirs[0])
    ctx.require_equal("best epoch", ours[1], theirs[1])
    ctx.require_equal("metric sequence seen by the callback", ours[2], theirs[2])


def _script(max_len: int = 9) -> Any:
    from hypothesis import strategies as st

    return st.lists(st.integers(0, 12), min_size=2, max_size=max_len)


def _strategy(**fields: Any) -> Any:
    def make() -> Any:
        from hypothesis import strategies as st

        base = {"script": _script(), "patience": st.integers(0, 3)}
        base.update({k: v() if callable(v) else st.just(v) for k, v in fields.items()})
        return st.fixed_dictionaries(base)

    return make


def _deltas() -> Any:
    from hypothesis import strategies as st

    return st.sampled_from([0.0, 1 / 16, 3 / 16, 5 / 16, 7 / 16, 1.0, 2.0])


@check(
    "early_stopping",
    "scripted_min_mode",
    guards="another improvement test or stop rule in min mode",
)
def scripted_min_mode(ctx: Context) -> None:
    """mode='min': same stop and best epochs as the reference for scripted sequences."""
    explicit = [
        {"script": [8, 6, 6, 7, 5, 9, 9], "patience": 1, "mode": "min"},
        {"script": [4, 4, 4, 4], "patience": 0, "mode": "min"},
    ]
    explore(ctx, lambda e: _decisions(ctx, e), strategy=_strategy(mode="min"), explicit=explicit)


@check(
    "early_stopping",
    "scripted_max_mode",
    guards="another improvement test or stop rule in max mode",
)
def scripted_max_mode(ctx: Context) -> None:
    """mode='max': same stop and best epochs as the reference."""
    explicit = [{"script": [2, 5, 5, 4, 6, 1, 1], "patience": 1, "mode": "max"}]
    explore(ctx, lambda e: _decisions(ctx, e), strategy=_strategy(mode="max"), explicit=explicit)


@check(
    "early_stopping",
    "scripted_min_delta",
    guards="min_delta's sign flipped, or an improvement of exactly min_delta counted",
)
def scripted_min_delta(ctx: Context) -> None:
    """min_delta: an improvement of exactly min_delta does not count; plateaus stop."""
    explicit = [
        {"script": [4, 4, 4, 4, 4], "patience": 1, "min_delta": 1 / 16, "mode": "min"},
        {"script": [4, 3, 3, 3, 2], "patience": 1, "min_delta": 7 / 16, "mode": "min"},
        {"script": [3, 4, 4, 4, 5], "patience": 1, "min_delta": 7 / 16, "mode": "max"},
    ]
    strategy = _strategy(min_delta=_deltas, mode="min")
    explore(ctx, lambda e: _decisions(ctx, e), strategy=strategy, explicit=explicit)


@check(
    "early_stopping",
    "scripted_baseline",
    guards="waiting reset by values that do not beat the baseline",
)
def scripted_baseline(ctx: Context) -> None:
    """baseline: waiting resets only on values that beat the baseline."""
    from_baseline = lambda: _floats_from(range(0, 13))  # noqa: E731
    explicit = [{"script": [6, 5, 4, 4, 3, 3, 3], "patience": 2, "baseline": 9 / 16, "mode": "min"}]
    strategy = _strategy(baseline=from_baseline, mode="min")
    explore(ctx, lambda e: _decisions(ctx, e), strategy=strategy, explicit=explicit)


@check(
    "early_stopping",
    "scripted_baseline_min_delta",
    guards="the baseline compared without min_delta (Keras applies it)",
)
def scripted_baseline_min_delta(ctx: Context) -> None:
    """baseline with min_delta: a value must beat the baseline by more than min_delta."""
    explicit: list[dict[str, Any]] = [
        # 9/16 beats the baseline 10/16 but not by min_delta 2/16: waiting goes on.
        {"script": [4, 3, 3, 3, 3], "patience": 2, "baseline": 10 / 16, "min_delta": 2 / 16},
        {"script": [2, 3, 3, 3, 3], "patience": 2, "baseline": 17 / 32, "min_delta": 1 / 16},
    ]
    explicit = [{**e, "mode": "min" if e["script"][0] > 3 else "max"} for e in explicit]
    from_baseline = lambda: _floats_from(range(0, 13))  # noqa: E731
    strategy = _strategy(baseline=from_baseline, min_delta=_deltas, mode="min")
    explore(ctx, lambda e: _decisions(ctx, e), strategy=strategy, explicit=explicit)


@check(
    "early_stopping",
    "scripted_start_from_epoch",
    guards="warm-up epochs counted",
)
def scripted_start_from_epoch(ctx: Context) -> None:
    """start_from_epoch: the first epochs are ignored."""
    explicit = [{"script": [1, 2, 3, 3, 3, 3], "patience": 1, "start_from_epoch": 2, "mode": "min"}]

    def start() -> Any:
        from hypothesis import strategies as st

        return st.integers(0, 3)

    strategy = _strategy(start_from_epoch=start, mode="min")
    explore(ctx, lambda e: _decisions(ctx, e), strategy=strategy, explicit=explicit)


def _floats_from(ks: range) -> Any:
    from hypothesis import strategies as st

    return st.sampled_from([k * k / 16 for k in ks])


class _Recorder:
    """Keeps the model weights at every epoch end."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.weights: list[dict[str, np.ndarray]] = []

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
        self.weights.append(model_state(self.backend.state_dict()))


def _restore_run(
    ctx: Context, backend: Any, stopper: Any, script: Sequence[float]
) -> tuple[int, Any, int | None]:
    """Train with ``script`` as the validation metric; return the epochs trained, the best
    epoch, and the epoch whose end-of-epoch weights the final weights equal (None: none)."""
    recorder = _Recorder(backend)
    values = ScriptedValidation(script, ctx.host)
    rng = np.random.default_rng(0x5EED)
    x, y = ctx.host(rng.normal(size=(16, 2))), ctx.host(rng.normal(size=(16, 1)))
    trainer = ctx.trainer(
        MODEL,
        backend,
        loss="mse",
        optimizer=optim.SGD(momentum=0.5),
        schedule=schedules.Constant(0.05),
        callbacks=[values, stopper, recorder],
        config={"epochs": len(script), "batch_size": 4, "log_every_n_steps": 10**6},
    )
    trainer.fit((x, y), values)
    final = model_state(backend.state_dict())
    same = lambda a, b: all(a[k].tobytes() == b[k].tobytes() for k in b)  # noqa: E731
    restored = [epoch for epoch, weights in enumerate(recorder.weights) if same(final, weights)]
    return len(trainer.history), getattr(stopper, "best_epoch", None), min(restored, default=None)


def _restores(ctx: Context, script: Sequence[float], patience: int) -> None:
    from unitrain.callbacks import EarlyStopping  # the reference runs the core's callback

    arguments: dict[str, Any] = {"patience": patience, "restore_best_weights": True}
    ours = _restore_run(
        ctx,
        ctx.make(MODEL, loss="mse", optimizer=optim.SGD(momentum=0.5)),
        ctx.callback("EarlyStopping")("val_loss", **arguments),
        script,
    )
    theirs = _restore_run(
        ctx,
        ctx.reference(MODEL, loss="mse", optimizer=optim.SGD(momentum=0.5)),
        EarlyStopping("val_loss", **arguments),
        script,
    )
    ctx.require_equal("epochs trained", ours[0], theirs[0])
    ctx.require_equal("best epoch", ours[1], theirs[1])
    ctx.require(theirs[2] is not None, "the reference restored no epoch's weights")
    ctx.require_equal("epoch whose weights the run ended with", ours[2], theirs[2])


@check(
    "early_stopping",
    "restore_best_weights",
    guards="other weights restored than the best epoch's",
)
def restore_best_weights(ctx: Context) -> None:
    """restore_best_weights puts back exactly the best epoch's weights (same best epoch)."""
    _restores(ctx, [5, 3, 4, 2, 6, 6, 6, 6], patience=2)


@check(
    "early_stopping",
    "restore_best_weights_full_run",
    guards="best weights restored only when training stopped early",
)
def restore_best_weights_full_run(ctx: Context) -> None:
    """restore_best_weights also restores when training runs to its last epoch (no stop)."""
    _restores(ctx, [5, 3, 4, 2, 6, 6], patience=10)
