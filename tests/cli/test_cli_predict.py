"""``unitrain predict``: a checkpoint's outputs for a .npy of inputs, on any backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _backends import installed

from unitrain import Trainer, TrainerConfig, models, optim
from unitrain.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trainer, np.ndarray]:
    """A checkpoint of a small conv net trained one epoch on numpy, and inputs for it."""
    folder = tmp_path_factory.mktemp("predict")
    model = models.Sequential(
        [models.Conv2d(1, 4, 3), models.ReLU(), models.Flatten(), models.Linear(4 * 6 * 6, 3)]
    )
    x = np.random.default_rng(0).normal(size=(40, 8, 8, 1)).astype(np.float32)
    y = np.arange(40) % 3
    config = TrainerConfig(epochs=1, batch_size=10, device="cpu")
    trainer = Trainer(model, backend="numpy", optimizer=optim.SGD(), config=config)
    trainer.fit((x, y))
    checkpoint = trainer.save_checkpoint(folder / "ckpt")
    np.save(folder / "x.npy", x[:7])
    return checkpoint, trainer, x[:7]


@pytest.mark.parametrize("backend", installed("numpy", "torch"))
def test_predict_writes_the_trainers_outputs_on_any_backend(trained, backend, tmp_path, capsys):
    checkpoint, trainer, x = trained
    out = tmp_path / "y.npy"
    inputs = str(checkpoint.parent / "x.npy")
    args = ["predict", str(checkpoint), "--input", inputs, "--output", str(out)]
    assert main([*args, "--backend", backend]) == 0
    assert f"7 outputs of shape (3,) on {backend} (cpu)" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(out), trainer.predict(x), rtol=1e-5, atol=1e-6)


def test_predict_defaults_to_the_backend_that_trained_it_and_writes_beside_the_input(trained):
    checkpoint, trainer, x = trained
    assert main(["predict", str(checkpoint), "--input", str(checkpoint.parent / "x.npy")]) == 0
    np.testing.assert_array_equal(np.load(checkpoint.parent / "x.out.npy"), trainer.predict(x))


def test_predict_refuses_a_pickled_array_and_other_files(trained, tmp_path, capsys):
    checkpoint = str(trained[0])
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert main(["predict", checkpoint, "--input", str(pickled)]) != 0
    assert "not a plain numpy array file" in capsys.readouterr().err
    (tmp_path / "x.csv").write_text("1,2\n")
    assert main(["predict", checkpoint, "--input", str(tmp_path / "x.csv")]) != 0
    assert "give a .npy file" in capsys.readouterr().err
    assert main(["predict", checkpoint, "--input", str(tmp_path / "none.npy")]) != 0
    assert "no such file" in capsys.readouterr().err
