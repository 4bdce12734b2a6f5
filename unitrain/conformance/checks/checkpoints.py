"""checkpoints: canonical state, bit-exact round trips, and loading across backends.

The state dict of a portable model must have exactly the canonical keys, shapes and dtypes
(parameters ``model.layers.{i}.weight|bias``, optimizer slots ``optimizer.<param>.<slot>`` and
``optimizer.step``); saving, loading into a fresh backend and saving again must give the same
bytes; and checkpoints must move between the backend and the numpy reference, which then
continue training within the ``training`` tolerance of each other. That loading is strict
is checked in :mod:`.checkpoints_strict`, the same family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from unitrain import optim
from unitrain.checkpoint import load_checkpoint, save_checkpoint
from unitrain.conformance._context import Context
from unitrain.conformance._probes import copy_state, model_state, upcast
from unitrain.conformance._registry import add_check, check
from unitrain.conformance._training import (
    classifier,
    classifier_data,
    fit,
    latest_checkpoint,
)
from unitrain.conformance.optimizer_cases import OPTIMIZER_CASES


def _one_per_layout() -> dict[str, optim.Optimizer]:
    """The optimizer cases with a state layout of their own (type and slots), by case name:
    each saves under other canonical keys, so each gets its own check; a new optimizer's
    case row brings its check along."""
    chosen: dict[str, optim.Optimizer] = {}
    seen: set[tuple[type, tuple[str, ...]]] = set()
    for name, case in OPTIMIZER_CASES.items():
        layout = (type(case.optimizer), case.optimizer.state_slots)
        if layout not in seen:
            seen.add(layout)
            chosen[name] = case.optimizer
    return chosen


#: One optimizer per state layout, by the name of its case in OPTIMIZER_CASES.
OPTIMIZERS = _one_per_layout()


def trained(ctx: Context, optimizer: optim.Optimizer, updates: int = 3, **fields: Any) -> Any:
    """A fresh backend on the classifier after ``updates`` updates with changing LRs."""
    backend = ctx.make(classifier(), optimizer=optimizer, **fields)
    x, y = classifier_data(ctx)
    for i in range(updates):
        ctx.update(backend, (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8]), 0.05 / (i + 1))
    return backend


def expected_layout(optimizer: optim.Optimizer, dtype: np.dtype) -> dict[str, tuple[Any, ...]]:
    """Canonical key -> (shape, dtype) for the classifier with ``optimizer``."""
    layout: dict[str, tuple[Any, ...]] = {}
    for name, shape in classifier().param_shapes().items():
        layout[f"model.{name}"] = (shape, dtype)
    for name, shape in classifier().param_shapes().items():
        for slot in optimizer.state_slots:
            layout[f"optimizer.{name}.{slot}"] = (shape, dtype)
    layout["optimizer.step"] = ((), np.dtype(np.int64))
    return layout


def _canonical(ctx: Context, optimizer: optim.Optimizer) -> None:
    state = trained(ctx, optimizer).state_dict()
    want = expected_layout(optimizer, ctx.state_dtype)
    ctx.require_equal("state dict keys", sorted(state), sorted(want))
    got = {k: (tuple(np.shape(v)), np.asarray(v).dtype) for k, v in state.items()}
    ctx.require_equal(
        "state dict shapes and dtypes", got, {k: (tuple(s), d) for k, (s, d) in want.items()}
    )
    ctx.require_equal("optimizer.step after 3 updates", int(state["optimizer.step"]), 3)


for _name, _optimizer in OPTIMIZERS.items():

    def _run(ctx: Context, optimizer: optim.Optimizer = _optimizer) -> None:
        _canonical(ctx, optimizer)

    add_check(
        "checkpoints",
        f"canonical_keys_{_name}",
        _run,
        description=f"state dict keys, shapes and dtypes are canonical ({_name})",
        guards="optimizer slots missing, renamed or saved in another dtype or layout",
    )


@check(
    "checkpoints",
    "state_dict_roundtrip",
    guards="state lost or changed by state_dict -> load_state_dict",
)
def state_dict_roundtrip(ctx: Context) -> None:
    """state_dict -> load_state_dict in a fresh backend -> state_dict is bit-identical."""
    for optimizer in (optim.SGD(momentum=0.9, nesterov=True), optim.Adam()):
        first = trained(ctx, optimizer).state_dict()
        fresh = ctx.make(classifier(), optimizer=optimizer, seed=7)
        fresh.load_state_dict(copy_state(first))
        ctx.require_identical(f"round trip ({type(optimizer).__name__})", fresh.state_dict(), first)


@check(
    "checkpoints",
    "save_load_save_identical",
    guards="tensors changed by a save -> load -> save cycle",
)
def save_load_save_identical(ctx: Context) -> None:
    """A checkpoint saved, loaded into a fresh backend and saved again has identical tensors."""
    optimizer = optim.Adam()
    first = fit(
        ctx,
        ctx.make(classifier(), optimizer=optimizer),
        model=classifier(),
        optimizer=optimizer,
        epochs=1,
    )
    path_a = first.save_checkpoint(ctx.path("a"))
    fresh = ctx.make(classifier(), optimizer=optimizer, seed=3)
    second = fit(ctx, fresh, model=classifier(), optimizer=optimizer, epochs=1, resume=path_a)
    path_b = second.save_checkpoint(ctx.path("b"))
    for file in ("model.safetensors", "optimizer.safetensors"):
        same = (path_a / file).read_bytes() == (path_b / file).read_bytes()
        ctx.require(same, f"{file} differs after save -> load -> save")
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    ctx.require_identical(
        "checkpoint tensors", {**a.model, **a.optimizer}, {**b.model, **b.optimizer}
    )


@check(
    "checkpoints",
    "fresh_backend_evaluates_identically",
    guards="state that load_state_dict does not fully restore (evaluation differs)",
)
def fresh_backend_evaluates_identically(ctx: Context) -> None:
    """A fresh backend loaded from a state dict evaluates bit-identically to the original."""
    optimizer = optim.SGD(momentum=0.9)
    original = trained(ctx, optimizer)
    fresh = ctx.make(classifier(), optimizer=optimizer, seed=5)
    fresh.load_state_dict(original.state_dict())
    batch = classifier_data(ctx, 2, 16)
    mine = {k: float(v) for k, v in original.evaluate(batch).items()}
    theirs = {k: float(v) for k, v in fresh.evaluate(batch).items()}
    ctx.require_equal("evaluate after loading", theirs, mine)


@check(
    "checkpoints",
    "fresh_backend_continues_identically",
    guards="optimizer state or counters not restored (training continues differently)",
)
def fresh_backend_continues_identically(ctx: Context) -> None:
    """A fresh backend loaded from a state dict trains on exactly like the original."""
    optimizer = optim.Adam()
    original = trained(ctx, optimizer)
    fresh = ctx.make(classifier(), optimizer=optimizer, seed=5)
    fresh.load_state_dict(original.state_dict())
    x, y = classifier_data(ctx, 3)
    for i in range(3):
        batch = (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8])
        ctx.update(original, batch, 0.01)
        ctx.update(fresh, batch, 0.01)
    if ctx.backend.capabilities.bit_exact_resume:
        ctx.require_identical(
            "state after 3 more updates", fresh.state_dict(), original.state_dict()
        )
    else:
        ctx.compare("state after 3 more updates", fresh.state_dict(), original.state_dict(), "step")


def _reference_dtype(ctx: Context) -> str:
    return "float64" if ctx.dtype == "float64" else "float32"


def _upcast_copy(path: Path, target: Path) -> Path:
    """A copy of checkpoint ``path`` with float tensors in float64, for the float64 oracle.

    The Trainer refuses to resume a checkpoint into another dtype (rightly, for users); the
    oracle continues a float32 checkpoint in float64 from exactly the same numbers.
    """
    loaded = load_checkpoint(path)
    return save_checkpoint(
        target,
        model=upcast(dict(loaded.model)),
        optimizer=upcast(dict(loaded.optimizer)),
        callbacks=upcast(dict(loaded.callbacks)),
        trainer={k: v for k, v in loaded.trainer.items() if k != "format_version"},
    )


def _cross_load(ctx: Context, optimizer: optim.Optimizer, *, from_reference: bool) -> None:
    model = classifier()
    writer = (
        ctx.reference(model, optimizer=optimizer, dtype=_reference_dtype(ctx))
        if from_reference
        else ctx.make(model, optimizer=optimizer)
    )
    first = fit(ctx, writer, model=model, optimizer=optimizer, epochs=2)
    path = first.save_checkpoint(ctx.path("written"))
    ours = fit(
        ctx,
        ctx.make(model, optimizer=optimizer, seed=9),
        model=model,
        optimizer=optimizer,
        epochs=4,
        resume=path,
    )
    oracle = fit(
        ctx,
        ctx.reference(model, optimizer=optimizer),
        model=model,
        optimizer=optimizer,
        epochs=4,
        resume=_upcast_copy(path, ctx.path("float64")),
        dtype="float64",
    )
    for key in ("loss", "val_loss"):
        ctx.compare(
            f"{key} per epoch after loading",
            [r[key] for r in ours.history],
            [r[key] for r in oracle.history],
            "training",
        )
    ctx.compare(
        "final weights",
        model_state(ours.backend.state_dict()),
        model_state(oracle.backend.state_dict()),
        "training",
    )


@check(
    "checkpoints",
    "load_reference_checkpoint_sgd_momentum",
    guards="checkpoints that do not move from the reference (momentum layout, names)",
)
def load_reference_checkpoint_sgd_momentum(ctx: Context) -> None:
    """A checkpoint written by the numpy reference loads and continues within tolerance."""
    _cross_load(ctx, optim.SGD(momentum=0.9), from_reference=True)


@check(
    "checkpoints",
    "load_reference_checkpoint_adam",
    guards="Adam moments or the step count misread from another backend's checkpoint",
)
def load_reference_checkpoint_adam(ctx: Context) -> None:
    """A reference Adam checkpoint (moments and step) loads and continues within tolerance."""
    _cross_load(ctx, optim.Adam(), from_reference=True)


@check(
    "checkpoints",
    "reference_loads_checkpoint",
    guards="a checkpoint layout the reference cannot continue from",
)
def reference_loads_checkpoint(ctx: Context) -> None:
    """The backend's checkpoint loads in the numpy reference, which continues alike."""
    _cross_load(ctx, optim.AdamW(), from_reference=False)


@check(
    "checkpoints",
    "metadata",
    guards="trainer.json without the backend's name, device or versions",
)
def metadata(ctx: Context) -> None:
    """trainer.json records the backend's name, device and versions; files verify."""
    backend = ctx.make(classifier(), optimizer=optim.SGD())
    trainer = fit(
        ctx,
        backend,
        model=classifier(),
        optimizer=optim.SGD(),
        epochs=1,
        checkpoint_dir=str(ctx.path("run")),
        callbacks=[ctx.callback("ModelCheckpoint")(every_n_epochs=1)],
    )
    info = load_checkpoint(latest_checkpoint(ctx.path("run"))).trainer
    ctx.require_equal("backend name", info["backend"]["name"], backend.name)
    ctx.require_equal("backend device", info["backend"]["device"], ctx.device)
    ctx.require_equal("backend versions", info["backend"]["versions"], dict(backend.versions()))
    ctx.require_equal("step", info["step"], trainer.state.step)
