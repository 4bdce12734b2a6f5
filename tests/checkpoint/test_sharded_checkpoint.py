"""Sharded checkpoints written by every worker: the format, the agreement between workers,
and every way the files can be wrong. Workers are threads here (the exchange is an
all-gather over a barrier); tests/backends/test_sharded.py runs the real torch workers."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unitrain import CheckpointError
from unitrain.checkpoint import (
    CheckpointWriter,
    RowShard,
    load_checkpoint,
    remove_checkpoint,
    verify_checkpoint,
)
from unitrain.checkpoint._write_shards import save_sharded_checkpoint

FULL = {
    "model.w": np.arange(40, dtype=np.float32).reshape(10, 4),  # 10 rows over 4: 3, 3, 3, 1
    "model.b": np.arange(2, dtype=np.float64),  # 2 rows over 4: two workers hold none
}
OPTIMIZER = {"optimizer.w.m": np.full((10, 4), 0.5, np.float32)}
STEP = {"optimizer.step": np.asarray(7, np.int64)}  # not sharded: written by rank 0


class ThreadWorkers:
    """``world_size`` workers as threads, exchanging through a shared list and a barrier."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._slots: list[Any] = [None] * world_size
        self._barrier = threading.Barrier(world_size, timeout=30)

    def worker(self, rank: int) -> Any:
        group = self

        class Worker:
            world_size = group.world_size

            def exchange(self, value: Any) -> list[Any]:
                group._slots[rank] = value
                group._barrier.wait()
                values = list(group._slots)
                group._barrier.wait()
                return values

        w = Worker()
        w.rank = rank  # type: ignore[attr-defined]
        return w


def rows_of(array: np.ndarray, rank: int, world_size: int) -> RowShard:
    chunk = -(-array.shape[0] // world_size)
    start, stop = min(rank * chunk, array.shape[0]), min((rank + 1) * chunk, array.shape[0])
    return RowShard(array[start:stop].copy(), start, array.shape[0])


def save_on_workers(path: Path, world_size: int, **options: Any) -> list[Any]:
    """Each worker saves its rows; returns what each returned or raised."""
    group, results = ThreadWorkers(world_size), [None] * world_size
    state_of = options.pop("state_of", None)

    def run(rank: int) -> None:
        model = {k: rows_of(v, rank, world_size) for k, v in FULL.items()}
        optimizer = {**{k: rows_of(v, rank, world_size) for k, v in OPTIMIZER.items()}, **STEP}
        if state_of is not None:
            model, optimizer = state_of(rank, model, optimizer)
        try:
            results[rank] = save_sharded_checkpoint(
                path,
                workers=group.worker(rank),
                model=model,
                optimizer=optimizer,
                trainer={"epoch": 1, "step": 7},
                **(options if rank == 0 else {}),
            )
        except Exception as error:  # the test reads it
            results[rank] = error

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_each_worker_writes_its_rows_and_the_checkpoint_loads_whole(tmp_path, world_size):
    results = save_on_workers(tmp_path / "ckpt", world_size)
    assert results == [tmp_path / "ckpt"] * world_size
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    shard_files = [n for n in names if "-of-" in n]
    assert len(shard_files) == 2 * world_size
    assert f"model-00000-of-{world_size:05d}.safetensors" in names
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.model.keys() == FULL.keys()
    for name, value in FULL.items():
        np.testing.assert_array_equal(loaded.model[name], value)
        assert loaded.model[name].dtype == value.dtype
    np.testing.assert_array_equal(loaded.optimizer["optimizer.w.m"], OPTIMIZER["optimizer.w.m"])
    assert int(loaded.optimizer["optimizer.step"]) == 7 and loaded.trainer["step"] == 7
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["format_version"] == 3
    assert set(manifest["files"]) == {n for n in names if n != "manifest.json"}
    layout = json.loads((tmp_path / "ckpt" / "shards.json").read_text())
    assert layout["workers"] == world_size
    if world_size == 4:
        assert layout["model"]["model.w"]["rows"] == [[0, 3], [3, 6], [6, 9], [9, 10]]
        assert layout["model"]["model.b"]["rows"] == [[0, 1], [1, 2], [2, 2], [2, 2]]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_a_sharded_checkpoint_replaces_and_is_removed_like_any_other(tmp_path):
    save_on_workers(tmp_path / "ckpt", 2)
    save_on_workers(tmp_path / "ckpt", 4)  # replaces it: the 2-worker files go with it
    assert len(list((tmp_path / "ckpt").glob("*-of-00002.safetensors"))) == 0
    verify_checkpoint(tmp_path / "ckpt")
    remove_checkpoint(tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_rank_0_finishes_in_the_background_with_a_writer(tmp_path):
    writer = CheckpointWriter()
    save_on_workers(tmp_path / "ckpt", 2, writer=writer)
    writer.wait()
    np.testing.assert_array_equal(
        load_checkpoint(tmp_path / "ckpt").model["model.w"], FULL["model.w"]
    )


def test_a_worker_that_cannot_write_makes_every_worker_fail_and_leaves_nothing(tmp_path):
    def bad_on_rank_1(rank, model, optimizer):
        if rank == 1:  # a dtype no checkpoint stores
            model = {**model, "model.w": RowShard(np.zeros((3, 4), np.float16).astype("V2"), 3, 10)}
        return model, optimizer

    save_on_workers(tmp_path / "ckpt", 2)
    results = save_on_workers(tmp_path / "ckpt", 2, state_of=bad_on_rank_1)
    assert all(isinstance(r, CheckpointError) for r in results), results
    expected = (
        f"{tmp_path}/ckpt: could not save the sharded checkpoint: worker 1: "
        "model-00001-of-00002.safetensors: 'model.w' has dtype |V2, which a checkpoint cannot "
        "store; use one of "
    )
    assert all(str(r).startswith(expected) for r in results), results[0]
    assert all(
        str(r).endswith(f"a previous checkpoint at {tmp_path}/ckpt, if any, is unchanged")
        for r in results
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # the staging is gone
    verify_checkpoint(tmp_path / "ckpt")  # the previous checkpoint is still whole


def test_rank_0_refusing_to_start_makes_every_worker_fail(tmp_path):
    (tmp_path / "ckpt").write_text("not a checkpoint")
    results = save_on_workers(tmp_path / "ckpt", 3)
    assert all(isinstance(r, CheckpointError) for r in results), results
    refusal = (
        f"{tmp_path}/ckpt: refusing to replace it: it is a symlink or not a directory, so it is "
        "not a checkpoint; move it away or choose another path"
    )
    assert str(results[0]) == refusal and str(results[2]) == f"rank 0 could not save: {refusal}"


def test_workers_that_disagree_on_the_tensors_are_refused(tmp_path):
    def whole_on_rank_1(rank, model, optimizer):
        return ({**model, "model.b": FULL["model.b"]} if rank == 1 else model), optimizer

    results = save_on_workers(tmp_path / "ckpt", 2, state_of=whole_on_rank_1)
    assert isinstance(results[0], CheckpointError) and "disagree" in str(results[0])
    assert not (tmp_path / "ckpt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: (d / "model-00001-of-00002.safetensors").unlink(), "missing"),
        (lambda d: (d / "model-00001-of-00002.safetensors").write_bytes(b"x"), "size mismatch"),
        (lambda d: (d / "model-00002-of-00002.safetensors").write_bytes(b""), "unexpected"),
        (lambda d: _leave_a_gap(d / "shards.json"), "mismatch"),
        (lambda d: (d / "shards.json").unlink(), "missing"),
    ],
)
def test_damaged_shards_are_refused(tmp_path, damage, expected):
    save_on_workers(tmp_path / "ckpt", 2)
    damage(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(tmp_path / "ckpt")


def test_without_the_manifest_a_bad_layout_is_still_refused(tmp_path):
    save_on_workers(tmp_path / "ckpt", 2)
    _leave_a_gap(tmp_path / "ckpt" / "shards.json")
    with pytest.raises(CheckpointError, match="bad entry"):
        load_checkpoint(tmp_path / "ckpt", verify=False)
    save_on_workers(tmp_path / "ok", 2)
    loaded = load_checkpoint(tmp_path / "ok", verify=False)
    np.testing.assert_array_equal(loaded.model["model.w"], FULL["model.w"])


def _leave_a_gap(file: Path) -> None:
    """Worker 1's rows of model.w said to start a row late: one row would stay unread."""
    layout = json.loads(file.read_text())
    layout["model"]["model.w"]["rows"][1][0] += 1
    file.write_text(json.dumps(layout))


def test_inspect_shows_the_workers_files_and_each_tensor_s_rows(tmp_path, capsys):
    from unitrain.cli import main

    save_on_workers(tmp_path / "ckpt", 4)
    assert main(["inspect", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert "shards: written by 4 workers" in out
    assert "optimizer-00003-of-00004.safetensors" in out
    assert any("model.w" in line and "rows 3|3|3|1" in line for line in out.splitlines())
    assert any("model.b" in line and "rows 1|1|0|0" in line for line in out.splitlines())
    step = [line for line in out.splitlines() if "optimizer.step" in line]
    assert step and "rows" not in step[0]  # written whole by rank 0


def test_rows_that_do_not_follow_one_another_are_refused_on_writing(tmp_path):
    def mirrored(rank, model, optimizer):
        return {k: v._replace(start=v.rows - v.stop) for k, v in model.items()}, optimizer

    results = save_on_workers(tmp_path / "ckpt", 2, state_of=mirrored)
    assert isinstance(results[0], CheckpointError)
    assert "rows do not cover each tensor once" in str(results[0])
    assert "local_state_dict gives wrong rows" in str(results[0])
    assert not (tmp_path / "ckpt").exists()
