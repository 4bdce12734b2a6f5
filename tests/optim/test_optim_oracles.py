"""The reference optimizers against torch.optim and optax directly, on identical inputs.

Every backend is held to :func:`unitrain.optim.apply_update`; this file holds that reference
to the two libraries whose formulas it claims: the same float64 parameters, gradients and
learning rates (changing at every update, which separates the conventions) go through
``torch.optim.SGD / Adam / AdamW / RMSprop / Adadelta / Adagrad`` (with torch's own param
groups for the rows with parameter groups) and through optax's own transforms (``trace``,
``scale_by_adam``, ``scale_by_rms``, ``scale_by_lion``, ``add_decayed_weights``, with the
learning rate applied per update as ``optax.sgd`` and ``optax.adamw`` apply it), and the
parameters after 40 updates must agree to float64 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from unitrain import optim
from unitrain.conformance.optimizer_cases import OPTIMIZER_CASES

STEPS = 40
#: Named as a one-layer MLP's parameters, which the cases' group patterns select.
SHAPES = {"layers.0.weight": (5, 3), "layers.0.bias": (3,)}

#: The kit's optimizer cases, by the kit's names (unitrain.conformance.optimizer_cases).
OPTIMIZERS = {name: case.optimizer for name, case in OPTIMIZER_CASES.items()}


def inputs(seed: int = 0) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]], list[float]]:
    """Initial parameters, one gradient dict per update, and a learning rate per update."""
    rng = np.random.default_rng(seed)
    params = {k: rng.normal(size=s) for k, s in SHAPES.items()}
    grads = [{k: rng.normal(0.0, 10.0 ** rng.uniform(-3, 0), s) for k, s in SHAPES.items()}]
    grads += [{k: rng.normal(size=s) for k, s in SHAPES.items()} for _ in range(STEPS - 1)]
    lrs = [float(v) for v in 10.0 ** rng.uniform(-3, -1, STEPS)]
    return params, grads, lrs


#: Adadelta's LR is of order one (torch's default is 1.0): at 1e-3 to 1e-1 it hardly moves.
LR_FACTOR = {optim.Adadelta: 30.0}


def inputs_for(spec: optim.Optimizer) -> tuple[dict, list[dict], list[float]]:
    """:func:`inputs` with the learning rates scaled for ``spec``'s type."""
    params, grads, lrs = inputs()
    return params, grads, [lr * LR_FACTOR.get(type(spec), 1.0) for lr in lrs]


def reference(spec: optim.Optimizer) -> dict[str, np.ndarray]:
    params, grads, lrs = inputs_for(spec)
    params = {k: v.copy() for k, v in params.items()}
    state = optim.init_state(spec, params)
    for g, lr in zip(grads, lrs):
        optim.apply_update(spec, params, g, state, lr)
    return params


#: optimizer type -> (torch.optim class, its settings besides lr and weight_decay).
TORCH_OPTIMIZERS: dict[type, Callable[[Any], tuple[str, dict[str, Any]]]] = {
    optim.SGD: lambda s: ("SGD", {"momentum": s.momentum, "nesterov": s.nesterov}),
    optim.Adam: lambda s: ("Adam", {"betas": (s.beta1, s.beta2), "eps": s.eps}),
    optim.AdamW: lambda s: ("AdamW", {"betas": (s.beta1, s.beta2), "eps": s.eps}),
    optim.RMSprop: lambda s: (
        "RMSprop",
        {"alpha": s.alpha, "eps": s.eps, "centered": s.centered, "momentum": s.momentum},
    ),
    optim.Adadelta: lambda s: ("Adadelta", {"rho": s.rho, "eps": s.eps}),
    optim.Adagrad: lambda s: (
        "Adagrad",
        {
            "lr_decay": s.lr_decay,
            "initial_accumulator_value": s.initial_accumulator_value,
            "eps": s.eps,
        },
    ),
}


def with_torch(spec: optim.Optimizer) -> dict[str, np.ndarray]:
    torch = pytest.importorskip("torch")
    params, grads, lrs = inputs_for(spec)
    tensors = {
        k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()
    }
    groups = optim.parameter_groups(spec, tensors)  # one group unless the spec has some
    name, settings = TORCH_OPTIMIZERS[type(spec)](spec)
    param_groups = [
        {
            "params": [tensors[k] for k in group.names],
            "weight_decay": group.optimizer.weight_decay,
            **TORCH_OPTIMIZERS[type(spec)](group.optimizer)[1],
        }
        for group in groups
    ]
    # foreach=False: the plain per-tensor loop, torch's formulas as written. The settings go
    # to the constructor too: Adagrad starts its sums from the constructor's value alone.
    optimizer = getattr(torch.optim, name)(param_groups, lr=0.0, foreach=False, **settings)
    for g, lr in zip(grads, lrs):
        for name, tensor in tensors.items():
            tensor.grad = torch.tensor(g[name], dtype=torch.float64)
        for group, ours in zip(optimizer.param_groups, groups, strict=True):
            group["lr"] = lr * ours.lr_scale
        optimizer.step()
    return {k: v.detach().numpy() for k, v in tensors.items()}


#: optimizer type -> the optax transforms computing its direction (before ``-lr``).
OPTAX_CHAINS: dict[type, Callable[[Any, Any], list[Any]]] = {
    # optax.sgd: trace (b = g + mu b), then -lr
    optim.SGD: lambda optax, s: [
        optax.add_decayed_weights(s.weight_decay),
        optax.trace(decay=s.momentum, nesterov=s.nesterov),
    ],
    # L2: the decay joins the gradient first
    optim.Adam: lambda optax, s: [
        optax.add_decayed_weights(s.weight_decay),
        optax.scale_by_adam(s.beta1, s.beta2, s.eps),
    ],
    # optax.adamw: -lr * (adam direction + wd * p)
    optim.AdamW: lambda optax, s: [
        optax.scale_by_adam(s.beta1, s.beta2, s.eps),
        optax.add_decayed_weights(s.weight_decay),
    ],
    # torch's RMSprop: eps outside the root, and the momentum trace before -lr (optax.rmsprop
    # itself traces after scaling by the LR, the Keras way, so its parts are chained here)
    optim.RMSprop: lambda optax, s: [
        optax.add_decayed_weights(s.weight_decay),
        (optax.scale_by_stddev if s.centered else optax.scale_by_rms)(
            decay=s.alpha, eps=s.eps, eps_in_sqrt=False
        ),
        optax.trace(decay=s.momentum),
    ],
    # optax.lion: sign of the b1 interpolation, then the decoupled decay, then -lr
    optim.Lion: lambda optax, s: [
        optax.scale_by_lion(b1=s.beta1, b2=s.beta2),
        optax.add_decayed_weights(s.weight_decay),
    ],
}


def with_optax(spec: optim.Optimizer) -> dict[str, np.ndarray]:
    pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    import jax
    import jax.numpy as jnp

    params, grads, lrs = inputs_for(spec)
    with jax.enable_x64(True):  # float64 here only, not for the rest of the process
        p = {k: jnp.asarray(v, jnp.float64) for k, v in params.items()}
        transform = optax.chain(*OPTAX_CHAINS[type(spec)](optax, spec))
        state = transform.init(p)
        for g, lr in zip(grads, lrs):
            updates, state = transform.update({k: jnp.asarray(v) for k, v in g.items()}, state, p)
            p = optax.apply_updates(p, jax.tree_util.tree_map(lambda u, lr=lr: -lr * u, updates))
        return {k: np.asarray(v, np.float64) for k, v in p.items()}


ORACLES: dict[str, Callable[[optim.Optimizer], dict[str, np.ndarray]]] = {
    "torch.optim": with_torch,
    "optax": with_optax,
}


#: Which library defines which optimizer: torch.optim has no Lion; optax's Adadelta and
#: Adagrad are not torch's (eps placement, the sum's start), and its chains here know no groups.
ORACLE_TYPES = {"torch.optim": TORCH_OPTIMIZERS, "optax": OPTAX_CHAINS}
PAIRS = [
    (name, oracle)
    for name, spec in OPTIMIZERS.items()
    for oracle in ORACLES
    if type(spec) in ORACLE_TYPES[oracle] and not (oracle == "optax" and spec.groups)
]


@pytest.mark.parametrize(("name", "oracle"), PAIRS)
def test_the_reference_matches_torch_optim_and_optax(name: str, oracle: str) -> None:
    spec = OPTIMIZERS[name]
    want = ORACLES[oracle](spec)
    got = reference(spec)
    start, _, _ = inputs()
    for key in SHAPES:
        moved = np.linalg.norm(want[key] - start[key])
        assert moved > 1e-3, f"{oracle} hardly moved {key}: the comparison would be vacuous"
        np.testing.assert_allclose(got[key], want[key], rtol=1e-11, atol=1e-13 * moved)


@pytest.mark.parametrize(
    "spec",
    [
        OPTIMIZER_CASES[name].build(example)
        for name in ("adadelta", "adagrad")
        for example in OPTIMIZER_CASES[name].examples
    ],
    ids=repr,
)
def test_adadelta_and_adagrad_options_match_torch_optim(spec: optim.Optimizer) -> None:
    """The examples' options (Adagrad's lr_decay and initial accumulator, Adadelta's rho and
    weight decay), which the rows' defaults leave at zero."""
    want, got = with_torch(spec), reference(spec)
    for key in SHAPES:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-11, atol=1e-13)


def test_the_conventions_are_told_apart() -> None:
    """The comparison can fail: Keras-style momentum (the LR inside the buffer) and AdamW's
    decay coupled into the gradient both differ from the oracles by far more than the bar."""
    params, grads, lrs = inputs()
    keras = {k: v.copy() for k, v in params.items()}
    buffers = {k: np.zeros_like(v) for k, v in params.items()}
    for g, lr in zip(grads, lrs):
        for k in keras:
            buffers[k] = 0.9 * buffers[k] - lr * g[k]
            keras[k] = keras[k] + buffers[k]
    w = "layers.0.weight"
    heavy_ball = reference(optim.SGD(momentum=0.9))
    assert np.max(np.abs(keras[w] - heavy_ball[w])) > 1e-3
    coupled = reference(optim.Adam(beta1=0.9, beta2=0.995, eps=1e-8, weight_decay=0.05))
    decoupled = reference(OPTIMIZERS["adamw"])
    assert np.max(np.abs(coupled[w] - decoupled[w])) > 1e-4
    grouped = reference(OPTIMIZERS["adamw_groups"])
    assert np.max(np.abs(grouped[w] - reference(optim.AdamW(weight_decay=0.1))[w])) > 1e-4
