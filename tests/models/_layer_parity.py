"""Per-layer parity of each framework's native layers with the float64 numpy reference.

For every case of :data:`LAYER_CASES`: the layer's output, the gradient of
``sum(output * projection)`` with respect to the input, and with respect to every parameter,
computed by a framework in float32 and by the numpy reference in float64 on the same
(float32-rounded) values. The error of a tensor is ``max|ours - reference| / max|reference|``;
parameter gradients are measured against the case's largest gradient entry instead, since some
are zero in theory (a conv bias under BatchNorm, attention's key bias) and only noise remains.

BatchNorm's running statistics after the pass are compared too.

Run ``python tests/models/_layer_parity.py`` to print the table for every installed framework.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from unitrain import ops
from unitrain.backends.numpy import ops as numpy_ops
from unitrain.conformance._layer_cases import LAYER_CASES, layer_input
from unitrain.models import Pass, apply

#: ``(outputs, input gradient or None, parameter gradients, state after the pass)``.
Result = tuple[np.ndarray, np.ndarray | None, dict[str, np.ndarray], dict[str, np.ndarray]]


def case_values(layer: Any, shape: tuple[int, ...]) -> tuple[Any, dict, dict, np.ndarray]:
    """Input, parameters, state and projection of a case, rounded to float32 once."""
    rng = np.random.default_rng(11)
    x = layer_input(layer, shape)
    if layer.input_kind != "tokens":
        x = x.astype(np.float32)
    params = {
        k: (v + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
        for k, v in layer.init_params(seed=5, dtype=np.float64).items()
    }
    state = layer.init_state(np.float32)
    projection = rng.standard_normal((shape[0], *layer.output_shape(shape[1:])))
    return x, params, state, projection.astype(np.float32)


def reference(layer: Any, x: Any, params: dict, state: dict, projection: np.ndarray) -> Result:
    """The float64 numpy reference on the same values: the core's forward in train mode under
    the reference's ops, differentiated by their own VJPs (``ops.vjp``)."""
    names, tokens = list(params), layer.input_kind == "tokens"
    state64 = {k: np.asarray(v, np.float64) for k, v in state.items()}
    moved: dict[str, np.ndarray] = {}

    def outputs(x_: Any, *values: Any) -> Any:
        out, new_state = apply(layer, x_, Pass(dict(zip(names, values)), state64, training=True))
        moved.update(new_state)
        return out

    inputs = [x if tokens else np.asarray(x, np.float64)]
    inputs += [np.asarray(params[k], np.float64) for k in names]
    wrt = range(1 if tokens else 0, len(inputs))  # token ids have no gradient
    with ops.using(numpy_ops):
        (out,), pullback = numpy_ops.vjp(outputs, inputs, tuple(wrt))
        grads = pullback([np.asarray(projection, np.float64)])
    dx = None if tokens else grads.pop(0)
    return out, dx, dict(zip(names, grads)), moved


def torch_layer(layer: Any, x: Any, params: dict, state: dict, projection: np.ndarray) -> Result:
    """torch's native layer in float32 on CPU."""
    import torch

    from unitrain.backends.torch.layers import PortableModule

    module = PortableModule(layer, 0, torch.float32, "cpu").train()
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    with torch.no_grad():
        for name, value in (params | state).items():
            tensors[name].copy_(torch.from_numpy(value))
    inputs = torch.from_numpy(x)
    if layer.input_kind != "tokens":
        inputs.requires_grad_(True)
    out = module(inputs)
    (out * torch.from_numpy(projection)).sum().backward()
    dx = None if layer.input_kind == "tokens" else inputs.grad.numpy()
    grads = {name: p.grad.numpy() for name, p in module.named_parameters()}
    new_state = {name: b.numpy() for name, b in module.named_buffers()}
    return out.detach().numpy(), dx, grads, new_state


def jax_layer(layer: Any, x: Any, params: dict, state: dict, projection: np.ndarray) -> Result:
    """JAX's native layer in float32 on CPU, differentiated by ``jax.vjp``."""
    import jax

    from unitrain.backends.jax.layers import PortableModule

    apply = PortableModule(layer)
    cpu = jax.devices("cpu")[0]
    params_, state_ = jax.device_put((params, state), cpu)

    def outputs(params_: Any, x_: Any) -> Any:
        return apply(params_, state_, x_, train=True, rng=None)[0]

    new_state = apply(params_, state_, x, train=True, rng=None)[1]

    if layer.input_kind == "tokens":
        out, pull = jax.vjp(lambda p: outputs(p, x), params_)
        (grads,), dx = pull(projection), None
    else:
        out, pull = jax.vjp(outputs, params_, jax.device_put(x, cpu))
        grads, dx = pull(projection)
        dx = np.asarray(dx)
    grads = {k: np.asarray(v) for k, v in grads.items()}
    return np.asarray(out), dx, grads, {k: np.asarray(v) for k, v in new_state.items()}


def tensorflow_layer(
    layer: Any, x: Any, params: dict, state: dict, projection: np.ndarray
) -> Result:
    """TensorFlow's native layer in float32, differentiated by a ``GradientTape``."""
    import tensorflow as tf

    from unitrain.backends.tensorflow.layers import PortableModule

    module = PortableModule(layer, params, state, tf.float32)
    inputs = tf.constant(x)
    variables = list(module.named_variables().values())
    with tf.GradientTape() as tape:
        if layer.input_kind != "tokens":
            tape.watch(inputs)
        out = module(inputs, training=True)
        total = tf.reduce_sum(out * projection)
    watched = variables + ([] if layer.input_kind == "tokens" else [inputs])
    found = tape.gradient(total, watched)
    grads = {name: tf.convert_to_tensor(g).numpy() for name, g in zip(params, found)}
    dx = None if layer.input_kind == "tokens" else found[-1].numpy()
    return out.numpy(), dx, grads, {k: v.numpy() for k, v in module.named_state().items()}


FRAMEWORKS: dict[str, Callable[..., Result]] = {
    "torch": torch_layer,
    "jax": jax_layer,
    "tensorflow": tensorflow_layer,
}


def errors(framework: str, layer: Any, shape: tuple[int, ...]) -> dict[str, float]:
    """Relative errors of ``framework``'s output, input gradient and parameter gradients."""
    x, params, state, projection = case_values(layer, shape)
    ref_out, ref_dx, ref_grads, ref_state = reference(layer, x, params, state, projection)
    out, dx, grads, new_state = FRAMEWORKS[framework](layer, x, params, state, projection)
    assert out.shape == ref_out.shape, (out.shape, ref_out.shape)
    found = {"output": _relative(out, ref_out, np.abs(ref_out).max())}
    if ref_dx is not None:
        found["input_grad"] = _relative(dx, ref_dx, np.abs(ref_dx).max())
    if ref_grads:
        scale = max(np.abs(g).max() for g in ref_grads.values())
        found["param_grads"] = max(_relative(grads[k], g, scale) for k, g in ref_grads.items())
    if ref_state:
        found["state"] = max(
            _relative(new_state[k], v, np.abs(v).max()) for k, v in ref_state.items()
        )
    return found


def _relative(ours: Any, theirs: np.ndarray, scale: float) -> float:
    return float(np.abs(np.asarray(ours, np.float64) - theirs).max() / max(scale, 1e-30))


def main() -> None:
    """Print the per-layer table for each framework given (default: every one installed)."""
    frameworks = sys.argv[1:] or list(FRAMEWORKS)
    for framework in frameworks:
        print(f"\n{framework} float32 vs numpy float64 (max relative error)")
        print(f"{'layer':24} {'output':>10} {'input grad':>11} {'param grads':>12} {'state':>8}")
        worst = 0.0
        for name, layer, shape in LAYER_CASES:
            found = errors(framework, layer, shape)
            worst = max(worst, *found.values())
            cells = [found.get(k) for k in ("output", "input_grad", "param_grads", "state")]
            text = [f"{c:.1e}" if c is not None else "-" for c in cells]
            print(f"{name:24} {text[0]:>10} {text[1]:>11} {text[2]:>12} {text[3]:>8}")
        print(f"worst: {worst:.2e}")


if __name__ == "__main__":
    main()
