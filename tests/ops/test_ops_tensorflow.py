"""The TensorFlow ops where eager parity (``test_ops_parity.py``) does not reach: every case
traced into a ``tf.function`` as the adapter traces layers (with autograph off), the image ops
traced for an unknown batch size, and the ties where TensorFlow's own gradient differs from
the contract."""

from __future__ import annotations

import numpy as np
import pytest

from unitrain import ops
from unitrain.conformance._op_cases import OP_CASES, make_inputs
from unitrain.conformance._op_run import cotangents_for, relative_error, run_case

tf = pytest.importorskip("tensorflow")
tf_ops = pytest.importorskip("unitrain.backends.tensorflow.ops")

#: The cases of layers that the adapter traces with a batch axis of unknown size.
LAYER_OPS = ("conv", "conv_transpose", "max_pool", "avg_pool", "scaled_dot_product_attention")
BATCHED = [case for case in OP_CASES if case.op in (*LAYER_OPS, "take_along_axis")]


def _traced_vjp(case, arrays, cotangents, signature=None):
    """The case's outputs and input gradients, forward and pullback in one ``tf.function``."""
    wrt = case.grad_positions()

    def body(*tensors):
        inputs, seeds = tensors[: len(arrays)], tensors[len(arrays) :]
        with ops.using(tf_ops):
            outputs, pullback = tf_ops.vjp(lambda *xs: case.call(ops, *xs), inputs, wrt)
            return outputs, pullback([tf.cast(s, o.dtype) for s, o in zip(seeds, outputs)])

    traced = tf.function(body, input_signature=signature, autograph=False)
    outputs, grads = traced(*arrays, *cotangents)
    return [o.numpy() for o in outputs], [g.numpy() for g in grads]


def _eager_or_skip(case, dtype):
    try:
        return run_case(tf_ops, case, dtype)
    except tf.errors.InvalidArgumentError as error:
        pytest.skip(f"fails eagerly too, as test_ops_parity shows: {str(error)[:80]}")


def _native(case, dtype):
    return [tf_ops.asarray(a, dtype if a.dtype.kind == "f" else None) for a in make_inputs(case)]


def _assert_same(got, want, bar=1e-12):
    for g, w in zip(got, want):
        assert relative_error(np.asarray(g, np.float64), w) <= bar


@pytest.mark.parametrize("case", OP_CASES, ids=lambda case: case.name)
def test_a_case_traced_into_a_graph_matches_its_eager_run(case):
    outputs, grads = _eager_or_skip(case, "float64")
    cotangents = [tf.constant(c) for c in cotangents_for(case, [o.shape for o in outputs])]
    got_outputs, got_grads = _traced_vjp(case, _native(case, "float64"), cotangents)
    _assert_same(got_outputs, outputs)
    _assert_same(got_grads, grads)


@pytest.mark.parametrize("case", BATCHED, ids=lambda case: case.name)
def test_image_ops_trace_for_an_unknown_batch_size(case):
    outputs, grads = _eager_or_skip(case, "float32")
    arrays = _native(case, "float32")
    cotangents = [
        tf.constant(c, tf.float32) for c in cotangents_for(case, [o.shape for o in outputs])
    ]
    kernel = case.op in ("conv", "conv_transpose")  # the second input: no batch axis
    signature = [
        tf.TensorSpec(a.shape if kernel and i == 1 else [None, *a.shape[1:]], a.dtype)
        for i, a in enumerate([*arrays, *cotangents])
    ]
    got_outputs, got_grads = _traced_vjp(case, arrays, cotangents, signature)
    _assert_same(got_outputs, outputs, 1e-6)
    _assert_same(got_grads, grads, 1e-6)


def _gradients(fn, *values):
    tensors = [tf.constant(np.asarray(v, np.float64)) for v in values]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = fn(*tensors)
    return [g.numpy() for g in tape.gradient(out, tensors)]


@pytest.mark.parametrize("fn", [tf_ops.maximum, tf_ops.minimum], ids=["maximum", "minimum"])
def test_a_tie_of_maximum_or_minimum_splits_the_gradient_evenly(fn):
    # TensorFlow's own gradient gives the whole tie to x; y broadcasts over the rows
    dx, dy = _gradients(fn, [[1.0, 2.0], [3.0, 2.0]], [1.0, 2.0])
    if fn is tf_ops.maximum:
        np.testing.assert_array_equal(dx, [[0.5, 0.5], [1.0, 0.5]])
        np.testing.assert_array_equal(dy, [0.5, 1.0])
    else:
        np.testing.assert_array_equal(dx, [[0.5, 0.5], [0.0, 0.5]])
        np.testing.assert_array_equal(dy, [1.5, 1.0])


def test_max_pool_gives_a_tied_window_s_gradient_to_its_first_maximum():
    x = np.array([1.0, 3.0, 3.0, 1.0, 2.0, 2.0]).reshape(1, 6, 1)
    (dx,) = _gradients(lambda t: tf_ops.max_pool(t, 2, 1, 1), x)
    np.testing.assert_array_equal(dx.ravel(), [1, 2, 1, 0, 2, 1])
