"""Sharded training: the request, the refusals, torch's FSDP2 in process and on two workers.

In process, torch shards over a process group of one worker (gloo): the parameters are then
``DTensor``\\ s and every sharded code path runs (the optimizer over sharded parameters, the
gathered state dict, a checkpoint cut back into shards, the global finite check) in a few
seconds. The kit's ``sharded`` family launches two workers; it and its seeded fault
(``_sharded_trap_torch``: pytorch#162338's averaging reduction that sums) run in the harness
stage, as two launches take a minute or more on a busy 2-core CPU.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unitrain import ConfigError, Trainer, TrainerConfig, callbacks, optim
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend
from unitrain.backends.sharded import SHARD_ENV, Sharded, ShardingUnsupported
from unitrain.backends.strategy import strategy_for
from unitrain.checkpoint import list_checkpoints, load_checkpoint
from unitrain.cli._main import _parser
from unitrain.cli._train import train
from unitrain.conformance import check_backend
from unitrain.models import MLP

_MODEL = (6, 16, 3)


def test_a_request_needs_a_positive_worker_count():
    assert Sharded().workers is None
    for bad in (0, -2, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="workers must be an int >= 1 or None"):
            Sharded(bad)  # type: ignore[arg-type]


def test_the_launcher_s_environment_asks_for_sharding(monkeypatch):
    monkeypatch.setenv(SHARD_ENV, "1")
    backend = NumpyBackend(MLP(_MODEL), BackendOptions(dtype="float64"))
    with pytest.raises(ShardingUnsupported, match="numpy backend cannot shard"):
        strategy_for(backend, None)


def test_an_engine_that_cannot_shard_refuses_as_such(monkeypatch):
    """The kit skips what ShardingUnsupported refuses and launches where ConfigError does."""
    for engine in ("no_sharded_engine", "tensorflow"):
        assert isinstance(_refusal(engine, monkeypatch), ShardingUnsupported)
    for setup in ("not_launched", "other_worker_count", "jax_launched"):  # the engine exists
        assert not isinstance(_refusal(setup, monkeypatch), ShardingUnsupported)


#: ``unitrain train`` asked to shard one worker.
_SHARD_ONE_WORKER = ["train", "digits", "--backend", "numpy", "--shard"]
ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def _refusal(name: str, monkeypatch: pytest.MonkeyPatch) -> ConfigError:
    """Make documented mistake ``name``; the error it is refused with."""
    numpy = NumpyBackend(MLP(_MODEL), BackendOptions(dtype="float64"))
    framework = {"tensorflow": "tensorflow", "not_launched": "torch"}.get(name, "numpy")
    framework = "torch" if name == "other_worker_count" else framework
    framework = "jax" if name == "jax_launched" else framework
    if name == "jax_launched":
        monkeypatch.setenv("UNITRAIN_JAX_COORDINATOR", "127.0.0.1:1")
    pytest.importorskip(framework)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    if name == "not_launched":
        monkeypatch.delenv("WORLD_SIZE")
    mistakes = {
        "bad_workers": lambda: Sharded(0),
        "no_sharded_engine": lambda: strategy_for(numpy, Sharded()),
        "tensorflow": lambda: get_backend("tensorflow").sharded_strategy(2),
        "not_launched": lambda: get_backend("torch").sharded_strategy(2),
        "other_worker_count": lambda: get_backend("torch").sharded_strategy(3),
        "jax_launched": lambda: get_backend("jax").sharded_strategy(2),
        "shard_without_workers": lambda: train(_parser().parse_args(_SHARD_ONE_WORKER)),
    }
    with pytest.raises(ConfigError) as refused:
        mistakes[name]()
    return refused.value


@pytest.mark.parametrize(
    "name",
    [
        "bad_workers",
        "no_sharded_engine",
        "tensorflow",
        "not_launched",
        "other_worker_count",
        "shard_without_workers",
        "jax_launched",
    ],
)
def test_documented_error(name, monkeypatch):
    section = ERRORS_PAGE.read_text(encoding="utf-8").split("## Sharded training", 1)[-1]
    section = section.split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if f"`test_documented_error[{name}]`" in line)
    assert str(_refusal(name, monkeypatch)) in row


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    return generator.normal(size=(n, 6)), generator.integers(0, 3, n)


def _fit(directory: Path, strategy: Any, resume: Path | None = None, clip: float = 0.5) -> Trainer:
    config = TrainerConfig(
        epochs=3,
        batch_size=8,
        dtype="float64",
        seed=0,
        deterministic=True,
        grad_clip_norm=clip,
        checkpoint_dir=str(directory),
    )
    trainer = Trainer(
        MLP(_MODEL, activation="tanh"),
        backend="torch",
        optimizer=optim.Adam(),
        callbacks=[callbacks.ModelCheckpoint(directory, every_n_epochs=1)],
        config=config,
        strategy=strategy,
    )
    trainer.fit(_data(40, 1), _data(16, 2), resume=resume)
    return trainer


def test_torch_sharded_over_one_worker_equals_unsharded_and_resumes_either_way(
    tmp_path, one_worker_group
):
    from torch.distributed.tensor import DTensor

    sharded = _fit(tmp_path / "sharded", Sharded(1))
    assert type(sharded.strategy).__name__ == "TorchSharded"
    assert all(isinstance(p, DTensor) for p in sharded.backend.params.values())
    os.environ.pop("WORLD_SIZE")  # the unsharded runs below are not launched
    plain = _fit(tmp_path / "plain", None)
    state, expected = sharded.backend.state_dict(), plain.backend.state_dict()
    assert sorted(state) == sorted(expected)
    for key, value in expected.items():  # the same float64 sums: equal to rounding
        np.testing.assert_allclose(state[key], value, rtol=1e-12, atol=1e-14, err_msg=key)

    first = list_checkpoints(tmp_path / "sharded")[0]  # after epoch 1, the worker's rows
    assert (first / "model-00000-of-00001.safetensors").is_file()
    assert (first / "shards.json").is_file()
    resumed = _fit(tmp_path / "resumed", None, resume=first)
    for key, value in state.items():
        np.testing.assert_allclose(resumed.backend.state_dict()[key], value, rtol=1e-12)
    os.environ["WORLD_SIZE"] = "1"  # and the other way: cut into shards on load
    again = _fit(tmp_path / "again", Sharded(), resume=list_checkpoints(tmp_path / "plain")[0])
    for key, value in expected.items():
        np.testing.assert_allclose(again.backend.state_dict()[key], value, rtol=1e-12)


def test_torch_sharded_skips_a_non_finite_update_on_every_shard(one_worker_group):
    from unitrain.backends.torch import TorchBackend

    backend = TorchBackend(MLP(_MODEL), BackendOptions(dtype="float64", optimizer=optim.SGD()))
    strategy_for(backend, Sharded())
    before = backend.state_dict()
    x, y = _data(4, 3)
    x[0, 0] = np.inf
    backend.forward((x, y))
    backend.backward()
    backend.step(0.1)
    assert backend.skipped_steps == 1
    after = backend.state_dict()
    assert all(np.array_equal(after[k], before[k]) for k in before if k.startswith("model."))


def _with_tests_on_path(monkeypatch) -> None:
    tests = str(Path(__file__).parent)  # the launched workers import the trap from here
    path = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)


@pytest.mark.harness  # two launches of two workers (torch), one process (jax): minutes
@pytest.mark.parametrize(
    ("framework", "dtypes"), [("torch", ("float32", "float64")), ("jax", ("float32",))]
)
def test_the_kit_s_sharded_family_passes(framework, dtypes):
    pytest.importorskip(framework)
    results = check_backend(framework, device="cpu", dtypes=list(dtypes), keyword="sharded")
    assert {(r.check, r.dtype, r.status) for r in results} == {
        ("sharded_workers_match_one_worker", dtype, "passed") for dtype in dtypes
    }, [r.reason for r in results]


@pytest.mark.harness  # a fresh JAX process with two CPU devices, two runs: 20-30 s
def test_jax_sharded_over_two_local_devices_equals_one_device(tmp_path):
    pytest.importorskip("jax")
    from unitrain.backends.jax.distributed import local_devices_environment

    script = Path(__file__).parent / "_sharded_jax_run.py"
    env = {**os.environ, **local_devices_environment(2), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # Every parameter whose first axis divides by 2 is split in halves, the others replicated.
    for shape, shards in zip(report["shapes"], report["shards"]):
        half = [shape[0] // 2, *shape[1:]] if shape[0] % 2 == 0 else shape
        assert shards == [half, half]
    assert report["model"] <= 1e-6  # float32: the order of sums differs, ~1 ulp an update
    assert report["optimizer"] <= 1e-5  # momentum buffers: smaller values, same ulps
    assert report["resumed_on_one"] <= 1e-6
    assert report["epochs"][0] == report["epochs"][1]  # the same early-stopping epoch
    assert report["lrs"][0] == report["lrs"][1]
    assert report["checkpoints"] == report["epochs"][0]


@pytest.mark.harness  # one launch of two torch workers
def test_the_kit_fails_fsdp_averaging_that_sums(monkeypatch):
    pytest.importorskip("torch")
    _with_tests_on_path(monkeypatch)
    target = "_sharded_trap_torch:TorchShardedSummed"
    [result] = check_backend(target, device="cpu", dtypes=["float64"], keyword="sharded")
    assert result.status == "failed", result.reason
    assert "2 sharded workers vs 1 with the global batch" in result.reason


@pytest.mark.harness  # one launch of two torch workers
def test_the_kit_fails_a_sharded_checkpoint_whose_rows_are_wrong(monkeypatch):
    """Each worker's rows stored reversed: the checkpoint is whole and loads, but resuming
    from it does not continue the run."""
    pytest.importorskip("torch")
    _with_tests_on_path(monkeypatch)
    target = "_sharded_trap_torch:TorchShardedReversedRows"
    [result] = check_backend(target, device="cpu", dtypes=["float64"], keyword="sharded")
    assert result.status == "failed", result.reason
    assert result.reason.startswith("2 sharded workers resumed on as many vs uninterrupted")


def test_the_kit_skips_sharding_where_the_engine_has_none():
    pytest.importorskip("tensorflow")
    [result] = check_backend("tensorflow", device="cpu", dtypes=["float32"], keyword="sharded")
    assert result.status == "skipped"
    assert "whole copy of every variable" in result.reason


@pytest.mark.harness  # one torchrun launch of two workers and one run here: about 30 s
@pytest.mark.parametrize(
    ("settings", "rtol"),
    [
        ((), 1e-5),  # float32: ~1 ulp an update
        # float16 products of 8 examples a worker where one process has 16: the low
        # precision's rounding differs, not the arithmetic (measured: weights 4.8e-7, the
        # momentum 4.8e-4; a wrong scale or a second accumulation would be off by a factor)
        (("16-mixed", "2"), 2e-3),
    ],
    ids=["float32", "16-mixed-accumulated"],
)
def test_two_sharded_workers_clip_and_skip_on_the_global_gradient(tmp_path, settings, rtol):
    """The clip norm and the non-finite guard see every shard: a batch whose overflow is in
    worker 1's slice is skipped by both workers, and clipped updates equal one process's;
    with accumulation and float16 autocast, the loss scaler halves its scale on both."""
    pytest.importorskip("torch")
    script = str(Path(__file__).parent / "_sharded_clip_run.py")
    one_run = [sys.executable, script, str(tmp_path / "one.npz"), *settings]
    subprocess.run(one_run, check=True, timeout=300)
    torch_distributed = importlib.import_module("unitrain.backends.torch.distributed")
    env = {**os.environ, SHARD_ENV: "1", "OMP_NUM_THREADS": "1"}
    command = [*torch_distributed.launch_command(2), script, str(tmp_path / "two.npz")]
    subprocess.run([*command, *settings], check=True, timeout=300, env=env, capture_output=True)
    with np.load(tmp_path / "one.npz") as one, np.load(tmp_path / "two.npz") as two:
        assert int(two["world"]) == 2
        assert int(one["skipped"]) == int(two["skipped"]) == 2  # the batch, in both epochs
        for key in one.files:
            if "loss_scale" in key:  # the scaler's state: the same decisions, exactly
                assert float(two[key]) == float(one[key]), key
            elif key.startswith(("model.", "optimizer.")):  # relative to the tensor's scale
                scale = max(float(np.max(np.abs(one[key]))), 1e-30)
                assert float(np.max(np.abs(two[key] - one[key]))) <= rtol * scale, key
        if settings:
            assert float(one["optimizer.loss_scale"]) < 65536.0  # halved for the overflow


@pytest.mark.harness  # five launches of up to four torch workers: about two minutes
def test_four_sharded_workers_checkpoint_resumes_on_four_two_and_one_and_survives_a_kill(
    tmp_path,
):
    """Each of 4 workers writes its own rows; the checkpoint resumes on 4 workers bit for
    bit, on 2 sharded workers and on one process to float64 rounding; a worker killed while
    a checkpoint is written leaves the one before it the newest, valid and resumable."""
    pytest.importorskip("torch")
    script = str(Path(__file__).parent / "_sharded_resume_run.py")
    distributed = importlib.import_module("unitrain.backends.torch.distributed")
    env = {**os.environ, SHARD_ENV: "1", "OMP_NUM_THREADS": "1"}

    def run(out: Path, workers: int, *args: str, **extra: str) -> subprocess.CompletedProcess:
        launch = [*distributed.launch_command(workers)] if workers > 1 else [sys.executable]
        return subprocess.run(
            [*launch, script, str(out), *args],
            timeout=600,
            env={**env, **extra},
            capture_output=True,
            text=True,
        )

    def final(out: Path) -> dict[str, np.ndarray]:
        with np.load(out / "final.npz") as saved:
            return dict(saved)

    whole = run(tmp_path / "whole", 4)
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = final(tmp_path / "whole")
    first = list_checkpoints(tmp_path / "whole" / "checkpoints")[0]
    assert json.loads((first / "shards.json").read_text())["workers"] == 4
    assert (first / "model-00003-of-00004.safetensors").is_file()

    killed = run(tmp_path / "killed", 4, "none", "2", UNITRAIN_CHECKPOINT_WRITE_DELAY="0.3")
    assert killed.returncode != 0
    folder = tmp_path / "killed" / "checkpoints"
    [newest] = list_checkpoints(folder)  # epoch 2's never appeared
    assert newest.name == first.name
    load_checkpoint(newest)  # whole and verified
    resumed = run(tmp_path / "killed", 4, "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = final(tmp_path / "killed")
    for key, value in expected.items():  # the same workers, the same sums: bit for bit
        np.testing.assert_array_equal(again[key], value, err_msg=key)

    for workers in (2, 1):
        out = tmp_path / f"on{workers}"
        done = run(out, workers, str(first), **({} if workers > 1 else {SHARD_ENV: "0"}))
        assert done.returncode == 0, done.stderr[-3000:]
        state = final(out)
        assert int(state["world"]) == workers
        for key, value in expected.items():  # other sums of the same batch: float64 rounding
            if key != "world":
                np.testing.assert_allclose(state[key], value, rtol=1e-12, atol=1e-14, err_msg=key)


def test_a_model_whose_output_is_a_view_trains_sharded_without_a_warning(one_worker_group):
    """FSDP2 hooks its backward on the forward's output and warns when that is a view (a
    Transformer's logits come out of a reshape); pytest makes the warning an error here."""
    from unitrain.models import Embedding, Linear, Sequential, TransformerBlock

    model = Sequential([Embedding(11, 8), TransformerBlock(8, 2, causal=True), Linear(8, 11)])
    config = TrainerConfig(epochs=1, batch_size=4, dtype="float32", seed=0)
    trainer = Trainer(model, backend="torch", config=config, strategy=Sharded(1))
    tokens = np.random.default_rng(0).integers(0, 11, (8, 6))
    trainer.fit((tokens, np.roll(tokens, -1, axis=1)))
    assert trainer.state.step == 2
