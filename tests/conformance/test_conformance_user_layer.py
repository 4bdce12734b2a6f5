"""The kit on a researcher's own layer: ``unitrain conformance --layer``, ``check_layer``."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unitrain import ConfigError, ops
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.numpy import ops as numpy_ops
from unitrain.cli import main
from unitrain.conformance import check_layer
from unitrain.conformance._user_layers import framework_calls, layer_cases
from unitrain.models import AbstractLayer, Linear, Scope, Sequential

EXAMPLE = Path(__file__).parents[2] / "examples" / "user_layer"


@dataclasses.dataclass(frozen=True)
class Centered(AbstractLayer, type_name="test_centered"):
    """``(x - mean(x)) * scale`` over the features: a reduction for a wrong axis to break."""

    features: int

    def own_param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"scale": (self.features,)}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"scale": rng.uniform(0.5, 1.5, self.features)}

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.tanh(x - ops.mean(x, axis=-1, keepdims=True)) * scope.param("scale")

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    @classmethod
    def conformance_cases(cls) -> list[Any]:
        return [("centered", Sequential((cls(5), Linear(5, 3))), (4, 6, 5))]


def _ops_with(**replaced: Any) -> types.ModuleType:
    """The reference's ops module with some functions replaced: a backend's own bug."""
    module = types.ModuleType("faulty_ops")
    module.__dict__.update(vars(numpy_ops))
    module.__dict__.update(replaced)
    return module


class MeanOverWrongAxis(NumpyBackend):
    """``mean`` with keepdims reduces the first axis it is given as the last: an axis bug."""

    ops = _ops_with(
        mean=lambda x, axis=None, keepdims=False: (
            numpy_ops.mean(x, 0, keepdims) if keepdims else numpy_ops.mean(x, axis, keepdims)
        )
    )


class TanhInFloat32(NumpyBackend):
    """``tanh`` computed through float32 whatever the dtype: a float32 kernel in a float64 row."""

    ops = _ops_with(
        tanh=lambda x: numpy_ops.cast(
            numpy_ops.tanh(numpy_ops.cast(x, "float32")), numpy_ops.dtype(x)
        )
    )


def _failed(results: list[Any]) -> list[str]:
    return [result.id for result in results if result.status == "failed"]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_example_layer_conforms(backend, monkeypatch):
    pytest.importorskip(backend)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    results = check_layer("dyt:DyT", backend=backend)
    assert results and not _failed(results), [(r.id, r.reason) for r in results]
    assert {r.id.split("::")[0] for r in results} == {"layers", "handoff"}
    for result in results:  # a hand-off needs a peer in the dtype: none has bfloat16
        assert result.status == "passed" or (
            result.status == "skipped" and "bfloat16" in result.id and "handoff" in result.id
        ), result


def test_a_layer_from_a_class_conforms_on_the_reference():
    results = check_layer(Centered, backend="numpy", dtypes=["float64"])
    assert [r.status for r in results] == ["passed", "passed"]


@pytest.mark.parametrize("fault", [MeanOverWrongAxis, TanhInFloat32])
def test_a_backend_bug_in_the_layers_path_fails_it(fault):
    results = check_layer(Centered, backend=fault, dtypes=["float64"])
    assert "layers::user-centered[cpu-float64]" in _failed(results), results


def test_a_forward_that_calls_a_framework_is_refused_with_the_call(tmp_path, monkeypatch):
    (tmp_path / "native_layer.py").write_text(
        "import dataclasses\n"
        "import torch\n"
        "from torch import tanh\n"
        "from unitrain.models import AbstractLayer\n\n\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class Native(AbstractLayer, type_name='test_native'):\n"
        "    def forward(self, scope, x):\n"
        "        return torch.nn.functional.relu(tanh(x))\n\n"
        "    def _output_shape(self, shape):\n"
        "        return shape\n\n"
        "    @classmethod\n"
        "    def conformance_cases(cls):\n"
        "        return [(cls(), (2, 3))]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"torch\.nn\.functional\.relu \(line 10 of .*"):
        check_layer("native_layer:Native", backend="numpy")
    native = sys.modules["native_layer"].Native
    assert [c.split(" (")[0] for c in framework_calls(native)] == [
        "torch.nn.functional.relu",
        "tanh",
    ]
    assert framework_calls(Centered) == []


def test_a_target_without_cases_says_what_to_write():
    with pytest.raises(ConfigError, match="conformance_cases"):
        layer_cases(Linear)
    with pytest.raises(ConfigError, match=r"must be \(id, layer, input_shape_with_batch\)"):
        layer_cases(lambda: [("x", "not a layer", (1, 2))])
    with pytest.raises(ConfigError, match="cannot import"):
        layer_cases("no_such_module_here:Layer")
    assert layer_cases(lambda: [(Linear(2, 2), (3, 2))])[0][0] == "linear-0"


def test_the_command_line_certifies_a_layer(monkeypatch, capsys):
    monkeypatch.chdir(EXAMPLE)
    code = main(["conformance", "--backend", "numpy", "--layer", "dyt:DyT", "--dtype", "float64"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verdict: conforms" in out and "layers" in out and "handoff" in out
