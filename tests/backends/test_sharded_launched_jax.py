"""Sharded JAX over launched processes: ``Sharded()`` in workers ``--workers N`` started.

Two launched processes (one CPU device each, gloo collectives) train a small Adam recipe
with dropout and clipping as one sharded program; the test compares it with one process,
checks each process holds only its rows, and resumes its checkpoint (written by both
processes, each its own rows) on one process and the other way round. Each launch takes
10-20 s on a busy 2-core CPU, so those tests are in the harness stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from unitrain import ConfigError

jax = pytest.importorskip("jax")

from unitrain.backends.jax.distributed import launch_command  # noqa: E402
from unitrain.backends.jax.sharding import LaunchedSharded, local_rows  # noqa: E402
from unitrain.checkpoint import RowShard, list_checkpoints  # noqa: E402

SCRIPT = Path(__file__).parent / "_sharded_launched_jax_run.py"


def _run(workers: int, *args: str, **extra: str) -> None:
    """The worker script on ``workers`` launched processes (1: one plain process)."""
    launch = launch_command(workers) if workers > 1 else [sys.executable]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **extra}
    env.pop("UNITRAIN_JAX_COORDINATOR", None)
    done = subprocess.run(
        [*launch, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def _final(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "final.npz") as saved:
        return {key: saved[key] for key in saved.files}


def _report(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"rank-{rank}.json").read_text(encoding="utf-8"))


def _worst(state: dict, reference: dict, names: list[str]) -> float:
    """``max |a - b|`` over the tensors ``names``, relative to their largest ``|b|``."""
    scale = max(float(np.max(np.abs(reference[k]))) for k in names)
    return max(float(np.max(np.abs(state[k] - reference[k]))) for k in names) / scale


def _assert_equal(state: dict, reference: dict) -> None:
    """Within 1e-6 relative: each weight tensor against its own largest value; Adam's
    moments against the largest value of their kind (the first moment of the 3-entry bias,
    a nearly cancelling mean of gradients, is 0.004 where the others reach 0.02, so its own
    scale would magnify the same absolute float32 rounding five times)."""
    for name in [k for k in reference if k.startswith("model.")]:
        assert _worst(state, reference, [name]) <= 1e-6, name
    for slot in ("exp_avg", "exp_avg_sq"):
        names = [k for k in reference if k.endswith(f".{slot}")]
        assert names and _worst(state, reference, names) <= 1e-6, slot
    assert int(state["optimizer.step"]) == int(reference["optimizer.step"])


@pytest.mark.harness  # four runs, two of them launches of two processes: about a minute
def test_two_launched_sharded_processes_equal_one_and_resume_across_counts(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    _run(2, "sharded", str(two))
    _run(1, "one", str(one))
    reference = _final(one)
    _assert_equal(_final(two), reference)
    sharded, single = _report(two), _report(one)
    assert sharded["world_size"] == 2
    assert sharded["epochs"] == single["epochs"] == 4
    np.testing.assert_allclose(sharded["val_loss"], single["val_loss"], rtol=1e-6)
    outputs, expected = np.load(two / "predict.npy"), np.load(one / "predict.npy")
    assert outputs.shape == expected.shape == (20, 3)
    assert np.max(np.abs(outputs - expected)) <= 1e-6 * np.max(np.abs(expected))
    # Each process holds only its rows of a parameter whose first axis divides by 2.
    for rank in (0, 1):
        report = _report(two, rank)
        for shape, pieces in zip(report["shapes"], report["pieces"]):
            rows = shape[0] // 2 if shape[0] % 2 == 0 else shape[0]
            assert pieces == [[rows, *shape[1:]]], (rank, shape)
    # The checkpoint holds both processes' rows, in files of their own.
    saved = list_checkpoints(two / "checkpoints")
    assert len(saved) == 4
    files = {path.name for path in saved[1].iterdir()}
    assert {"model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors"} <= files
    assert {"optimizer-00000-of-00002.safetensors", "optimizer-00001-of-00002.safetensors"} <= files
    # 2 -> 1 and 1 -> 2: the resumed runs end where the uninterrupted one does.
    _run(1, "one", str(tmp_path / "on-one"), str(saved[1]))
    _assert_equal(_final(tmp_path / "on-one"), reference)
    _run(2, "sharded", str(tmp_path / "on-two"), str(list_checkpoints(one / "checkpoints")[1]))
    _assert_equal(_final(tmp_path / "on-two"), reference)


@pytest.mark.harness  # two launches of two processes that stop at the request: ~15 s
def test_a_request_launched_jax_cannot_serve_is_refused_on_every_process(tmp_path):
    _run(2, "refuse-3", str(tmp_path / "three"))
    for rank in (0, 1):
        message = (tmp_path / "three" / f"refused-{rank}.txt").read_text(encoding="utf-8")
        assert message.startswith("Sharded(3) asks for 3 workers, but 2 JAX processes")
    flags = "--xla_force_host_platform_device_count=2"
    _run(2, "sharded", str(tmp_path / "devices"), XLA_FLAGS=flags)
    for rank in (0, 1):
        message = (tmp_path / "devices" / f"refused-{rank}.txt").read_text(encoding="utf-8")
        assert "needs one device in each, but this process sees 2" in message


def test_an_incomplete_launch_environment_is_refused(monkeypatch):
    monkeypatch.setenv("UNITRAIN_JAX_COORDINATOR", "127.0.0.1:1")
    monkeypatch.delenv("UNITRAIN_RANK", raising=False)
    with pytest.raises(ConfigError, match="launch sharded JAX workers with"):
        LaunchedSharded.for_request(2)


def test_the_processes_compute_the_whole_batch_as_one_worker():
    strategy = LaunchedSharded(2, 1)
    batch = (np.arange(4), np.arange(4))
    assert strategy.shards(batch) == [(batch, 1.0)]
    assert not strategy.is_main
    with pytest.raises(ConfigError, match="rank must be in"):
        LaunchedSharded(2, 2)


def test_a_process_local_array_is_read_whole():
    value = jax.numpy.arange(6.0).reshape(3, 2)
    read = local_rows(value, np.float32)
    assert not isinstance(read, RowShard)
    np.testing.assert_array_equal(read, np.arange(6.0).reshape(3, 2))
