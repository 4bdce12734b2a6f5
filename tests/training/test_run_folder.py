"""A run folder is one run's own: ids and generations in checkpoints, refusals, archives.

Before, a second ``unitrain train`` in a folder cut the first run's metrics.jsonl and pruned
every checkpoint it wrote (pruning and ``latest`` ordered by step across runs), and a resume
from an older checkpoint with another batch size had its own newest checkpoint deleted.
"""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from unitrain import CheckpointError, Trainer, TrainerConfig, callbacks, models, optim
from unitrain._errors import RunFolderError
from unitrain.checkpoint import (
    CheckpointWarning,
    checkpoint_run,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from unitrain.training._lock import LOCK_NAME, DirectoryLockedError

X = np.random.default_rng(1).normal(size=(96, 6)).astype("float32")
Y = (X[:, 0] > 0).astype("int64")


def make(folder: Path, epochs: int = 3, batch_size: int = 16, keep_last: int = 2) -> Trainer:
    return Trainer(
        models.MLP((6, 8, 2)),
        backend="numpy",
        optimizer=optim.SGD(momentum=0.9),
        callbacks=[callbacks.ModelCheckpoint(every_n_epochs=1, keep_last=keep_last)],
        config=TrainerConfig(epochs=epochs, batch_size=batch_size, checkpoint_dir=str(folder)),
    )


def names(folder: Path) -> list[str]:
    return [path.name for path in list_checkpoints(folder)]


def test_every_checkpoint_records_its_run(tmp_path):
    trainer = make(tmp_path)
    trainer.fit((X, Y))
    records = [checkpoint_run(path) for path in list_checkpoints(tmp_path)]
    assert {r["id"] for r in records} == {trainer.lineage.id}
    assert [r["generation"] for r in records] == [0, 0]
    continued = make(tmp_path, epochs=5)
    continued.fit((X, Y), resume="auto")
    assert continued.lineage == trainer.lineage  # resuming the newest continues the run


def test_a_fresh_run_in_a_folder_with_checkpoints_is_refused_and_deletes_nothing(tmp_path):
    make(tmp_path).fit((X, Y))
    before = names(tmp_path)
    second = make(tmp_path, epochs=1)
    with pytest.raises(CheckpointError, match=r"holds 2 checkpoint\(s\) of an earlier run"):
        second.fit((X, Y))
    assert names(tmp_path) == before and second.state.step == 0


def test_archive_existing_moves_the_earlier_run_aside(tmp_path):
    first = make(tmp_path)
    first.fit((X, Y))
    second = make(tmp_path, epochs=1)
    second.fit((X, Y), archive_existing=True)
    (archived,) = (tmp_path / "archive").iterdir()
    assert archived.name.endswith(first.lineage.id)
    assert sorted(p.name for p in archived.iterdir()) == [
        "epoch=0002-step=000012",
        "epoch=0003-step=000018",
    ]
    assert names(tmp_path) == ["epoch=0001-step=000006"]
    assert second.lineage.id != first.lineage.id


def test_a_resume_from_an_older_checkpoint_branches_and_deletes_no_newest_work(tmp_path):
    """Run 1 reaches epoch 4 (steps 24); a resume from its epoch-2 checkpoint with batch size
    32 (3 steps an epoch) writes epochs 3 and 4 at steps 15 and 18, below run 1's 24: they
    used to be pruned at once. Now they form a new generation that ``latest`` follows, and
    run 1's checkpoints stay."""
    first = make(tmp_path, epochs=4, keep_last=3)
    first.fit((X, Y))
    older = tmp_path / "epoch=0002-step=000012"
    assert older.is_dir()
    branch = make(tmp_path, epochs=4, batch_size=32, keep_last=3)
    with pytest.warns(UserWarning, match="batch_size"):
        branch.fit((X, Y), resume=older)
    assert branch.lineage.generation == 1 and branch.lineage.parent == f"{first.lineage.id}@12"
    assert names(tmp_path) == [
        "epoch=0002-step=000012",
        "epoch=0003-step=000018",
        "epoch=0004-step=000024",
        "epoch=0003-step=000015",
        "epoch=0004-step=000018",
    ]
    latest = make(tmp_path, epochs=5, batch_size=32)
    latest.fit((X, Y), resume="latest")
    assert latest.lineage == branch.lineage
    assert load_checkpoint(list_checkpoints(tmp_path)[-1]).trainer["step"] == 21


def test_a_stray_file_in_an_old_checkpoint_does_not_stop_the_run(tmp_path):
    """A desktop's .DS_Store is ignored; any other file keeps that checkpoint, with a warning
    (pruning used to abort the run)."""
    trainer = make(tmp_path, epochs=2, keep_last=2)
    trainer.fit((X, Y))
    (list_checkpoints(tmp_path)[0] / ".DS_Store").write_bytes(b"\0")
    more = make(tmp_path, epochs=3, keep_last=2)
    more.fit((X, Y), resume="auto")
    assert names(tmp_path) == ["epoch=0002-step=000012", "epoch=0003-step=000018"]
    (list_checkpoints(tmp_path)[0] / "notes.txt").write_text("mine")
    again = make(tmp_path, epochs=4, keep_last=2)
    with pytest.warns(CheckpointWarning, match=r"keeping it: .*notes\.txt"):
        again.fit((X, Y), resume="auto")
    assert names(tmp_path) == [
        "epoch=0002-step=000012",
        "epoch=0003-step=000018",
        "epoch=0004-step=000024",
    ]


def test_a_checkpoint_from_before_run_ids_carries_on(tmp_path):
    trainer = make(tmp_path, epochs=2)
    trainer.fit((X, Y))
    for path in list_checkpoints(tmp_path):  # as an older unitrain wrote them
        checkpoint = load_checkpoint(path)
        info = dict(checkpoint.trainer)
        del info["run"], info["format_version"]
        save_checkpoint(
            path,
            model=checkpoint.model,
            optimizer=checkpoint.optimizer,
            callbacks=checkpoint.callbacks,
            trainer=info,
        )
    more = make(tmp_path, epochs=3)
    more.fit((X, Y), resume="auto")
    assert more.lineage.generation == 0 and more.lineage.parent is None
    assert more.state.epoch == 3


def test_unitrain_train_twice_in_one_folder_is_refused_and_keeps_the_metrics(tmp_path):
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", "numpy", "--quiet"]
    command += ["--out", str(tmp_path), "--epochs", "2"]
    subprocess.run(command, check=True, capture_output=True)
    metrics = (tmp_path / "metrics.jsonl").read_bytes()
    again = subprocess.run([*command, "--seed", "7"], capture_output=True, text=True)
    assert again.returncode == 2
    assert "holds 2 checkpoint(s) of an earlier run" in again.stderr
    assert "--resume auto" in again.stderr
    assert (tmp_path / "metrics.jsonl").read_bytes() == metrics


def test_a_run_whose_folder_is_taken_over_mid_run_stops_before_writing(tmp_path, monkeypatch):
    """checkpoints/ deleted mid-run and another run started there: this run used to go on
    writing into the other's folder. Now it stops at the epoch's end, before its next save."""
    monkeypatch.setenv("UNITRAIN_LOCK_HEARTBEAT_SECONDS", "0.1")

    class TakeOver(callbacks.Callback):
        def on_validation_begin(self, trainer) -> None:
            if trainer.state.epoch == 1:
                # The first epoch's save finishes in the background; deleting the folder while
                # its rename is in flight can leave that checkpoint behind (a CI run found
                # one). What this test holds the run to is that no save *starts* after the
                # takeover, so the save in flight is let finish first.
                trainer._writer.wait()
                # The heartbeat may put its lock back while the folder is being deleted.
                shutil.rmtree(tmp_path, ignore_errors=True)
                tmp_path.mkdir(exist_ok=True)
                (tmp_path / LOCK_NAME).write_text(
                    json.dumps({"pid": 4242, "host": "other-node", "started": time.time()})
                )
                time.sleep(0.5)  # a few heartbeats: this run's notices the lock is not its own

    trainer = make(tmp_path, epochs=3)
    trainer.callbacks = type(trainer.callbacks)([TakeOver(), *trainer.callbacks.callbacks])
    with pytest.raises(DirectoryLockedError, match="lost its lock"):
        trainer.fit((X, Y), (X[:16], Y[:16]))
    assert trainer.state.epoch == 2 and list_checkpoints(tmp_path) == []
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "other-node"


def test_a_save_in_flight_when_another_run_takes_the_folder_is_not_put_in_place(
    tmp_path, monkeypatch
):
    """The background save of epoch 1 is still digesting its files when another run takes
    the folder: the save used to rename its checkpoint into the other run's folder. Now it
    reads the lock just before the rename and drops the checkpoint, and the run stops."""
    from unitrain.checkpoint import _write

    monkeypatch.setenv("UNITRAIN_LOCK_HEARTBEAT_SECONDS", "30")  # no beat notices it first
    taken = []

    def take_over() -> None:  # runs in the save's thread, before its rename
        if not taken:
            taken.append(True)
            (tmp_path / LOCK_NAME).write_text(
                json.dumps({"pid": 4242, "host": "other-node", "started": time.time()})
            )

    monkeypatch.setattr(_write, "_pause_for_tests", take_over)
    trainer = make(tmp_path, epochs=3)
    with pytest.raises(DirectoryLockedError, match="other-node"):
        trainer.fit((X, Y), (X[:16], Y[:16]))
    assert taken and list_checkpoints(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]  # no staging left behind
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "other-node"


def test_a_second_fit_of_the_same_trainer_goes_on_with_its_run(tmp_path):
    trainer = make(tmp_path, epochs=2)
    trainer.fit((X, Y))
    first = trainer.lineage
    trainer.config = TrainerConfig(epochs=3, batch_size=16, checkpoint_dir=str(tmp_path))
    trainer.fit((X, Y))
    assert trainer.lineage == first and trainer.state.epoch == 3
    assert {checkpoint_run(path)["id"] for path in list_checkpoints(tmp_path)} == {first.id}


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_checkpoint_folder_that_cannot_be_written_is_refused_before_training(
    tmp_path, monkeypatch, code
):
    """A read-only checkpoint folder used to fail at the first save, after a whole epoch."""
    from test_writers import refuse_inside

    refuse_inside(monkeypatch, tmp_path, code)
    trainer = make(tmp_path)
    with pytest.raises(RunFolderError, match="cannot write files in this folder"):
        trainer.fit((X, Y))
    assert trainer.state.step == 0


def test_a_checkpoint_folder_given_as_a_path_object_saves(tmp_path):
    """TrainerConfig accepted a pathlib.Path, and then every save failed: a Path is not JSON."""
    config = TrainerConfig(epochs=1, batch_size=16, checkpoint_dir=tmp_path)
    assert config.checkpoint_dir == str(tmp_path)
    trainer = Trainer(
        models.MLP((6, 8, 2)),
        backend="numpy",
        callbacks=[callbacks.ModelCheckpoint()],
        config=config,
    )
    trainer.fit((X, Y))
    assert names(tmp_path) == ["epoch=0001-step=000006"]


def test_metric_rows_name_the_run_that_wrote_them(tmp_path):
    log = tmp_path / "metrics.jsonl"
    trainer = make(tmp_path / "checkpoints", epochs=2)
    trainer.callbacks = type(trainer.callbacks)(
        [*trainer.callbacks.callbacks, callbacks.JSONLLogger(log)]
    )
    trainer.fit((X, Y))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["run_id"] for row in rows] == [trainer.lineage.id] * 2
