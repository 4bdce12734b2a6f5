"""layers: every portable layer computes what the float64 reference computes.

One check per case of the layer table (``_layer_cases.LAYER_CASES``), measured through the
public protocol only. The model is the layer behind a *probe* layer that sees its input
gradient: a 1x1 ``Conv2d`` for images, a ``Linear`` for the rest (token models take the layer
alone: ids have no gradient). With mean squared error against random targets:

- the ``evaluate`` loss at the initial weights checks the output;
- the parameters after one plain SGD update check every parameter gradient, and the probe's
  weight gradient (its input times the layer's input gradient) checks the input gradient.
  The learning rate makes the update as large as the parameters, so a gradient error shows
  at full size instead of being hidden under the weights;
- BatchNorm's running statistics after that update check the state.

The reference starts from the backend's own initial values (rounded to its dtype), so only
the computation differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._layer_cases import LAYER_CASES, layer_input
from unitrain.conformance._probes import model_state, upcast
from unitrain.conformance._registry import add_check
from unitrain.models import AbstractLayer, Conv2d, Linear, Sequential


def probed(layer: AbstractLayer, shape: tuple[int, ...]) -> AbstractLayer:
    """``layer`` behind a probe whose weight gradient carries the layer's input gradient."""
    if layer.input_kind == "tokens":
        return layer
    width = shape[-1]
    probe = Conv2d(width, width, 1) if len(shape) == 4 else Linear(width, width)
    return Sequential((probe, layer))


def _batch(ctx: Context, model: AbstractLayer, shape: tuple[int, ...]) -> tuple[Any, Any]:
    x = layer_input(model, shape, seed=1)
    if model.input_kind != "tokens":
        x = ctx.host(x)
    targets = np.random.default_rng(2).standard_normal((shape[0], *model.output_shape(shape[1:])))
    return x, ctx.host(targets)


def _params(state: dict[str, np.ndarray], model: AbstractLayer) -> dict[str, np.ndarray]:
    return {k: state[f"model.{k}"] for k in model.param_shapes()}


def check_layer(ctx: Context, layer: AbstractLayer, shape: tuple[int, ...]) -> None:
    """Output, input gradient, parameter gradients and state of ``layer`` vs the reference."""
    model = probed(layer, shape)
    batch = _batch(ctx, model, shape)
    backend = ctx.make(model, loss="mse", optimizer=optim.SGD())
    start = upcast(model_state(backend.state_dict()))

    def reference() -> Any:
        ref = ctx.reference(model, loss="mse", optimizer=optim.SGD())
        ref.load_state_dict({**ref.state_dict(), **start})
        return ref

    ours, theirs = (
        float(backend.evaluate(batch)["loss"]),
        float(reference().evaluate(batch)["loss"]),
    )
    ctx.compare("evaluate loss (the layer's output)", ours, theirs, "evaluate")

    probe = reference()  # the reference gradient sets the learning rate
    probe.forward(batch)
    probe.backward()
    gradient = dict(probe.grads)
    params = _params(start, model)
    size = np.sqrt(sum(float(np.vdot(v, v)) for v in params.values()))
    norm = np.sqrt(sum(float(np.vdot(g, g)) for g in gradient.values()))
    lr = size / norm if norm > 0 else 1.0

    ref = reference()
    ctx.update(ref, batch, lr)
    ctx.update(backend, batch, lr)
    after, expected = backend.state_dict(), ref.state_dict()
    ctx.compare(
        "parameters after one update (parameter and input gradients)",
        _params(after, model),
        _params(expected, model),
        "step",
    )
    statistics = [f"model.{k}" for k in model.state_shapes()]
    if statistics:
        ctx.compare(
            "model state after one update",
            {k: after[k] for k in statistics},
            {k: expected[k] for k in statistics},
            "step",
        )


def _register() -> None:
    for name, layer, shape in LAYER_CASES:

        def run(ctx: Context, layer: AbstractLayer = layer, shape: tuple[int, ...] = shape) -> None:
            check_layer(ctx, layer, shape)

        run.__qualname__ = f"layers_{name}"
        description = f"{layer.describe()}: output and gradients"
        guards = (
            f"{layer.describe()} computed with another convention (padding, eps, layout, weight "
            "packing) or a wrong gradient"
        )
        add_check(
            "layers",
            name,
            run,
            requires=("portable_layers",),
            description=description,
            guards=guards,
        )


_register()
