"""dropout: train-mode dropout is inverted and draws a fresh mask per update and micro-batch.

The probe reads a backend's dropped hidden layer through the public protocol.
``MLP((4, 32, 1), sigmoid, dropout=p)`` with its output layer's weights and bias set to zero
outputs 0 whatever the mask, so with the target ``-1/2`` and mean squared error the gradient
of the output is exactly 1 and the gradient of hidden unit ``j``'s output weight is that
unit's value after dropout, ``h_j``. One plain SGD update at learning rate 1 then leaves
``-h`` in the output weights (and ``-1`` in the output bias, which confirms the premise);
the zero output weights keep every gradient away from the first layer, which never moves.

Sigmoid units are never 0, so a 0 is a dropped unit, and a kept one must be
``a_j / (1 - p)`` (inverted dropout, so that evaluation needs no rescaling) where ``a_j`` is
the float64 reference's activation at the same weights, read the same way with dropout off.
The mask's randomness is judged by exact outcomes: two independent masks of 32 units with
``p = 1/4`` coincide with probability ``0.625**32 < 1e-6``, and the drop rate over 256 draws
is held to a band 4.6 standard deviations wide.

Masks are keyed by ``(seed, step, micro_batch)``: the numbers the caller passes, else the
backend's own count (from the loaded optimizer step). ``keyed_by_the_callers_numbers`` checks
that the numbers passed win, which is what keeps a resumed run's masks and needs no counter
in the backend.

Under the default ``BackendOptions.random="portable"`` every backend draws its masks from
:mod:`unitrain.ops.random` (the pass's key ``stream_key(seed, step, micro_batch)``, one key
per dropout site), so ``portable_masks`` holds them to the float64 reference's masks bit for
bit, in every dtype: the decision compares integer bits, never a rounded uniform number.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.backends.numbering import NumberedCalls
from unitrain.conformance._context import Context
from unitrain.conformance._probes import upcast
from unitrain.conformance._registry import check
from unitrain.models import MLP

RATE = 0.25
UPDATES = 8
_HIDDEN = 32
#: The dropped fraction of 256 draws must lie in this band (mean 0.25, sd 0.027).
_RATE_BAND = (0.125, 0.375)


def _model(dropout: float) -> MLP:
    return MLP((4, _HIDDEN, 1), activation="sigmoid", dropout=dropout)


class _Probe:
    """A backend under the probe's state, and the reference's activations at that state."""

    def __init__(self, ctx: Context, backend: Any = None) -> None:
        self.ctx = ctx
        self.backend = backend or ctx.make(_model(RATE), loss="mse", optimizer=optim.SGD())
        start = self.backend.state_dict()
        for name in ("model.layers.1.weight", "model.layers.1.bias"):
            start[name] = np.zeros_like(start[name])
        self.start = start
        rng = np.random.default_rng(0xD50)
        self.batch = (ctx.host(rng.normal(0.0, 1.0, (1, 4))), ctx.host([[-0.5]]))
        reference = ctx.reference(_model(0.0), loss="mse", optimizer=optim.SGD())
        reference.load_state_dict(upcast(start))
        reference_batch = tuple(np.asarray(b, np.float64) for b in self.batch)
        self.activations = self._read(
            reference, lambda: Context.update(reference, reference_batch, 1.0)
        )

    def _read(self, backend: Any, update: Any) -> np.ndarray:
        update()
        state = backend.state_dict()
        bias = float(np.asarray(state["model.layers.1.bias"], np.float64)[0])
        self.ctx.require(
            bias == -1.0,
            f"the dropout probe's output bias moved to {bias!r}, not -1: with zero output "
            "weights the output must be 0 and the MSE gradient exactly 1",
        )
        return -np.asarray(state["model.layers.1.weight"], np.float64)[:, 0]

    def hidden(self, step: int, micro_batches: int = 1) -> np.ndarray:
        """The dropped hidden layer (summed over micro-batches, each weighted equally) of
        one update made at update counter ``step`` (the backend's own count)."""
        self._load(step)
        if micro_batches == 1:
            return self._read(self.backend, lambda: self.ctx.update(self.backend, self.batch, 1.0))

        def accumulate() -> None:
            for _ in range(micro_batches):
                self.backend.forward(self.batch)
                self.backend.backward(1.0 / micro_batches)
            self.backend.step(1.0)

        return self._read(self.backend, accumulate)

    def numbered(self, calls: NumberedCalls, step: int, micro_batch: int) -> np.ndarray:
        """The dropped hidden layer of one forward given ``step`` and ``micro_batch``, the
        backend's own count pointing elsewhere (the optimizer step loaded is ``step + 7``)."""
        self._load(step + 7)

        def update() -> None:
            calls.forward(self.batch, step=step, micro_batch=micro_batch)
            self.backend.backward(1.0)
            self.backend.step(1.0)

        return self._read(self.backend, update)

    def _load(self, step: int) -> None:
        state = dict(self.start)
        state["optimizer.step"] = np.asarray(step, np.int64)
        self.backend.load_state_dict(state)

    def levels(self, hidden: np.ndarray, what: str, allowed: tuple[float, ...]) -> np.ndarray:
        """Each unit's value as a fraction of ``a / (1 - p)``, snapped to ``allowed``; fails
        unless every unit is within the ``evaluate`` tolerance of an allowed level."""
        full = self.activations / (1.0 - RATE)
        fraction = hidden / full
        snapped = np.asarray(allowed)[np.argmin(np.abs(fraction[:, None] - allowed), axis=1)]
        self.ctx.compare(what, hidden, snapped * full, "evaluate")
        return snapped


@check(
    "dropout",
    "inverted_scaling",
    guards="dropout without the 1/(1-p) scaling, or the drop and keep rates swapped",
)
def inverted_scaling(ctx: Context) -> None:
    """Kept units are scaled by 1/(1-p) in training and dropped ones are 0, at rate p."""
    probe = _Probe(ctx)
    levels = np.concatenate(
        [
            probe.levels(probe.hidden(step), f"hidden units of update {step}", (0.0, 1.0))
            for step in range(UPDATES)
        ]
    )
    dropped = float(np.mean(levels == 0.0))
    low, high = _RATE_BAND
    ctx.require(
        low <= dropped <= high,
        f"{dropped:.3f} of {levels.size} hidden units were dropped with dropout p={RATE}; "
        f"a correct backend drops between {low} and {high} of them",
    )


@check(
    "dropout",
    "new_mask_each_update",
    guards="a dropout mask that does not change from update to update",
)
def new_mask_each_update(ctx: Context) -> None:
    """Each update draws a new dropout mask (same batch and weights, different masks)."""
    probe = _Probe(ctx)
    masks = [probe.hidden(step) != 0.0 for step in range(UPDATES)]
    for step in range(1, UPDATES):
        ctx.require(
            bool(np.any(masks[step] != masks[step - 1])),
            f"updates {step - 1} and {step} dropped exactly the same {_HIDDEN} hidden units: "
            "the dropout mask must change from update to update (derive it from the seed, "
            "the update counter and the micro-batch)",
        )


@check(
    "dropout",
    "new_mask_each_micro_batch",
    guards="one dropout mask shared by the micro-batches of an update",
)
def new_mask_each_micro_batch(ctx: Context) -> None:
    """The micro-batches of one accumulated update draw different dropout masks."""
    probe = _Probe(ctx)
    for step in range(4):
        levels = probe.levels(
            probe.hidden(step, micro_batches=2),
            f"hidden units summed over 2 micro-batches of update {step}",
            (0.0, 0.5, 1.0),
        )
        ctx.require(
            bool(np.any(levels == 0.5)),
            f"the 2 micro-batches of update {step} dropped exactly the same hidden units: each "
            "micro-batch of an accumulated update must draw its own dropout mask",
        )


@check(
    "dropout",
    "keyed_by_the_callers_numbers",
    guards="dropout keyed by the backend's own counter instead of the step and micro_batch "
    "its caller passes (a resumed run, or one after a skipped update, then draws other masks)",
)
def keyed_by_the_callers_numbers(ctx: Context) -> None:
    """A forward draws the mask of the step and micro-batch it is given, not its own count's.

    The backend's own count is put elsewhere (the optimizer step loaded is ``step + 7``), so
    only a backend that keys by the numbers passed draws the masks of update ``step``."""
    probe = _Probe(ctx)
    calls = NumberedCalls(probe.backend)
    if calls.old_form:
        ctx.skip(
            "forward() takes no step and micro_batch (the old form, driven without them until "
            "unitrain 0.4): the backend keys dropout by its own count"
        )
    for step in (2, 5):
        own = probe.hidden(step) != 0.0
        passed = probe.numbered(calls, step, 0) != 0.0
        ctx.require(
            bool(np.array_equal(own, passed)),
            f"forward(step={step}, micro_batch=0) with the optimizer step at {step + 7} dropped "
            f"other units than update {step} counted by the backend: key dropout by the step "
            "the caller passes",
        )
    together = probe.levels(
        probe.hidden(3, micro_batches=2),
        "hidden units summed over 2 micro-batches of update 3",
        (0.0, 0.5, 1.0),
    )
    first, second = (probe.numbered(calls, 3, m) != 0.0 for m in (0, 1))
    ctx.require(
        bool(np.array_equal(together, (first + second.astype(float)) / 2)),
        "forwards given micro_batch=0 and micro_batch=1 of update 3 did not draw the masks of "
        "that update's two micro-batches: key dropout by the micro_batch the caller passes",
    )


#: ``(step, micro_batch)`` of the masks ``portable_masks`` compares: consecutive updates, a
#: second micro-batch, and a step past 2**16 (every bit of the numbers counts).
_NUMBERED = ((0, 0), (1, 0), (1, 1), (6, 3), (70_001, 2))


@check(
    "dropout",
    "portable_masks",
    guards="dropout masks that differ from the portable generator's (a native generator by "
    "default, a key folded from other numbers, a mask decided on a rounded uniform draw)",
)
def portable_masks(ctx: Context) -> None:
    """Dropout masks are the float64 reference's, bit for bit, under random="portable".

    The default generator: for the same ``(seed, step, micro_batch)`` every backend drops
    the same units, whatever its dtype."""
    probe = _Probe(ctx)
    calls = NumberedCalls(probe.backend)
    if calls.old_form:
        ctx.skip(
            "forward() takes no step and micro_batch (the old form, driven without them until "
            "unitrain 0.4): its masks cannot be asked for by their numbers"
        )
    reference = ctx.reference(_model(RATE), loss="mse", optimizer=optim.SGD())
    oracle = _Probe(ctx, reference)
    oracle.start = upcast(probe.start)
    oracle.batch = (np.asarray(probe.batch[0], np.float64), np.asarray(probe.batch[1], np.float64))
    for step, micro_batch in _NUMBERED:
        mask = probe.numbered(calls, step, micro_batch) != 0.0
        expected = oracle.numbered(NumberedCalls(reference), step, micro_batch) != 0.0
        ctx.require(
            bool(np.array_equal(mask, expected)),
            f"forward(step={step}, micro_batch={micro_batch}) dropped units "
            f"{np.flatnonzero(~mask).tolist()}, the reference "
            f"{np.flatnonzero(~expected).tolist()}: under random='portable' a backend draws "
            "each dropout site's mask as ops.random.bernoulli(site key, 1 - p, shape), the site "
            "key folded from ops.random.stream_key(seed, step, micro_batch) (see "
            "unitrain.models' Scope)",
        )
