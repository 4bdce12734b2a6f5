"""Data-parallel training on launched workers with a structured batch and a user objective.

``unitrain train --workers 2`` (torch DDP on gloo, started by torchrun) trains a recipe whose
batches carry dict inputs (two arrays), dict targets and sample weights, under a loss written
in ``unitrain.ops`` as an :class:`~unitrain.losses.Objective`; its final weights must equal
those of the same recipe on one worker. JAX's ``LocalDevices(2)`` (two logical CPUs in
one process) must equal one device on the same recipe. In-process simulated workers on the
same kind of batch are tested in ``test_structured_batches.py``; these are the real engines.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from unitrain import Trainer
from unitrain.backends.strategy import SimulatedWorkers
from unitrain.checkpoint import list_checkpoints, load_checkpoint

pytest.importorskip("torch")

#: The recipe both runs train: 48 examples in batches of 8, 3 epochs of SGD with momentum, in
#: float64. Each worker records its rank and the world size in the run folder.
RECIPE = """
import dataclasses
import os
from pathlib import Path
from typing import Any, ClassVar, final

import numpy as np

from unitrain import ArrayLoader, TrainerConfig, callbacks, losses, ops, optim, schedules
from unitrain.models import AbstractLayer, Linear, Scope
from unitrain.recipes import Recipe


@dataclasses.dataclass(frozen=True)
class TwoInputs(AbstractLayer, type_name="structured_parallel_two_inputs"):
    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return (("a", Linear(3, 8)), ("b", Linear(2, 8)), ("cls", Linear(8, 3)),
                ("reg", Linear(8, 1)))

    def forward(self, scope: Scope, x: Any) -> Any:
        hidden = ops.tanh(scope.call("a", x["x"]) + scope.call("b", x["z"]))
        return scope.call("cls", hidden), scope.call("reg", hidden)

    def _output_shape(self, shape: Any) -> Any:
        return (3,), (1,)


@final
@dataclasses.dataclass(frozen=True)
class LabelAndScore(losses.Objective, type_name="structured_parallel_label_and_score"):
    takes_labels: ClassVar[bool] = True

    def per_example(self, outputs: Any, batch: losses.BatchView) -> Any:
        logits, score = outputs
        log_p = logits - ops.logsumexp(logits, axis=1, keepdims=True)
        picked = ops.sum(log_p * ops.one_hot(batch.targets["label"], 3, ops.dtype(log_p)), axis=1)
        diff = score[:, 0] - batch.targets["score"]
        return diff * diff - picked


class RecordWorker(callbacks.Callback):
    def on_train_begin(self, trainer: Any) -> None:
        strategy = trainer.strategy
        name = f"rank-{getattr(strategy, 'rank', 0)}-of-{strategy.world_size}"
        (Path(os.environ["STRUCTURED_PARALLEL_OUT"]) / name).touch()


def split(n: int, seed: int) -> tuple[dict, dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.normal(size=(n, 3)), "z": rng.normal(size=(n, 2))}
    targets = {"label": rng.integers(0, 3, n), "score": rng.normal(size=n)}
    return inputs, targets, rng.random(n) + 0.1


def recipe(config: TrainerConfig | None = None) -> Recipe:
    x, y, w = split(48, 0)
    val_x, val_y, val_w = split(16, 1)
    return Recipe(
        name="two_inputs",
        model=TwoInputs(),
        data=(
            ArrayLoader(x, y, 8, seed=2, sample_weight=w),
            ArrayLoader(val_x, val_y, 8, shuffle=False, sample_weight=val_w),
        ),
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.Constant(0.05),
        loss=LabelAndScore(),
        callbacks=[RecordWorker(), callbacks.ModelCheckpoint(every_n_epochs=1, keep_last=1)],
        config=config or TrainerConfig(epochs=3, batch_size=8, dtype="float64"),
    )
"""


#: JAX's local devices (2 logical CPUs, which need a fresh process) against one device, on the
#: recipe's model, objective and weighted dict batches, in float32 (JAX's only dtype here).
_JAX_LOCAL_DEVICES = """
import dataclasses, json, sys
import numpy as np
from unitrain import Trainer
from unitrain.backends.jax import LocalDevices
sys.path.insert(0, sys.argv[1])
from two_inputs import recipe
def run(strategy):
    r = recipe()
    config = dataclasses.replace(r.config, dtype="float32", device="cpu")
    trainer = Trainer(r.model, backend="jax", optimizer=r.optimizer, schedule=r.schedule,
                      loss=r.loss, config=config, strategy=strategy)
    trainer.fit(*r.data)
    state = trainer.backend.state_dict()
    return {k: v for k, v in state.items() if k.startswith("model.")}, trainer.history
import jax
assert jax.local_device_count() == 2, jax.devices()
(two, two_history), (one, one_history) = run(LocalDevices(2)), run(None)
squares = sum(np.sum((two[k] - one[k]) ** 2.0) for k in one)
error = np.sqrt(squares / sum(np.sum(one[k] ** 2.0) for k in one))
losses = [[h["val_loss"] for h in history] for history in (two_history, one_history)]
print(json.dumps([float(error), *losses]))
"""


def _train(recipe: Path, out: Path, workers: int) -> dict[str, np.ndarray]:
    out.mkdir()
    command = [sys.executable, "-m", "unitrain.cli", "train", str(recipe), "--backend", "torch"]
    command += ["--quiet", "--out", str(out), "--workers", str(workers)]
    env = dict(os.environ, STRUCTURED_PARALLEL_OUT=str(out), OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = sorted(path.name for path in out.glob("rank-*"))
    assert ranks == [f"rank-{rank}-of-{workers}" for rank in range(workers)]
    newest = list_checkpoints(out / "checkpoints")[-1]
    checkpoint = load_checkpoint(newest)
    assert checkpoint.trainer["epoch"] == 3, newest
    return checkpoint.model


@pytest.mark.harness  # two torch launches, one of them under torchrun: 40-70 s on 2 busy cores
def test_two_launched_workers_equal_one_on_dict_inputs_sample_weights_and_an_objective(
    tmp_path,
):
    recipe = tmp_path / "two_inputs.py"
    recipe.write_text(RECIPE)
    one = _train(recipe, tmp_path / "one", 1)
    two = _train(recipe, tmp_path / "two", 2)
    assert one.keys() == two.keys() and len(one) == 8
    moved = max(float(np.abs(one[k] - two[k]).max()) for k in one)
    # In float64 the two runs differ only in the order of sums: each worker's half-batch
    # gradient (weighted by its share of the batch's sample weights) added by gloo, against
    # one sum over the batch; 18 updates of weights of size ~1 leave that near 1e-16
    # (measured 1.7e-16).
    assert moved < 1e-12, moved
    # The validation batches are weighted too: each worker evaluates its slices, counted by
    # their share of the weights, and the sums are added over workers: the same number.
    losses = [_val_losses(tmp_path / name) for name in ("one", "two")]
    assert np.allclose(losses[0], losses[1], rtol=1e-12, atol=0), losses


def _val_losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row["val_loss"] for row in rows if "val_loss" in row]


@pytest.mark.harness  # a fresh JAX process training twice: 25-35 s on 2 busy cores
def test_jax_local_devices_equal_one_device_on_the_same_batches(tmp_path):
    pytest.importorskip("jax")
    (tmp_path / "two_inputs.py").write_text(RECIPE)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _JAX_LOCAL_DEVICES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    error, two, one = json.loads(done.stdout.strip().splitlines()[-1])
    # float32: the two devices' half-batch gradients summed, against one sum over the batch;
    # 18 updates leave the weights 8.1e-8 apart (relative, measured), their validation
    # losses within 1.2e-7.
    assert error < 1e-6, error
    assert two == pytest.approx(one, rel=1e-6), (two, one)


@functools.cache
def _recipe_module() -> types.ModuleType:
    """The recipe as a module of this process (once: its classes register their names)."""
    module = types.ModuleType("structured_parallel_recipe")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(RECIPE, "structured_parallel_recipe", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("workers", [2, 3])
def test_weighted_losses_are_one_worker_s_on_simulated_workers(workers):
    """A weighted batch's loss is a weighted mean; its slices' losses, counted by their share
    of the weights, add up to one process's number for any worker count, in validation and
    in the logged training loss (counted by their examples they gave 1.969 where one process
    gives 1.861 after the first epoch, and 2.2929 where it gives 2.2769 in training)."""
    losses = []
    for strategy in (None, SimulatedWorkers(workers)):
        recipe = _recipe_module().recipe()
        trainer = Trainer(
            recipe.model,
            backend="numpy",
            optimizer=recipe.optimizer,
            schedule=recipe.schedule,
            loss=recipe.loss,
            config=recipe.config,
            strategy=strategy,
        )
        trainer.fit(*recipe.data)
        losses.append([row[key] for row in trainer.history for key in ("val_loss", "loss")])
    assert len(losses[0]) == 6
    assert losses[1] == pytest.approx(losses[0], rel=1e-13), losses  # summation order only
