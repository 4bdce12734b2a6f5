"""Experiment trackers: the small interface, and MLflow read back through its own client."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unitrain import (
    ConfigError,
    MissingFrameworkError,
    Trainer,
    TrainerConfig,
    callbacks,
    models,
    optim,
    schedules,
)
from unitrain.cli import main

ROOT = Path(__file__).resolve().parents[2]
needs_mlflow = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed"
)


def _data(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(n, 6)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


class _Stop(Exception):
    """Ends a run abruptly, as a crash would."""


class _StopAt(callbacks.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_end(self, trainer: Any, batch: int, logs: dict[str, Any]) -> None:
        if trainer.state.step == self.step:
            raise _Stop


def _trainer(tracker: Any, tmp_path: Path, epochs: int = 3, extra: tuple = ()) -> Trainer:
    config = TrainerConfig(
        epochs=epochs,
        batch_size=16,
        log_every_n_steps=2,
        seed=1,
        device="cpu",
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    hooks = [tracker, callbacks.ModelCheckpoint(every_n_epochs=1), *extra]
    return Trainer(
        models.MLP((6, 8, 2)),
        backend="numpy",
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.Constant(0.1),
        callbacks=hooks,
        config=config,
    )


class _Recorder(callbacks.TrackerLogger):
    """A third party's tracker: three methods, and a run id it continues on resume."""

    def __init__(self) -> None:
        self.params: list[dict[str, str]] = []
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.ended: list[str] = []
        self.run = "run-1"

    def log_hyperparams(self, params: Any) -> None:
        self.params.append(dict(params))

    def log_metrics(self, metrics: Any, step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    def finalize(self, status: str) -> None:
        self.ended.append(status)

    def run_state(self) -> dict[str, Any]:
        return {"id": self.run}

    def resume_run(self, state: Any) -> None:
        self.run = state["id"]


def test_a_tracker_gets_the_description_once_the_metrics_with_steps_and_the_end(tmp_path):
    tracker = _Recorder()
    trainer = _trainer(tracker, tmp_path)
    trainer.fit(_data(), _data(32))
    (params,) = tracker.params
    assert params["backend"] == "numpy" and params["config.epochs"] == "3"
    assert params["optimizer.type"] == "sgd" and params["model.sizes"] == "[6, 8, 2]"
    steps = [step for step, metrics in tracker.metrics if "train/loss" in metrics]
    assert steps == list(range(2, 13, 2))  # 4 updates an epoch, every 2nd logged
    epochs = [(step, m["epoch/epoch"]) for step, m in tracker.metrics if "epoch/val_loss" in m]
    assert epochs == [(4, 1.0), (8, 2.0), (12, 3.0)]
    last = trainer.history[-1]
    assert tracker.metrics[-1][1]["epoch/val_loss"] == pytest.approx(last["val_loss"])
    assert tracker.ended == ["success"]


def test_a_stopped_run_ends_as_stopped(tmp_path):
    tracker = _Recorder()
    stop = callbacks.EarlyStopping("val_loss", min_delta=10.0, patience=0)
    _trainer(tracker, tmp_path, epochs=5, extra=(stop,)).fit(_data(), _data(32))
    assert tracker.ended == ["stopped"]


def test_a_resumed_run_continues_the_trackers_run(tmp_path):
    first = _Recorder()
    first.run = "run-7"
    with pytest.raises(_Stop):
        _trainer(first, tmp_path, extra=(_StopAt(6),)).fit(_data(), _data(32))
    resumed = _Recorder()
    _trainer(resumed, tmp_path).fit(_data(), _data(32), resume="latest")
    assert resumed.run == "run-7"
    assert [step for step, m in resumed.metrics if "epoch/val_loss" in m] == [8, 12]


@needs_mlflow
def test_mlflow_holds_the_params_the_metric_history_and_a_resume_appends(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(_Stop):
        where = str(tmp_path / "artifacts")
        tracker = callbacks.MLflowLogger("t", uri, "digits", artifact_location=where)
        _trainer(tracker, tmp_path, extra=(_StopAt(6),)).fit(_data(), _data(32))
    again = callbacks.MLflowLogger("t", uri, "digits", log_checkpoints=True)
    trainer = _trainer(again, tmp_path)
    trainer.fit(_data(), _data(32), resume="latest")
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert run.info.run_id == tracker.run_id == again.run_id
    assert run.info.status == "FINISHED" and run.data.tags["unitrain.end"] == "success"
    assert run.data.params["config.epochs"] == "3"
    assert run.data.params["optimizer.momentum"] == "0.9"
    history = client.get_metric_history(run.info.run_id, "epoch/val_loss")
    assert [m.step for m in history] == [4, 8, 12]  # epoch 1 before the crash, 2-3 after
    assert history[-1].value == pytest.approx(trainer.history[-1]["val_loss"])
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted({m.step for m in losses}) == list(range(2, 13, 2))
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert artifacts == ["checkpoints/epoch=0003-step=000012"]
    assert list((tmp_path / "artifacts").glob("*/artifacts/checkpoints/epoch=0003-*"))


@needs_mlflow
def test_unitrain_train_with_set_logs_to_mlflow(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recipe = (ROOT / "examples" / "recipes" / "digits.toml").read_text()
    recipe += '\n[[callbacks]]\ntype = "MLflowLogger"\nexperiment = "digits"\n'
    (tmp_path / "digits.toml").write_text(recipe)
    args = ["train", str(tmp_path / "digits.toml"), "--backend", "numpy", "--out"]
    args += [str(tmp_path / "run"), "--set", "config.epochs=2", "--set"]
    args += [f"callbacks.2.tracking_uri={uri}"]
    assert main(args) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    assert run.data.params["config.epochs"] == "2"
    assert run.data.params["model.sizes"] == "[64, 128, 10]"
    history = client.get_metric_history(run.info.run_id, "epoch/val_accuracy")
    assert [m.step for m in history] == [45, 90]


def test_mlflow_logger_without_mlflow_says_what_to_install(monkeypatch):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else found(name)
    )
    monkeypatch.delitem(sys.modules, "mlflow", raising=False)
    with pytest.raises(MissingFrameworkError, match=r"pip install 'unitrain\[mlflow\]'"):
        callbacks.MLflowLogger()


def test_the_tracker_base_class_is_refused_with_what_to_use():
    with pytest.raises(ConfigError, match="use MLflowLogger, or subclass it"):
        callbacks.TrackerLogger()


def test_a_tracker_gets_each_validation_by_steps_at_its_step(tmp_path):
    tracker = _Recorder()
    trainer = Trainer(
        models.MLP((6, 8, 2)),
        backend="numpy",
        callbacks=[tracker],
        config=TrainerConfig(epochs=1, batch_size=16, val_every_n_steps=2, device="cpu"),
    )
    trainer.fit(_data(), _data(32))
    steps = [(step, m["step/val_loss"]) for step, m in tracker.metrics if "step/val_loss" in m]
    assert steps == [(row["step"], row["val_loss"]) for row in trainer.step_history]
    assert [step for step, _ in steps] == [2, 4]
