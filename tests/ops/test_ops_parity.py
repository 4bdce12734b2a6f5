"""Every backend's ops against the float64 numpy reference, case by case, in float64: the
kit's ``ops`` family runs the same cases in each dtype a backend declares
(``tests/conformance/test_conformance.py``); float64 is run here for every backend, JAX
included, whose kit run declares float32 only."""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import pytest
from _backends import installed

from unitrain.conformance._op_cases import OP_CASES
from unitrain.conformance._op_run import relative_error, run_case

#: Normwise relative error allowed per dtype: a few units in the last place of one op.
BARS = {"float64": 1e-12}
BACKENDS = installed()


def ops_of(backend: str):
    return importlib.import_module(f"unitrain.backends.{backend}.ops")


@pytest.fixture(scope="module")
def reference():
    """The float64 reference on the values a backend in ``dtype`` is given."""
    cache = {}

    def get(case, dtype):
        if (case.name, dtype) not in cache:
            cache[case.name, dtype] = run_case(ops_of("numpy"), case, "float64", dtype)
        return cache[case.name, dtype]

    return get


@pytest.mark.parametrize("case", OP_CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("dtype", list(BARS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_op_and_its_gradient_match_the_reference(backend, dtype, case, reference):
    outputs, grads = run_case(ops_of(backend), case, dtype)
    want_outputs, want_grads = reference(case, dtype)
    bar = BARS[dtype]
    assert len(outputs) == len(want_outputs)
    for got, want in zip(outputs, want_outputs):
        assert relative_error(got, want) <= bar, f"output off by {relative_error(got, want):.2e}"
    for position, got, want in zip(case.grad_positions(), grads, want_grads):
        error = relative_error(got, want)
        assert error <= bar, f"gradient of input {position} off by {error:.2e}"
    assert all(np.isfinite(g).all() for g in grads)
