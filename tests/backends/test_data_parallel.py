"""Data-parallel training: the strategy seam, simulated workers, the launcher, and the traps.

The real engines (torch DDP, jax.distributed, MultiWorkerMirroredStrategy) are launched by
the kit's ``data_parallel`` family, which ``test_conformance`` runs on every built-in
backend; the tests here stay in one process, except the launcher's, which starts two tiny
Python workers and no framework.

The two trap backends here model the mistakes issue 13 measured on the numpy reference's
simulated workers, each doubling the gradients on two workers; the kit must fail both while
passing their good base class, in a second. The same mistakes written in the engines
(``_data_parallel_trap_tensorflow``: MultiWorkerMirroredStrategy summing per-replica mean
losses; ``_data_parallel_trap_jax``: a ``pmean`` on gradients ``shard_map`` already summed)
are launched on two real workers by a ``slow`` test; MirroredStrategy's per-replica mean
over one process's local devices is run in a fresh process.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unitrain import ArrayLoader, DataError, Trainer, TrainerConfig, callbacks
from unitrain._errors import ConfigError
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.strategy import SimulatedWorkers, SingleProcess, shard_bounds
from unitrain.conformance import check_backend
from unitrain.models import MLP
from unitrain.optim import SGD

WORKERS = 2
_GLOBAL_BATCH = "workers_match_global_batch"


class _PerReplicaMean(SimulatedWorkers):
    """An engine that sums replicas' gradients, fed each replica's own mean loss."""

    def shards(self, batch: Any) -> list[tuple[Any, float]]:
        return [(part, 1.0) for part, _ in super().shards(batch)]


#: What the in-process doubles below declare: the kit checks data-parallel training only
#: where it is declared.
_DECLARED = dataclasses.replace(NumpyBackend.capabilities, data_parallel=True)


class SimulatedEngine(NumpyBackend):
    """The correct double of the traps: an engine whose arithmetic is the simulated workers'."""

    capabilities = _DECLARED

    def launched_strategy(self) -> Any:
        return SimulatedWorkers(WORKERS)


class PerReplicaMeanLoss(NumpyBackend):
    """TensorFlow's trap: a per-replica mean loss under MirroredStrategy's sum over replicas
    (instead of ``compute_average_loss(per_example, global_batch_size)``)."""

    capabilities = _DECLARED

    def launched_strategy(self) -> Any:
        return _PerReplicaMean(WORKERS)


class ShardMapPmeanOnSum(NumpyBackend):
    """JAX's trap: ``shard_map`` (``check_vma=True``) already sums the per-device-mean
    gradients of replicated parameters; the ``pmean`` added on top averages copies that are
    all equal to that sum, so it changes nothing and the gradients stay doubled."""

    capabilities = _DECLARED

    def launched_strategy(self) -> Any:
        return _PerReplicaMean(WORKERS)

    def step(self, lr: float) -> None:
        copies = [dict(self.grads) for _ in range(WORKERS)]  # replicated: every device's copy
        self.grads = {k: sum(c[k] for c in copies) / WORKERS for k in self.grads}  # pmean
        super().step(lr)


class _Launched(SimulatedWorkers):
    """Two workers' slices in this process, standing for two launched workers: it tells the
    backend so, as a launched engine's strategy does through ``distribute``."""

    def setup(self, backend: Any) -> None:
        backend.launched = True


class SameMasksOnEveryWorker(NumpyBackend):
    """Dropout keyed by each worker's own count of its forwards, from 0 on every worker, as
    each launched worker would count without ``strategy.dropout_index``: every worker draws
    worker 0's masks. Run as the oracle (simulated, not launched) it keys correctly."""

    capabilities = _DECLARED
    launched = False

    def launched_strategy(self) -> Any:
        return _Launched(WORKERS)

    def forward(
        self, batch: Any, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        if not self.launched:
            return super().forward(batch, step=step, micro_batch=micro_batch)
        # The k-th slice of the update, in the simulated order, numbered as this worker's
        # own count of its slices, with no rank in it.
        count = self._numbers.micro_batch if micro_batch is None else micro_batch
        loss = super().forward(batch, step=step, micro_batch=count // WORKERS)
        self._numbers.micro_batch = count + 1
        return loss


def _data(n: int = 46, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    x = generator.normal(size=(n, 5))
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)


def _fit(strategy: Any, **config: Any) -> Trainer:
    settings = {"epochs": 2, "batch_size": 12, "dtype": "float64", "seed": 1, **config}
    trainer = Trainer(
        MLP((5, 7, 2)),
        backend="numpy",
        optimizer=SGD(momentum=0.9),
        config=TrainerConfig(**settings),
        strategy=strategy,
    )
    trainer.fit(_data(), _data(20, seed=1))
    return trainer


def _max_difference(first: Trainer, second: Trainer) -> float:
    a, b = first.backend.state_dict(), second.backend.state_dict()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def test_slices_are_contiguous_cover_the_batch_and_differ_by_at_most_one():
    for size in (1, 2, 7, 15, 16):
        for workers in (1, 2, 3):
            bounds = [shard_bounds(size, workers, r) for r in range(workers)]
            assert bounds[0][0] == 0 and bounds[-1][1] == size
            assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
            lengths = [stop - start for start, stop in bounds]
            assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("accumulation", [1, 2])
def test_simulated_workers_equal_one_worker_with_the_global_batch_in_float64(accumulation):
    one = _fit(None, grad_accum_steps=accumulation)
    two = _fit(WORKERS, grad_accum_steps=accumulation)
    assert isinstance(one.strategy, SingleProcess) and two.strategy.world_size == WORKERS
    assert _max_difference(one, two) < 1e-14  # summation order only
    assert [row["step"] for row in two.history] == [row["step"] for row in one.history]
    for mine, theirs in zip(two.history, one.history):
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-13)
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-13)


def test_steps_per_call_without_a_multi_step_call_runs_one_update_per_call_on_workers():
    """Batches are never stacked for a call the run does not make: with several workers and
    steps_per_call=2 on a backend without a multi-step call, the run equals the plain one."""
    plain = _fit(WORKERS)
    with pytest.warns(UserWarning, match="no multi-step call"):
        multi = _fit(WORKERS, steps_per_call=2)
    assert _max_difference(plain, multi) == 0.0


def test_a_batch_smaller_than_the_workers_is_refused_before_training():
    with pytest.raises(DataError, match="fewer than the 3 workers"):
        _fit(3, batch_size=11)  # 46 = 4 x 11 + 2: the last batch has 2 examples


def test_a_strategy_must_be_a_strategy():
    with pytest.raises(ConfigError, match="strategy must be"):
        Trainer(MLP((5, 2)), backend="numpy", strategy="ddp")
    with pytest.raises(ConfigError, match="workers must be an int >= 1"):
        SimulatedWorkers(0)


class _SecondWorker(SimulatedWorkers):
    """Rank 1 of two: computes its slice, sums nothing (the test only looks at files)."""

    rank = 1
    is_main = False

    def __init__(self) -> None:
        super().__init__(WORKERS)

    def shards(self, batch: Any) -> list[tuple[Any, float]]:
        return super().shards(batch)[1:]


def test_only_rank_zero_writes_checkpoints_logs_and_the_lock(tmp_path):
    out = tmp_path / "run"
    trainer = Trainer(
        MLP((5, 7, 2)),
        backend="numpy",
        callbacks=[
            callbacks.ModelCheckpoint(out / "checkpoints", every_n_epochs=1),
            callbacks.JSONLLogger(out / "metrics.jsonl"),
            callbacks.CSVLogger(out / "metrics.csv"),
        ],
        config=TrainerConfig(epochs=2, batch_size=12, checkpoint_dir=str(out / "checkpoints")),
        strategy=_SecondWorker(),
    )
    assert [type(c).__name__ for c in trainer.callbacks.callbacks] == ["ModelCheckpoint"]
    trainer.fit(_data(), _data(20, seed=1))
    assert not out.exists()  # no checkpoint, no log, no lock file


@pytest.mark.slow  # two launches of two framework workers: 1-2 minutes on a busy 2-core CPU
@pytest.mark.parametrize(
    ("framework", "target"),
    [
        ("tensorflow", "_data_parallel_trap_tensorflow:TensorFlowPerReplicaMean"),
        ("jax", "_data_parallel_trap_jax:JaxShardMapPmean"),
    ],
)
def test_the_kit_fails_each_engine_trap_on_two_launched_workers(framework, target, monkeypatch):
    pytest.importorskip(framework)
    tests = str(Path(__file__).parent)  # the launched workers import the trap from here
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    )
    [result] = check_backend(target, device="cpu", dtypes=["float32"], keyword=_GLOBAL_BATCH)
    assert result.status == "failed", result.reason
    assert "2 workers vs 1 with the global batch" in result.reason


def test_the_kit_fails_the_per_replica_mean_on_one_process_s_local_devices(monkeypatch):
    pytest.importorskip("tensorflow")
    tests = str(Path(__file__).parent)  # the fresh process imports the trap from here
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    )
    target = "_data_parallel_trap_tensorflow:TensorFlowMirroredPerReplicaMean"
    keyword = "local_devices_match_global_batch"
    [result] = check_backend(target, device="cpu", dtypes=["float32"], keyword=keyword)
    assert result.status == "failed", result.reason
    assert "2 local devices vs 1" in result.reason


@pytest.mark.parametrize("trap", [PerReplicaMeanLoss, ShardMapPmeanOnSum])
def test_the_kit_fails_each_trap_and_passes_its_base(trap):
    target = f"{__name__}:{trap.__name__}"
    [result] = check_backend(target, device="cpu", dtypes=["float64"], keyword=_GLOBAL_BATCH)
    assert result.status == "failed"
    assert "2 workers vs 1 with the global batch" in result.reason
    target = f"{__name__}:{SimulatedEngine.__name__}"
    good = check_backend(target, device="cpu", dtypes=["float64"], keyword="data_parallel")
    assert {r.check: r.status for r in good} == {
        _GLOBAL_BATCH: "passed",
        "workers_draw_the_oracles_dropout": "passed",
        "local_devices_match_global_batch": "skipped",  # no local devices strategy
    }, [r.reason for r in good]
    # The numpy reference declares no data-parallel training: skipped, not simulated.
    reference = check_backend("numpy", device="cpu", dtypes=["float64"], keyword="data_parallel")
    assert {r.status for r in reference} == {"skipped"}


def test_the_kit_fails_workers_that_all_draw_worker_zeros_dropout_masks():
    target = f"{__name__}:{SameMasksOnEveryWorker.__name__}"
    results = check_backend(target, device="cpu", dtypes=["float64"], keyword="data_parallel")
    verdicts = {result.check: result for result in results}
    assert verdicts[_GLOBAL_BATCH].status == "passed", verdicts[_GLOBAL_BATCH].reason
    dropout = verdicts["workers_draw_the_oracles_dropout"]
    assert dropout.status == "failed"
    assert "2 workers vs 2 simulated workers" in dropout.reason


def test_the_launcher_names_a_killed_worker_and_stops_the_others():
    program = (
        "import os, signal, time\n"
        "if os.environ['UNITRAIN_RANK'] == '1':\n"
        "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(120)\n"
    )
    environment = "unitrain.backends.jax.distributed:worker_environment"  # imports no jax
    command = [sys.executable, "-m", "unitrain.cli._launch", "--workers=2"]
    command += [f"--environment={environment}", "--", "-c", program]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "worker 1 of 2" in done.stderr and "SIGKILL" in done.stderr
    assert time.monotonic() - started < 30  # worker 0 was stopped, not waited for


class _NoBatches:
    """A re-iterable that yields nothing."""

    def __iter__(self):
        return iter(())


@pytest.mark.parametrize("metrics", [(), ("perplexity",)])
def test_several_workers_evaluate_like_one(metrics):
    """With the loss alone each worker evaluates its slices and the sums are added up; with
    metrics beyond it every worker evaluates every example. Either way the results are one
    worker's, metrics included, and an empty source is named in the error."""
    loader = ArrayLoader(*_data(20, seed=1), batch_size=8, seed=3)  # read in epoch 0's order
    results = []
    for strategy in (None, SimulatedWorkers(WORKERS)):
        trainer = Trainer(
            MLP((5, 7, 2)),
            backend="numpy",
            metrics=metrics,
            config=TrainerConfig(batch_size=8, dtype="float64", seed=1),
            strategy=strategy,
        )
        results.append(trainer.validate(loader))
        with pytest.raises(DataError, match=r"^val_data yielded no batches"):
            trainer.validate(_NoBatches())
    one, two = results
    assert {"val_loss", *(f"val_{name}" for name in metrics)} <= set(one) == set(two)
    for key in one:
        assert two[key] == pytest.approx(one[key], rel=1e-13)  # summation order only
