"""The numpy reference ops: their derivatives against finite differences, their forwards
against closed forms, in float64. Every backend is compared against these ops
(``tests/ops/test_ops_parity.py``), so nothing here compares against a framework."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from unitrain.backends.numpy import ops as reference
from unitrain.conformance._op_cases import OP_CASES, make_inputs
from unitrain.conformance._op_run import cotangents_for, relative_error, run_case

#: Central differences with a step of 1e-6 times the value are good to about 1e-9 here
#: (truncation ~ step^2, rounding ~ 1e-16 / step); the analytic gradients measure 1e-11 to 2e-9.
FD_BAR = 1e-6


def outputs_of(result):
    return list(result) if isinstance(result, tuple | list) else [result]


def finite_differences(fn, arrays, positions, cotangents):
    """The gradient of ``sum_i <cotangents[i], fn(*arrays)[i]>`` with respect to each input at
    ``positions``, by central differences element by element."""

    def weighed(xs):
        outputs = outputs_of(fn(*xs))
        return sum(
            float(np.vdot(c, np.asarray(o, np.float64))) for c, o in zip(cotangents, outputs)
        )

    grads = []
    for position in positions:
        base = arrays[position]
        moved = base.copy()
        shifted = [*arrays[:position], moved, *arrays[position + 1 :]]
        grad = np.zeros(base.shape)
        for index in np.ndindex(base.shape):
            step = 1e-6 * max(1.0, abs(base[index]))
            moved[index] = base[index] + step
            up, high = weighed(shifted), moved[index]
            moved[index] = base[index] - step
            down, low = weighed(shifted), moved[index]
            moved[index] = base[index]
            grad[index] = (up - down) / (high - low)
        grads.append(grad)
    return grads


def reference_vjp(fn, arrays, positions, cotangents=None):
    """``fn``'s outputs, the cotangents used, and the reference's gradients."""
    outputs, pullback = reference.vjp(fn, arrays, positions)
    if cotangents is None:
        rng = np.random.default_rng(0)
        cotangents = [rng.standard_normal(o.shape) for o in outputs]
    return outputs, cotangents, pullback(cotangents)


def assert_gradients_match_finite_differences(fn, arrays, positions=None):
    positions = tuple(range(len(arrays))) if positions is None else positions
    _, cotangents, grads = reference_vjp(fn, arrays, positions)
    want = finite_differences(fn, arrays, positions, cotangents)
    for position, got, expected in zip(positions, grads, want):
        error = relative_error(got, expected)
        assert error < FD_BAR, f"gradient of input {position} off by {error:.2e}"


# -- every case of the ops kit ----------------------------------------------------------------

#: Cases whose gradient is a convention, not a derivative, so differences cannot check it:
#: the closed form each must equal, from the inputs and the cotangent.
CONVENTIONS = {
    # cast's output is rounded to float32, a step function; the contract passes the
    # cotangent straight back (rounded to float32 on the way, as the output's cotangent is).
    "cast": lambda x, cotangent: cotangent.astype(np.float32).astype(np.float64),
    # x * stop_gradient(x): only the first factor is differentiated.
    "stop_gradient": lambda x, cotangent: x * cotangent,
}


@pytest.mark.parametrize(
    "case", [c for c in OP_CASES if not c.on_kinks], ids=lambda case: case.name
)
def test_gradients_match_finite_differences(case):
    outputs, grads = run_case(reference, case, "float64")
    arrays = make_inputs(case)
    cotangents = cotangents_for(case, [o.shape for o in outputs])
    positions = case.grad_positions()
    if case.name in CONVENTIONS:
        want = [CONVENTIONS[case.name](arrays[0], cotangents[0])]
    else:
        want = finite_differences(
            lambda *xs: case.call(reference, *xs), arrays, positions, cotangents
        )
    assert len(grads) == len(positions)
    for position, got, expected in zip(positions, grads, want):
        error = relative_error(got, expected)
        assert error < FD_BAR, f"gradient of input {position} off by {error:.2e}"


@pytest.mark.parametrize("case", OP_CASES, ids=lambda case: case.name)
def test_float32_inputs_compute_in_float32(case):
    arrays = [
        reference.asarray(a, "float32" if a.dtype.kind == "f" else None) for a in make_inputs(case)
    ]
    outputs, pullback = reference.vjp(
        lambda *xs: case.call(reference, *xs), arrays, case.grad_positions()
    )
    assert {o.dtype.name for o in outputs} == {"float32"}
    grads = pullback([np.ones(o.shape, o.dtype) for o in outputs])
    assert {g.dtype.name for g in grads} <= {"float32"}


# -- forwards against closed forms ------------------------------------------------------------


def test_erf_matches_math_erf_to_float64_rounding():
    points = np.concatenate([np.linspace(-6, 6, 1000), np.geomspace(1e-300, 1e-2, 20)])
    got = reference.erf(points)
    want = np.array([math.erf(p) for p in points])
    assert np.max(np.abs(got - want) / np.abs(want)) < 2e-15
    assert reference.erf(np.array([np.inf, -np.inf, 0.0])).tolist() == [1.0, -1.0, 0.0]
    assert np.isnan(reference.erf(np.array([np.nan])))[0]


def test_gelu_keeps_its_relative_accuracy_in_the_lower_tail():
    # 1 + erf(x / sqrt 2) cancels there; the reference takes erfc instead.
    x = np.linspace(-30, -1, 300)
    want = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    got = reference.gelu(x)
    tiny = want != 0
    assert np.max(np.abs(got[tiny] - want[tiny]) / np.abs(want[tiny])) < 1e-13
    assert np.all(got[~tiny] == 0)


def test_softmax_and_logsumexp_forms():
    x = np.random.default_rng(1).standard_normal((3, 5))
    probabilities = reference.softmax(x, axis=0)
    np.testing.assert_allclose(probabilities.sum(axis=0), 1.0, rtol=1e-15)
    np.testing.assert_allclose(probabilities, np.exp(x) / np.exp(x).sum(0), rtol=1e-14)
    np.testing.assert_allclose(
        reference.logsumexp(x, axis=1), np.log(np.sum(np.exp(x), axis=1)), rtol=1e-14
    )
    np.testing.assert_allclose(
        reference.log_softmax(x), x - np.log(np.exp(x).sum(-1, keepdims=True)), rtol=1e-14
    )
    # Shifted by the maximum: no overflow, and -inf entries drop out.
    assert reference.logsumexp(np.array([1000.0, 1000.0])) == 1000.0 + math.log(2.0)
    assert reference.logsumexp(np.array([-np.inf, 0.0])) == 0.0
    np.testing.assert_array_equal(reference.softmax(np.array([1000.0, 0.0])), [1.0, 0.0])


def test_sigmoid_and_softplus_do_not_overflow():
    x = np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0])
    np.testing.assert_allclose(
        reference.sigmoid(x), [0.0, math.exp(-40) / (1 + math.exp(-40)), 0.5, 1.0, 1.0]
    )
    np.testing.assert_allclose(
        reference.softplus(x), [0.0, math.log1p(math.exp(-40)), math.log(2), 40.0, 1000.0]
    )
    assert reference.sigmoid(np.array([-700.0]))[0] > 0  # e^-700 is representable: kept
    _, _, (grad,) = reference_vjp(reference.sigmoid, [x], (0,), [np.ones(5)])
    assert grad[1] == pytest.approx(math.exp(-40), rel=1e-12)  # not s (1 - s) = 0


def direct_conv2d(x, kernel, stride, widths, dilation, groups):
    """Cross-correlation by the definition, one output element at a time."""
    padded = np.pad(x, ((0, 0), *widths, (0, 0)))
    (sh, sw), (dh, dw) = stride, dilation
    kh, kw, group_in, c_out = kernel.shape
    rows = (padded.shape[1] - (kh - 1) * dh - 1) // sh + 1
    cols = (padded.shape[2] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((x.shape[0], rows, cols, c_out))
    for n, i, j, o in np.ndindex(out.shape):
        group = o // (c_out // groups)
        for a, b, c in np.ndindex(kh, kw, group_in):
            pixel = padded[n, i * sh + a * dh, j * sw + b * dw, group * group_in + c]
            out[n, i, j, o] += pixel * kernel[a, b, c, o]
    return out


def test_conv_matches_the_definition():
    rng = np.random.default_rng(2)
    x, kernel = rng.standard_normal((2, 7, 6, 4)), rng.standard_normal((3, 2, 2, 6))
    got = reference.conv(x, kernel, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    want = direct_conv2d(x, kernel, (2, 1), ((1, 1), (2, 2)), (1, 2), 2)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    # 1-D is 2-D with a width of one.
    line, taps = x[:, :, 0], rng.standard_normal((3, 4, 5))
    np.testing.assert_allclose(
        reference.conv(line, taps, stride=2, padding=1),
        reference.conv(line[:, :, None], taps[:, None], (2, 1), (1, 0))[:, :, 0],
        rtol=1e-14,
    )


def test_conv_same_pads_the_odd_one_after():
    rng = np.random.default_rng(3)
    x, kernel = rng.standard_normal((1, 7, 6, 2)), rng.standard_normal((3, 3, 2, 2))
    got = reference.conv(x, kernel, stride=2, padding="same")
    assert got.shape == (1, 4, 3, 2)  # ceil(7 / 2), ceil(6 / 2)
    # Height: 2 to pad, one each side; width: 1 to pad, after (TensorFlow's rule).
    padded = np.pad(x, ((0, 0), (1, 1), (0, 1), (0, 0)))
    np.testing.assert_allclose(got, reference.conv(padded, kernel, 2, "valid"), rtol=1e-14)
    assert reference.conv(x, kernel, padding="same").shape == (1, 7, 6, 2)


def test_conv_transpose_is_the_input_gradient_of_conv():
    rng = np.random.default_rng(4)
    x, kernel = rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((3, 2, 3, 5))
    settings: dict[str, Any] = {"stride": 2, "padding": 1, "dilation": (1, 2)}
    got = reference.conv_transpose(x, kernel, output_padding=1, **settings)
    # torch's size: (n - 1) * stride - 2 * padding + dilation * (window - 1) + extra + 1
    assert got.shape == (2, 3 * 2 - 2 + 2 + 1 + 1, 2 * 2 - 2 + 2 + 1 + 1, 3)
    image = np.zeros(got.shape)
    _, pullback = reference.vjp(lambda z: reference.conv(z, kernel, **settings), [image], (0,))
    np.testing.assert_allclose(got, pullback([x])[0], rtol=1e-13)


def test_pools_leave_padding_out():
    x = -np.arange(1.0, 26.0).reshape(1, 5, 5, 1)  # all negative: a zero pad would win a max
    averaged = reference.avg_pool(x, 3, stride=2, padding=1)
    assert averaged[0, 0, 0, 0] == np.mean(x[0, :2, :2, 0])  # 4 real elements, not 9
    assert averaged[0, 1, 1, 0] == np.mean(x[0, 1:4, 1:4, 0])
    np.testing.assert_array_equal(reference.avg_pool(np.ones((1, 5, 5, 1)), 3, 2, 1), 1.0)
    # The largest real element of each window is its first: rows and columns max(2i - 1, 0).
    first = [0, 1, 3]
    np.testing.assert_array_equal(
        reference.max_pool(x, 3, stride=2, padding=1)[0, :, :, 0],
        x[0, :, :, 0][np.ix_(first, first)],
    )


def test_max_pool_gives_the_gradient_to_the_first_maximum():
    x = np.ones((1, 4, 1))
    _, _, (grad,) = reference_vjp(
        lambda x: reference.max_pool(x, 2), [x], (0,), [np.ones((1, 2, 1))]
    )
    np.testing.assert_array_equal(grad[0, :, 0], [1.0, 0.0, 1.0, 0.0])


def test_gradient_conventions_at_kinks_and_ties():
    def grads(fn, *arrays):
        outputs, pullback = reference.vjp(fn, list(arrays), tuple(range(len(arrays))))
        return pullback([np.ones(o.shape) for o in outputs])

    x = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_array_equal(grads(reference.relu, x)[0], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(grads(reference.abs, x)[0], [-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(grads(lambda x: reference.clip(x, 0.0, 2.0), x)[0], [0, 1, 1])
    dx, dy = grads(reference.maximum, x, np.array([-1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(dx, [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(dy, [0.5, 1.0, 0.0])
    tied = np.array([[3.0, 1.0, 3.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(
        grads(lambda t: reference.max(t, 1), tied)[0], [[0.5, 0, 0.5], [1 / 3] * 3]
    )
    np.testing.assert_array_equal(
        grads(lambda t: reference.min(t), tied)[0], [[0] * 3, [1 / 3] * 3]
    )
    base, exponent = np.array([-2.0, 0.0, 2.0]), np.array([2.0, 2.0, 2.0])
    np.testing.assert_array_equal(
        grads(reference.power, base, exponent)[1], [0, 0, 4 * math.log(2)]
    )
    # Integer casts stop the gradient; float casts pass it back in the input's dtype.
    assert grads(lambda x: reference.cast(x, "int64") * 1.0 + x, x)[0].tolist() == [1.0] * 3
    (back,) = grads(lambda x: reference.cast(x, "float32"), x)
    assert back.dtype == np.float64


def test_take_along_axis_adds_repeated_picks():
    x = np.arange(6.0).reshape(2, 3)
    picks = np.array([[0, 0, 2], [1, 1, 1]])
    np.testing.assert_array_equal(reference.take_along_axis(x, picks, 1), [[0, 0, 2], [4, 4, 4]])
    _, _, (grad,) = reference_vjp(
        lambda x: reference.take_along_axis(x, picks, 1), [x], (0,), [np.ones((2, 3))]
    )
    np.testing.assert_array_equal(grad, [[2, 0, 1], [0, 3, 0]])


def test_einsum_gradient_of_a_letter_only_one_operand_has():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    np.testing.assert_allclose(reference.einsum("ij,jk->k", a, b), a.sum(0) @ b, rtol=1e-14)
    assert_gradients_match_finite_differences(
        lambda a, b: reference.einsum("ij,jk->k", a, b), [a, b]
    )
    with pytest.raises(ValueError, match="explicit"):
        reference.einsum("ij,jk", a, b)


def test_attention_rows_that_keep_nothing_are_zero():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 3, 2)) for _ in range(3))
    mask = np.array([[True, False, True], [False, False, False], [True, True, True]])
    outputs, _, grads = reference_vjp(
        lambda q, k, v: reference.scaled_dot_product_attention(q, k, v, mask=mask),
        [q, k, v],
        (0, 1, 2),
    )
    np.testing.assert_array_equal(outputs[0][0, 1], 0.0)
    np.testing.assert_array_equal(grads[0][0, 1], 0.0)  # the empty row's query
    # The other rows: the softmax of the kept scores, by hand.
    scores = q[0] @ k[0].T / math.sqrt(2)
    kept = np.exp(np.where(mask, scores, -np.inf))
    want = (kept / np.maximum(kept.sum(-1, keepdims=True), 1e-300)) @ v[0]
    np.testing.assert_allclose(outputs[0][0], want, rtol=1e-14)


def exact_moments(values):
    exact = [Fraction(float(v)) for v in values.ravel()]
    mean = sum(exact) / len(exact)
    return mean, sum((v - mean) ** 2 for v in exact) / len(exact)


def test_moments_are_exact_far_from_zero():
    x = 64.0 + 0.25 * np.random.default_rng(7).standard_normal((4, 6))
    mean, variance = reference.moments(x, axis=(0, 1))
    want_mean, want_variance = exact_moments(x)
    assert abs(Fraction(float(mean)) - want_mean) <= 1e-12 * abs(want_mean)
    assert abs(Fraction(float(variance)) - want_variance) <= 1e-12 * want_variance
    # In float32 the two passes keep ~7 digits where E[x^2] - E[x]^2 would keep none.
    low = x.astype(np.float32)
    _, variance32 = reference.moments(low, axis=(0, 1))
    assert variance32.dtype == np.float32
    assert abs(Fraction(float(variance32)) - exact_moments(low)[1]) <= 1e-5 * exact_moments(low)[1]


def test_asarray_dtypes():
    assert reference.asarray(1.5).dtype == np.float32
    assert reference.asarray([1.0, 2.0]).dtype == np.float32
    assert reference.asarray(3).dtype == np.int64
    assert reference.asarray(np.zeros(2)).dtype == np.float64
    assert reference.asarray(np.zeros(2, np.float32)).dtype == np.float32
    assert reference.asarray(np.zeros(2), "float32").dtype == np.float32
    assert reference.dtype(np.zeros(2, bool)) == "bool"
    assert reference.shape(np.zeros((2, 3))) == (2, 3)


# -- the array type and the pullback ----------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w, b: x @ w + b,
        lambda x, w, b: -x * (w[:, 0] - b[0]),
        lambda x, w, b: x[1:, None] * w[:, 0] + b[:, None, None],
        lambda x, w, b: (2.0 - x / 3) @ w + 1 / (b * b + 1),
        lambda x, w, b: np.ones(3) * x[..., -1] ** 2 + 2.0 ** b[:1],
        lambda x, w, b: np.ones((3, 4)) @ (w + 1.0),
    ],
    ids=["matmul-add", "negative", "slice-newaxis", "reflected", "ndarray-left-pow", "rmatmul"],
)
def test_tracked_operators(fn):
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal((3, 4)), rng.standard_normal((4, 2)), rng.standard_normal(2)]
    assert_gradients_match_finite_differences(fn, arrays)


def test_pullback_gives_zeros_where_nothing_depends_and_runs_twice():
    x, unused = np.arange(3.0), np.ones((2, 2))
    outputs, pullback = reference.vjp(
        lambda x, u: (x * x, reference.stop_gradient(u)), [x, unused], (0, 1)
    )
    first, second = pullback([np.ones(3), np.ones((2, 2))]), pullback([np.ones(3), np.ones((2, 2))])
    np.testing.assert_array_equal(first[0], 2 * x)
    np.testing.assert_array_equal(first[1], np.zeros((2, 2)))
    np.testing.assert_array_equal(second[0], first[0])
    assert all(isinstance(o, np.ndarray) for o in outputs)
    with pytest.raises(ValueError, match="cotangents"):
        pullback([np.ones(3)])


def test_ops_on_untracked_inputs_return_plain_arrays():
    x = np.ones((1, 4, 4, 2))
    assert type(reference.conv(x, np.ones((2, 2, 2, 3)))) is np.ndarray
    assert type(reference.add(x, 1.0)) is np.ndarray
    assert all(type(part) is np.ndarray for part in reference.split(x, [1, 3], axis=1))


def test_the_reference_imports_no_framework():
    code = (
        "import sys, unitrain.backends.numpy.ops; "
        "assert not {'torch', 'jax', 'tensorflow', 'autograd'} & set(sys.modules), "
        "sorted({'torch', 'jax', 'tensorflow', 'autograd'} & set(sys.modules))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_references_own_error_function_matches_scipys():
    """Without scipy the reference computes erf and erfc itself, to float64 rounding."""
    from scipy import special

    from unitrain.backends.numpy._special import own_erf_and_erfc

    x = np.concatenate([np.linspace(-6, 6, 2001), [-27.0, -1.25, 1.25, 2.0, 27.0, 0.0]])
    erf, erfc = own_erf_and_erfc(x)
    np.testing.assert_allclose(erf, special.erf(x), rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(erfc, special.erfc(x), rtol=1e-13, atol=1e-300)
