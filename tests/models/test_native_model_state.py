"""Model state of native models: a BatchNorm CNN written natively for torch, JAX and Keras.

Its running statistics are model state: in the checkpoint, restored on resume (a SIGKILL and
``resume="latest"`` end bit-identical to the uninterrupted run), read and left untouched by
evaluate, and the checkpoint's ``model.safetensors`` loads back into the native model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _backends import backends
from safetensors.numpy import load_file

from unitrain import Trainer, TrainerConfig, callbacks, optim, schedules
from unitrain.checkpoint import list_checkpoints
from unitrain.recipes import load_digits

FRAMEWORKS = backends("torch", "jax", "tensorflow")
EPOCHS = 3
#: The GPU check (benchmarks/gpu_check.sh) runs these tests on the GPU.
DEVICE = os.environ.get("UNITRAIN_TEST_DEVICE", "cpu")
#: Where each framework keeps a running mean, as a state-dict name.
RUNNING_MEAN = {"torch": "bn.running_mean", "jax": "bn.mean", "tensorflow": "cnn.bn.moving_mean"}


def torch_cnn():
    import torch
    from torch import nn

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.head = nn.Linear(512, 10)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x.reshape(-1, 1, 8, 8))))
            return self.head(h.flatten(1))

    torch.manual_seed(0)
    return CNN()


def jax_cnn():
    import jax
    import jax.numpy as jnp

    from unitrain.backends.jax import JaxModel

    rng = np.random.default_rng(0)
    params = {
        "conv.kernel": rng.uniform(-1 / 3, 1 / 3, (3, 3, 1, 8)).astype(np.float32),
        "conv.bias": np.zeros(8, np.float32),
        "bn.scale": np.ones(8, np.float32),
        "bn.offset": np.zeros(8, np.float32),
        "head.kernel": rng.uniform(-0.044, 0.044, (512, 10)).astype(np.float32),
        "head.bias": np.zeros(10, np.float32),
    }
    state = {"bn.mean": np.zeros(8, np.float32), "bn.var": np.ones(8, np.float32)}

    def apply(p, s, x, *, train, rng):
        h = (
            jax.lax.conv_general_dilated(
                x.reshape(-1, 8, 8, 1),
                p["conv.kernel"],
                (1, 1),
                ((1, 1), (1, 1)),
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
            + p["conv.bias"]
        )
        if train:
            mean, var = h.mean(axis=(0, 1, 2)), h.var(axis=(0, 1, 2))
            n = h.shape[0] * h.shape[1] * h.shape[2]
            s = {
                "bn.mean": 0.9 * s["bn.mean"] + 0.1 * mean,
                "bn.var": 0.9 * s["bn.var"] + 0.1 * var * n / (n - 1),
            }
        else:
            mean, var = s["bn.mean"], s["bn.var"]
        h = (h - mean) * jax.lax.rsqrt(var + 1e-5) * p["bn.scale"] + p["bn.offset"]
        h = jnp.maximum(h, 0).reshape(h.shape[0], -1)
        return h @ p["head.kernel"] + p["head.bias"], s

    return JaxModel(apply, params, state)


def tensorflow_cnn():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Reshape((8, 8, 1), name="reshape"),
            keras.layers.Conv2D(8, 3, padding="same", name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(name="relu"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(10, name="head"),
        ],
        name="cnn",
    )


NATIVE = {"torch": torch_cnn, "jax": jax_cnn, "tensorflow": tensorflow_cnn}


def digits_arrays():
    split = load_digits()
    return split.x_train[:360], split.y_train[:360], split.x_val[:120], split.y_val[:120]


def make_trainer(framework: str, out: Path, extra=()):
    hooks = [
        callbacks.EarlyStopping("val_loss", patience=5, restore_best_weights=True),
        callbacks.ModelCheckpoint(out / "ckpt", every_n_steps=5, keep_last=3),
        *extra,
    ]
    return Trainer(
        NATIVE[framework](),
        backend=framework,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.CosineDecay(0.1, 12 * EPOCHS),
        callbacks=hooks,
        config=TrainerConfig(
            epochs=EPOCHS, seed=3, device=DEVICE, checkpoint_dir=str(out / "ckpt")
        ),
    )


SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path[:0] = [{tests!r}, {shared!r}]  # this test's folder, and tests/ (_backends)
    from test_native_model_state import make_trainer, digits_arrays
    framework, out = sys.argv[1], Path(sys.argv[2])
    kill_step, resume = int(sys.argv[3]), sys.argv[4]

    class Kill:
        def on_batch_end(self, trainer, batch, logs):
            if trainer.state.step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)

    trainer = make_trainer(framework, out, extra=[Kill()] if kill_step else [])
    x, y, xv, yv = digits_arrays()
    trainer.fit((x, y), (xv, yv), resume=resume if resume != "-" else None)
    from safetensors.numpy import save_file
    save_file(trainer.backend.state_dict(), str(out / "final.safetensors"))
    """
)


def run_script(framework, out, kill_step, resume):
    code = SCRIPT.format(tests=str(Path(__file__).parent), shared=str(Path(__file__).parents[1]))
    return subprocess.run(
        [sys.executable, "-c", code, framework, str(out), str(kill_step), resume],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )


@pytest.mark.harness  # a run, then a killed and a resumed subprocess: 19-33 s per framework
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_running_statistics_are_checkpointed_and_resume_after_sigkill_is_bit_exact(
    framework, tmp_path
):
    x, y, xv, yv = digits_arrays()
    straight = make_trainer(framework, tmp_path / "straight")
    history = straight.fit((x, y), (xv, yv))
    assert history[-1]["val_accuracy"] > 0.5  # it learns: the statistics are real ones
    expected = straight.backend.state_dict()
    mean = f"model.{RUNNING_MEAN[framework]}"
    assert mean in expected
    assert np.abs(expected[mean]).max() > 0.01  # moved away from its initial zeros

    newest = list_checkpoints(tmp_path / "straight" / "ckpt")[-1]
    saved = load_file(str(newest / "model.safetensors"))
    assert RUNNING_MEAN[framework] in saved

    killed = run_script(framework, tmp_path / "run", 17, "-")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_script(framework, tmp_path / "run", 0, "latest")
    assert resumed.returncode == 0, resumed.stderr
    final = load_file(str(tmp_path / "run" / "final.safetensors"))
    assert final.keys() == expected.keys()
    for key, value in expected.items():
        assert np.array_equal(final[key], value), f"{key} differs after a kill at step 17"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_evaluate_reads_the_state_and_leaves_it_alone(framework):
    x, y, xv, yv = digits_arrays()
    trainer = make_trainer(framework, Path("unused"))
    trainer.callbacks.callbacks.clear()
    backend = trainer.backend
    for start in range(0, 96, 32):
        backend.forward((x[start : start + 32], y[start : start + 32]))
        backend.backward()
        backend.step(0.05)
    before = backend.state_dict()
    first = float(backend.evaluate((xv, yv))["loss"])
    after = backend.state_dict()
    for key, value in before.items():
        assert np.array_equal(after[key], value), f"evaluate changed {key}"
    # evaluate uses the running statistics: other statistics give another loss
    changed = dict(before)
    changed[f"model.{RUNNING_MEAN[framework]}"] = before[f"model.{RUNNING_MEAN[framework]}"] + 1.0
    backend.load_state_dict(changed)
    assert float(backend.evaluate((xv, yv))["loss"]) != pytest.approx(first, rel=1e-3)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_checkpoint_loads_into_the_native_model(framework, tmp_path):
    x, y, xv, yv = digits_arrays()
    trainer = make_trainer(framework, tmp_path)
    trainer.fit((x, y), (xv, yv))
    saved = load_file(str(list_checkpoints(tmp_path / "ckpt")[-1] / "model.safetensors"))
    expected = trainer.backend.state_dict()
    for key, value in saved.items():
        assert np.array_equal(value, expected[f"model.{key}"])  # the last save is the final state
    native = NATIVE[framework]()
    if framework == "torch":
        import torch

        native.load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()})
        native.eval()
        with torch.no_grad():
            logits = native(torch.from_numpy(xv)).numpy()
    elif framework == "jax":
        params = {k: saved[k] for k in native.params}
        state = {k: saved[k] for k in native.state}
        logits, _ = native.apply(params, state, xv, train=False, rng=None)
    else:
        for variable in native.variables:
            variable.assign(saved[variable.path.replace("/", ".")])
        logits = native(xv, training=False).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == yv))
    assert accuracy == pytest.approx(float(trainer.backend.evaluate((xv, yv))["accuracy"]))
