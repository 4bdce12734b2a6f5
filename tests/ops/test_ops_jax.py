"""What the JAX ops must do beyond matching the reference (``tests/ops/test_ops_parity.py``):
trace under ``jax.jit`` into pure XLA, compute float64 without switching x64 on for the
process, and keep the contract where JAX's own derivative differs from it."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from unitrain import ops  # noqa: E402
from unitrain.backends.jax import ops as jax_ops  # noqa: E402
from unitrain.conformance._op_cases import OP_CASES, make_inputs  # noqa: E402


def primitives(jaxpr, found=None):
    """The names of every primitive in ``jaxpr`` and the jaxprs nested in it."""
    found = set() if found is None else found
    for equation in jaxpr.eqns:
        found.add(equation.primitive.name)
        for param in equation.params.values():
            for inner in param if isinstance(param, tuple | list) else [param]:
                if hasattr(inner, "eqns"):
                    primitives(inner, found)
                elif hasattr(getattr(inner, "jaxpr", None), "eqns"):
                    primitives(inner.jaxpr, found)
    return found


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_case_and_its_gradient_trace_under_jit_without_host_callbacks(dtype):
    for case in OP_CASES:
        arrays = [
            jax_ops.asarray(a, dtype if a.dtype.kind == "f" else None) for a in make_inputs(case)
        ]
        wrt = case.grad_positions()

        def forward_and_pullback(*xs, case=case, wrt=wrt):
            outputs, pullback = jax_ops.vjp(lambda *ys: case.call(ops, *ys), xs, wrt)
            return outputs, pullback([jnp.ones_like(o) for o in outputs])

        x64 = jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()
        with ops.using(jax_ops), x64:
            traced = jax.make_jaxpr(jax.jit(forward_and_pullback))(*arrays)
        callbacks = {name for name in primitives(traced.jaxpr) if "callback" in name}
        assert not callbacks, f"{case.name} calls back to the host: {callbacks}"


def test_float64_is_real_and_x64_stays_off_for_the_process():
    x = jax_ops.asarray(np.array([1.0, 2.0]), "float64")
    assert jax_ops.dtype(x) == "float64"
    tiny = 1e-12  # lost in float32: 1 + 1e-12 == 1
    with ops.using(jax_ops):
        (out,), pullback = jax_ops.vjp(lambda v: (ops.exp(v * 0.0) + tiny) * v, [x], [0])
        (grad,) = pullback([jax_ops.asarray(np.ones(2), "float64")])
    assert jax_ops.dtype(out) == jax_ops.dtype(grad) == "float64"
    assert jax_ops.to_numpy(grad)[0] - 1.0 == pytest.approx(tiny, rel=1e-3)
    assert not jax.config.jax_enable_x64
    # Without x64, a 64-bit dtype named inside a computation is JAX's 32-bit one, quietly.
    assert jax_ops.dtype(jax_ops.zeros((2,), "float64")) == "float32"
    assert jax_ops.dtype(jax_ops.arange(3)) == "int32"


def gradient(fn, *args, position=0):
    (out,), pullback = jax_ops.vjp(fn, [jnp.asarray(a, jnp.float32) for a in args], [position])
    return np.asarray(pullback([jnp.ones_like(out)])[0])


def test_derivatives_at_kinks_and_ties_follow_the_contract():
    at = np.array([0.0, -0.5, 0.5, 0.7])
    assert gradient(jax_ops.abs, at).tolist() == [0.0, -1.0, 1.0, 1.0]
    assert gradient(lambda x: jax_ops.clip(x, -0.5, 0.5), at).tolist() == [1, 1, 1, 0]
    assert gradient(jax_ops.relu, at).tolist() == [0.0, 0.0, 1.0, 1.0]
    assert gradient(jax_ops.maximum, [1.0, 2.0], [1.0, 1.0]).tolist() == [0.5, 1.0]
    assert gradient(jax_ops.max, [2.0, 1.0, 2.0]).tolist() == [0.5, 0.0, 0.5]
    base, exponent = [-2.0, 0.0, 2.0], [2.0, 0.0, 0.5]
    by_exponent = gradient(jax_ops.power, base, exponent, position=1)
    assert by_exponent[:2].tolist() == [0.0, 0.0]
    assert by_exponent[2] == pytest.approx(2.0**0.5 * np.log(2.0))
    assert np.isfinite(gradient(jax_ops.power, base, exponent)).all()


def first_maximum_gradient(x, window, stride, padding):
    """Max pooling's input gradient for unit cotangents, one count per window's first maximum
    (row-major), by looping."""
    padded = np.pad(x, [(0, 0), *[(p, p) for p in padding], (0, 0)], constant_values=-np.inf)
    grad = np.zeros_like(padded)
    rows = (padded.shape[1] - window[0]) // stride[0] + 1
    cols = (padded.shape[2] - window[1]) // stride[1] + 1
    for n, c, i, j in np.ndindex(x.shape[0], x.shape[3], rows, cols):
        top, left = i * stride[0], j * stride[1]
        patch = padded[n, top : top + window[0], left : left + window[1], c]
        a, b = np.unravel_index(np.argmax(patch), patch.shape)
        grad[n, top + a, left + b, c] += 1
    return grad[:, padding[0] : padding[0] + x.shape[1], padding[1] : padding[1] + x.shape[2]]


def test_max_pool_gives_each_window_gradient_to_its_first_maximum():
    x = np.random.default_rng(0).integers(0, 3, (2, 6, 5, 2)).astype(np.float32)  # many ties
    got = gradient(lambda v: jax_ops.max_pool(v, (3, 2), (2, 1), (1, 1)), x)
    assert np.array_equal(got, first_maximum_gradient(x, (3, 2), (2, 1), (1, 1)))


def test_conv_transpose_is_the_input_gradient_of_conv():
    rng = np.random.default_rng(1)
    kernel = jnp.asarray(rng.standard_normal((3, 2, 4, 3)), jnp.float32)  # (*window, C_in, C_out)
    x = jnp.asarray(rng.standard_normal((2, 9, 8, 4)), jnp.float32)
    settings: dict[str, Any] = {"stride": (2, 3), "padding": (1, 2), "dilation": (2, 1)}
    y, pull = jax.vjp(lambda v: jax_ops.conv(v, kernel, **settings), x)
    cotangent = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    # The output padding restores the input positions the conv's striding left unread.
    window, stride, padding, dilation = (3, 2), *settings.values()
    extra = [
        size - ((out - 1) * s - 2 * p + d * (k - 1) + 1)
        for size, out, k, s, p, d in zip(
            x.shape[1:3], y.shape[1:3], window, stride, padding, dilation
        )
    ]
    got = jax_ops.conv_transpose(cotangent, kernel, output_padding=extra, **settings)
    np.testing.assert_allclose(got, pull(cotangent)[0], rtol=1e-5, atol=1e-5)


def test_attention_row_that_keeps_nothing_gives_zeros_and_zero_gradients():
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.standard_normal((1, n, 3)), jnp.float32) for n in (2, 3, 3))
    mask = jnp.asarray([[False, False, False], [True, False, True]])
    outputs, pullback = jax_ops.vjp(
        lambda q, k, v: jax_ops.scaled_dot_product_attention(q, k, v, mask=mask),
        [q, k, v],
        [0, 1, 2],
    )
    grads = pullback([jnp.ones_like(outputs[0])])
    assert np.asarray(outputs[0])[0, 0].tolist() == [0.0, 0.0, 0.0]
    assert np.asarray(grads[0])[0, 0].tolist() == [0.0, 0.0, 0.0]
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_float32_products_are_highest_precision_unless_the_caller_chose_one():
    x = jnp.ones((2, 2), jnp.float32)

    def precisions():
        dots = jax.make_jaxpr(jax_ops.matmul)(x, x).jaxpr.eqns
        return {str(e.params["precision"]) for e in dots if e.primitive.name == "dot_general"}

    assert "HIGHEST" in next(iter(precisions()))
    with jax.default_matmul_precision("tensorfloat32"):
        assert "HIGHEST" not in next(iter(precisions()))
