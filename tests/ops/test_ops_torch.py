"""What the torch ops must do beyond matching the reference (``tests/ops/test_ops_parity.py``):
keep the contract at the points the parity cases stay away from (kinks, ties, rows that keep
nothing, padding torch refuses), keep a number operand from widening an array, and read
nothing back to the host on CUDA."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unitrain import ops  # noqa: E402
from unitrain.backends.torch import ops as torch_ops  # noqa: E402
from unitrain.conformance._op_cases import OP_CASES, make_inputs  # noqa: E402


def gradient(fn, *args, position=0):
    arrays = [torch.tensor(a, dtype=torch.float64) for a in args]
    (out,), pullback = torch_ops.vjp(fn, arrays, [position])
    return pullback([torch.ones_like(out)])[0].tolist()


def test_derivatives_at_kinks_and_ties_follow_the_contract():
    at = [0.0, -0.5, 0.5, 0.7]
    assert gradient(torch_ops.abs, at) == [0.0, -1.0, 1.0, 1.0]
    assert gradient(torch_ops.relu, at) == [0.0, 0.0, 1.0, 1.0]
    assert gradient(lambda x: torch_ops.clip(x, -0.5, 0.5), at) == [1.0, 1.0, 1.0, 0.0]
    assert gradient(torch_ops.maximum, [1.0, 2.0], [1.0, 1.0]) == [0.5, 1.0]
    assert gradient(torch_ops.minimum, [1.0, 2.0], [1.0, 1.0], position=1) == [0.5, 1.0]
    assert gradient(lambda x: torch_ops.maximum(x, 0.0), [0.0, 1.0]) == [0.5, 1.0]
    assert gradient(torch_ops.max, [2.0, 1.0, 2.0]) == [0.5, 0.0, 0.5]
    first = gradient(lambda x: torch_ops.max_pool(x, 3), [[[1.0], [3.0], [3.0]]])
    assert first == [[[0.0], [1.0], [0.0]]]
    # The exponent's gradient is zero wherever the base is not positive (torch's is NaN).
    exponent = gradient(torch_ops.power, [-2.0, 0.0, 2.0], [2.0, 2.0, 2.0], position=1)
    assert exponent == [0.0, 0.0, pytest.approx(4 * math.log(2))]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_row_that_keeps_nothing_gives_zeros_and_zero_gradients(dtype):
    rng = np.random.default_rng(0)
    q, k, v = (torch_ops.asarray(rng.standard_normal((2, 3, 4)), dtype) for _ in range(3))
    mask = torch.tensor([[False, True, True], [False, False, False], [True, True, True]])

    def attend(q, k, v):  # with causal, row 0 keeps nothing either
        return torch_ops.scaled_dot_product_attention(q, k, v, mask=mask, causal=True)

    (out,), pullback = torch_ops.vjp(attend, [q, k, v], [0, 1, 2])
    grads = pullback([torch.ones_like(out)])
    assert torch.equal(out[:, :2].float(), torch.zeros(2, 2, 4))
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert torch.equal(grads[0][:, :2].float(), torch.zeros(2, 2, 4))


def test_pooling_takes_padding_wider_than_half_the_window():
    x = np.arange(1.0, 7.0).reshape(1, 6, 1)  # torch's own layers refuse padding 2 here
    tensor = torch_ops.asarray(x)
    padded = np.pad(x[0, :, 0], 2, constant_values=np.nan)
    windows = [padded[i : i + 3] for i in range(0, 8, 2)]
    want_max = [np.nanmax(w) for w in windows]
    want_mean = [np.nanmean(w) for w in windows]
    assert torch_ops.max_pool(tensor, 3, 2, padding=2)[0, :, 0].tolist() == want_max
    assert torch_ops.avg_pool(tensor, 3, 2, padding=2)[0, :, 0].tolist() == pytest.approx(want_mean)


def test_a_python_number_keeps_the_dtype_of_the_array_beside_it():
    half = torch.ones((), dtype=torch.float16)  # 0-d, where a 0-d float32 would widen it
    for fn in (torch_ops.maximum, torch_ops.minimum, torch_ops.add, torch_ops.power):
        assert torch_ops.dtype(fn(half, 0.3)) == "float16"
        assert torch_ops.dtype(fn(0.3, half)) == "float16"
    assert torch_ops.dtype(torch_ops.maximum(torch.ones(2, dtype=torch.int64), 0.5)) == "float32"
    assert torch_ops.logical_and(True, torch.tensor([True, False])).tolist() == [True, False]


def test_new_arrays_go_to_the_default_device_and_derived_ones_follow_their_array():
    torch_ops.set_default_device("meta")
    try:
        made = [
            torch_ops.zeros((2,)),
            torch_ops.full((2,), 1.0),
            torch_ops.arange(3),
            torch_ops.asarray(np.zeros(2)),
            torch_ops.asarray([1.0]),
        ]
        assert {m.device.type for m in made} == {"meta"}
        assert torch_ops.zeros_like(torch.ones(2)).device.type == "cpu"
    finally:
        torch_ops.set_default_device(None)
    assert torch_ops.zeros((2,)).device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA matter")
def test_every_case_and_its_gradient_run_on_cuda_without_a_host_sync():
    torch_ops.set_default_device("cuda")
    try:
        for case in OP_CASES:
            arrays = [
                torch_ops.asarray(a, "float32" if a.dtype.kind == "f" else None)
                for a in make_inputs(case)
            ]
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                with ops.using(torch_ops):
                    outputs, pullback = torch_ops.vjp(
                        lambda *xs, case=case: case.call(ops, *xs), arrays, case.grad_positions()
                    )
                    pullback([torch.ones_like(o) for o in outputs])
                    # A number operand travels as a 0-d CPU tensor, a scalar to the kernel.
                    torch_ops.maximum(arrays[-1], 0.0)
                    torch_ops.logical_and(torch_ops.greater(arrays[-1], 0.0), True)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        torch_ops.set_default_device(None)
