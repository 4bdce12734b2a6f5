"""Native exports compute what predict computes, in each framework's own layers.

Every layer case of the kit and the paper models are exported to torch, Keras and JAX with
non-trivial weights (BatchNorm statistics included) and run in eval mode against the
float64 numpy reference, with the tolerance of the ONNX export. The sweep over every case
is a harness test (Keras builds and JAX's eager ops take about a minute per framework on a
shared 2-core machine); the default run checks a few cases that cover each family.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_export_onnx import TOLERANCE, _error, _input, _paper_models, _reference_trainer

from unitrain import ConfigError, Trainer, UnitrainError, export_native, export_weights, ops
from unitrain.cli import main
from unitrain.conformance._layer_cases import LAYER_CASES
from unitrain.models import (
    LSTM,
    MLP,
    AbstractLayer,
    Conv2d,
    Linear,
    Scope,
    Sequential,
)

#: What each framework refuses, by layer case, and the words its error must hold.
REFUSED = {}
#: The default run's cases: one per family in torch, two in JAX (its eager ops are slow on
#: a small CPU); Keras builds, and TensorFlow's import, take long enough that its checks
#: are harness tests only, with the sweep over every case.
QUICK = [
    *[
        ("torch", name)
        for name in ("cnn", "conv_same_dilated_grouped", "conv_transpose", "transformer_post_ln")
    ],
    ("torch", "gru_last"),
    ("jax", "cnn"),
    ("jax", "gru_last"),
]
CASES = {case[0]: case for case in LAYER_CASES}


def _run(framework: str, trainer: Trainer, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The exported model's output on ``x`` (float32 or int64 ids)."""
    if framework == "torch":
        torch = pytest.importorskip("torch")
        module = export_native(trainer, "torch")
        with torch.no_grad():
            return module(torch.from_numpy(x)).numpy()
    if framework == "keras":
        pytest.importorskip("keras")
        model = export_native(trainer, "keras", input_shape=shape[1:])
        return np.asarray(model(x, training=False))
    pytest.importorskip("jax")
    apply, params = export_native(trainer, "jax")
    return np.asarray(apply(params, x))


def _check(framework: str, model: AbstractLayer, shape: tuple[int, ...]) -> None:
    trainer = _reference_trainer(model)
    x = _input(model, shape)
    expected = trainer.predict(x.astype(np.float64) if x.dtype.kind == "f" else x)
    got = _run(framework, trainer, x, shape)
    assert got.dtype == np.float32 and got.shape == expected.shape
    error = _error(got, expected)
    assert error < TOLERANCE, f"{framework}: max error {error:.2e}"


def _check_case(framework: str, name: str) -> None:
    _, layer, shape = CASES[name]
    refused = REFUSED.get((framework, name))
    if refused is None:
        _check(framework, layer, shape)
        return
    with pytest.raises(ConfigError, match=refused) as caught:
        _run(framework, _reference_trainer(layer), _input(layer, shape), shape)
    assert f"has no {framework} form" in str(caught.value)


@pytest.mark.parametrize(("framework", "name"), QUICK)
def test_a_case_of_each_family_matches_predict(framework, name):
    _check_case(framework, name)


@pytest.mark.harness
@pytest.mark.parametrize("framework", ["torch", "keras", "jax"])
@pytest.mark.parametrize("name", list(CASES))
def test_every_layer_case_matches_predict(framework, name):
    _check_case(framework, name)


@pytest.mark.harness
@pytest.mark.parametrize("framework", ["torch", "keras", "jax"])
@pytest.mark.parametrize("name", ["lenet5", "resnet", "char_transformer"])
def test_paper_models_match_predict(framework, name, monkeypatch):
    model, shape = _paper_models(monkeypatch)[name]
    _check(framework, model, shape)


def test_the_character_transformer_in_torch_matches_predict(monkeypatch):
    model, shape = _paper_models(monkeypatch)["char_transformer"]
    _check("torch", model, shape)


def test_torch_gets_torch_nn_layers_and_a_state_dict_that_loads_strictly():
    torch = pytest.importorskip("torch")
    _, model, _ = CASES["cnn"]
    module = export_native(_reference_trainer(model), "torch")
    kinds = {type(m) for m in module.modules()}
    assert {torch.nn.Conv2d, torch.nn.BatchNorm1d, torch.nn.MaxPool2d, torch.nn.Linear} <= kinds
    assert not module.training
    state = module.state_dict()
    assert state["5.weight"].shape == (3, 36)  # nn.Linear's (out, in)
    fresh = export_native(_reference_trainer(model), "torch")
    assert str(fresh.load_state_dict(state, strict=True)) == "<All keys matched successfully>"
    with pytest.raises(RuntimeError, match="Missing key"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "5.bias"}, strict=True)


def test_the_mlp_module_loads_export_weights():
    torch = pytest.importorskip("torch")
    trainer = Trainer(MLP((4, 3, 2)), backend="numpy")
    module = export_native(trainer, "torch")
    module.load_state_dict(export_weights(trainer, "torch"), strict=True)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, trainer.predict(x), atol=1e-6)


@pytest.mark.harness
def test_keras_takes_its_own_weights_back_and_keeps_the_layout():
    pytest.importorskip("keras")
    _, model, shape = CASES["cnn"]
    keras_model = export_native(_reference_trainer(model), "keras", input_shape=shape[1:])
    kinds = [type(layer).__name__ for layer in keras_model.layers]
    assert kinds[:3] == ["InputLayer", "ZeroPadding2D", "Conv2D"] and "BatchNormalization" in kinds
    weights = keras_model.get_weights()
    keras_model.set_weights([w * 0 for w in weights])
    keras_model.set_weights(weights)
    assert all(np.array_equal(a, b) for a, b in zip(keras_model.get_weights(), weights))


@pytest.mark.harness
def test_keras_needs_the_input_shape_of_a_model_that_does_not_start_dense():
    pytest.importorskip("keras")
    trainer = _reference_trainer(Sequential([Conv2d(1, 2, 3)]))
    with pytest.raises(ConfigError, match="export_native: the input shape of"):
        export_native(trainer, "keras")


def test_the_jax_function_is_pure_and_its_params_are_the_canonical_tensors():
    jax = pytest.importorskip("jax")
    _, model, shape = CASES["lstm"]
    trainer = _reference_trainer(model)
    apply, params = export_native(trainer, "jax")
    assert sorted(params) == sorted(model.param_shapes())
    assert all(p.dtype == np.float32 for p in params.values())
    x = _input(model, shape)
    compiled = np.asarray(jax.jit(apply)(params, x))
    assert _error(compiled, trainer.predict(x.astype(np.float64))) < TOLERANCE
    moved = {**params, "weight_ih": params["weight_ih"] * 2}
    assert not np.allclose(np.asarray(jax.jit(apply)(moved, x)), compiled)


@dataclasses.dataclass(frozen=True)
class Doubled(AbstractLayer, type_name="native_export_test_doubled"):
    """A user's layer: its forward is written in ops, which no framework's layers know."""

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.multiply(x, 2.0)

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape


@pytest.mark.parametrize(
    "framework", ["torch", pytest.param("keras", marks=pytest.mark.harness), "jax"]
)
def test_a_layer_of_your_own_is_refused_naming_it_and_the_framework(framework):
    pytest.importorskip({"keras": "keras"}.get(framework, framework))
    trainer = Trainer(Sequential([Linear(3, 3), Doubled()]), backend="numpy")
    with pytest.raises(ConfigError, match=f"Doubled.*at '1'.*no {framework} form.*export_onnx"):
        export_native(trainer, framework)


def test_an_unknown_framework_is_refused():
    trainer = Trainer(MLP((2, 2)), backend="numpy")
    with pytest.raises(ConfigError, match=r"unknown framework 'flax'; choose one of \['jax'"):
        export_native(trainer, "flax")


def test_a_checkpoint_exports_like_its_trainer(tmp_path):
    torch = pytest.importorskip("torch")
    trainer = Trainer(
        Sequential([LSTM(3, 4, return_sequences=False), Linear(4, 2)]), backend="numpy"
    )
    path = trainer.save_checkpoint(tmp_path / "checkpoint")

    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    with torch.no_grad():
        got = export_native(path, "torch")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, trainer.predict(x), atol=1e-5)


def test_importing_unitrain_does_not_import_the_exporters():
    code = "import sys, unitrain; print(sorted(m for m in sys.modules if 'native_export' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _checkpoint(tmp_path: Path, name: str) -> tuple[Path, np.ndarray, np.ndarray]:
    """A checkpoint of layer case ``name``, an input with another batch size than the
    case's (the batch axis is free) and the reference's output on it."""
    _, model, shape = CASES[name]
    trainer = _reference_trainer(model)
    x = _input(model, (shape[0] + 1, *shape[1:]))
    expected = trainer.predict(x.astype(np.float64) if x.dtype.kind == "f" else x)
    return trainer.save_checkpoint(tmp_path / name), x, expected


@pytest.mark.harness
def test_unitrain_export_writes_a_torch_program_and_a_jax_program_with_its_params(tmp_path):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    from safetensors.numpy import load_file

    checkpoint, x, expected = _checkpoint(tmp_path, "conv_same_dilated_grouped")
    shape = ["--input-shape", ",".join(str(n) for n in x.shape[1:])]
    out = tmp_path / "model.pt2"
    assert main(["export", str(checkpoint), "--format", "torch", "--out", str(out), *shape]) == 0
    program = torch.export.load(out).module()
    assert _error(program(torch.from_numpy(x)).detach().numpy(), expected) < TOLERANCE
    out = tmp_path / "model.jax"
    assert main(["export", str(checkpoint), "--format", "jax", "--out", str(out), *shape]) == 0
    exported = jax.export.deserialize(bytearray(out.read_bytes()))
    params = load_file(tmp_path / "model.safetensors")
    assert sorted(params) == ["bias", "weight"]  # canonical names
    assert _error(np.asarray(exported.call(params, x)), expected) < TOLERANCE


@pytest.mark.harness
def test_unitrain_export_writes_a_keras_file_that_keras_loads(tmp_path):
    keras = pytest.importorskip("keras")
    import unitrain.native_export.keras_layers  # noqa: F401  # the positions' layers

    for name in ("cnn", "positional_embedding"):
        checkpoint, x, expected = _checkpoint(tmp_path, name)
        out = tmp_path / f"{name}.keras"
        shape = ",".join(str(n) for n in x.shape[1:])
        args = ["export", str(checkpoint), "--format", "keras", "--out", str(out)]
        assert main([*args, "--input-shape", shape]) == 0
        model = keras.saving.load_model(out)
        assert _error(np.asarray(model(x, training=False)), expected) < TOLERANCE


@pytest.mark.harness
def test_the_torch_and_jax_files_load_without_unitrain(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    checkpoint, x, expected = _checkpoint(tmp_path, "transformer_post_ln")
    np.save(tmp_path / "x.npy", x)
    shape = ["--input-shape", ",".join(str(n) for n in x.shape[1:])]
    for fmt in ("torch", "jax"):
        out = tmp_path / f"model.{'pt2' if fmt == 'torch' else 'jax'}"
        assert main(["export", str(checkpoint), "--format", fmt, "--out", str(out), *shape]) == 0
    code = (  # run in tmp_path: the files by their names
        "import sys, numpy as np, torch, jax\n"
        "from safetensors.numpy import load_file\n"
        "x = np.load('x.npy')\n"
        "program = torch.export.load('model.pt2').module()\n"
        "np.save('torch.npy', program(torch.from_numpy(x)).detach().numpy())\n"
        "exported = jax.export.deserialize(bytearray(open('model.jax', 'rb').read()))\n"
        "np.save('jax.npy', np.asarray(exported.call(load_file('model.safetensors'), x)))\n"
        "assert not [m for m in sys.modules if m.startswith('unitrain')]\n"
    )
    outputs = [tmp_path / "torch.npy", tmp_path / "jax.npy"]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    for path in outputs:
        assert _error(np.load(path), expected) < TOLERANCE, path.name


def test_unitrain_export_refuses_an_onnx_option_or_a_wrong_suffix_for_a_native_format(
    tmp_path, capsys
):
    checkpoint, _, _ = _checkpoint(tmp_path, "linear")
    assert main(["export", str(checkpoint), "--format", "jax", "--opset", "18"]) == 2
    assert "--opset is for --format onnx, not jax" in capsys.readouterr().err
    out = tmp_path / "model.onnx"
    assert main(["export", str(checkpoint), "--format", "torch", "--out", str(out)]) == 2
    assert "--format torch writes a .pt2 file; got --out" in capsys.readouterr().err


ERRORS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def _portable(model: AbstractLayer) -> Trainer:
    return Trainer(model, backend="numpy")


#: Each error of docs/errors.md's "Native export" table: how to make it, and its message.
DOCUMENTED = {
    "unknown_framework": (
        lambda: export_native(_portable(MLP((2, 2))), "flax"),
        "export_native: unknown framework 'flax'; choose one of ['jax', 'keras', 'torch']",
    ),
    "own_layer": (
        lambda: export_native(_portable(Sequential([Linear(3, 3), Doubled()])), "torch"),
        "export_native: Doubled() (at '1') has no torch form: a layer of your own is written "
        "in unitrain.ops, not in the framework's layers; export it with export_onnx (traced op "
        "by op), or write it as a torch layer and load its weights by their canonical names",
    ),
    "keras_input_shape": (
        lambda: export_native(_portable(Sequential([Conv2d(1, 2, 3)])), "keras"),
        "export_native: the input shape of Sequential of 1 layers is not in the model (it "
        "starts with Conv2d); pass input_shape= the shape of one example, e.g. (28, 28, 1) for "
        "images or (128,) for sequences of 128 token ids",
    ),
}


@pytest.mark.parametrize(
    "name",
    [  # Keras' errors need Keras built (TensorFlow's import): harness tests
        pytest.param(name, marks=pytest.mark.harness) if name.startswith("keras") else name
        for name in sorted(DOCUMENTED)
    ],
)
def test_documented_error(name):
    if name.startswith("keras"):
        pytest.importorskip("keras")
    make, message = DOCUMENTED[name]
    with pytest.raises(UnitrainError) as raised:
        make()
    assert str(raised.value) == message
    section = ERRORS_PAGE.read_text(encoding="utf-8").split("## Native export", 1)[-1]
    section = section.split("\n## ", 1)[0]
    assert message in section and f"`test_documented_error[{name}]`" in section
