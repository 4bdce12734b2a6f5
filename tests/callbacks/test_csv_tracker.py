"""CSVTracker: Lightning's metrics.csv layout, the widening header, and a crash and resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from test_trackers import _data, _Stop, _StopAt, _trainer

from unitrain import CheckpointError, ConfigError, RunFolderError, callbacks


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path / "metrics.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_one_row_per_call_blanks_for_missing_keys_and_a_header_that_widens(tmp_path):
    tracker = callbacks.CSVTracker(tmp_path)
    tracker.log_metrics({"train/loss": 0.5, "train/lr": 0.1}, step=1)
    assert _rows(tmp_path)[0] == ["epoch", "step", "train/loss", "train/lr"]
    tracker.log_metrics({"train/loss": 0.25, "train/lr": 0.1}, step=2)
    tracker.log_metrics({"epoch/val_loss": 0.3}, step=2)
    header, rows = _rows(tmp_path)
    assert header == ["epoch", "step", "epoch/val_loss", "train/loss", "train/lr"]
    assert [r["step"] for r in rows] == ["1", "2", "2"]
    assert rows[0]["epoch/val_loss"] == "" and rows[2]["train/loss"] == ""
    assert rows[1]["train/loss"] == "0.25" and rows[2]["epoch/val_loss"] == "0.3"
    assert not list(tmp_path.glob(".*.tmp"))  # the rewrite renamed its temporary file


def test_a_training_run_logs_steps_and_epochs_with_their_epoch(tmp_path):
    tracker = callbacks.CSVTracker(tmp_path / "logs")
    trainer = _trainer(tracker, tmp_path)
    trainer.fit(_data(), _data(32))
    header, rows = _rows(tmp_path / "logs")
    assert header[:2] == ["epoch", "step"] and {"train/loss", "epoch/val_loss"} <= set(header)
    steps = [(r["epoch"], r["step"]) for r in rows if r["train/loss"]]
    assert steps == [("0", "2"), ("0", "4"), ("1", "6"), ("1", "8"), ("2", "10"), ("2", "12")]
    ends = [(r["epoch"], r["step"]) for r in rows if r["epoch/val_loss"]]
    assert ends == [("0", "4"), ("1", "8"), ("2", "12")]
    assert float(rows[-1]["epoch/val_loss"]) == pytest.approx(trainer.history[-1]["val_loss"])
    params = {}
    for line in (tmp_path / "logs" / "hparams.yaml").read_text().splitlines():
        key, value = line.split(": ", 1)
        params[json.loads(key)] = json.loads(value)
    assert params["backend"] == "numpy" and params["config.epochs"] == "3"


def test_a_crashed_run_resumes_without_duplicate_rows(tmp_path):
    uninterrupted = tmp_path / "whole"
    _trainer(callbacks.CSVTracker(uninterrupted), uninterrupted).fit(_data(), _data(32))
    expected_header, expected = _rows(uninterrupted)

    logs = tmp_path / "logs"
    with pytest.raises(_Stop):  # after step 6; the last checkpoint is epoch 1's (step 4)
        _trainer(callbacks.CSVTracker(logs), tmp_path, extra=(_StopAt(6),)).fit(_data(), _data(32))
    assert [r["step"] for r in _rows(logs)[1]][-1] == "6"
    _trainer(callbacks.CSVTracker(logs), tmp_path).fit(_data(), _data(32), resume="latest")
    header, rows = _rows(logs)
    assert header == expected_header
    assert [(r["epoch"], r["step"]) for r in rows] == [(r["epoch"], r["step"]) for r in expected]
    assert [r["train/loss"] for r in rows] == [r["train/loss"] for r in expected]


def test_a_resume_drops_the_columns_only_cut_rows_brought(tmp_path):
    tracker = callbacks.CSVTracker(tmp_path)
    tracker.log_metrics({"a": 1.0}, step=1)
    saved = tracker.run_state()
    tracker.log_metrics({"b": 2.0}, step=2)
    callbacks.CSVTracker(tmp_path).resume_run(saved)
    assert _rows(tmp_path) == (["epoch", "step", "a"], [{"epoch": "", "step": "1", "a": "1.0"}])


def test_a_symlink_in_the_files_place_is_refused_before_training(tmp_path):
    (tmp_path / "elsewhere.csv").write_text("")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").symlink_to(tmp_path / "elsewhere.csv")
    with pytest.raises(RunFolderError):
        _trainer(callbacks.CSVTracker(tmp_path / "logs"), tmp_path).fit(_data(), _data(32))


def test_it_round_trips_as_a_recipe_callback(tmp_path):
    tracker: Any = callbacks.callback_from_dict({"type": "CSVTracker", "log_dir": str(tmp_path)})
    assert isinstance(tracker, callbacks.CSVTracker) and tracker.log_dir == tmp_path


ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
#: Each error of docs/errors.md's "CSV tracker" table: how to make it, and its message.
DOCUMENTED = {
    "damaged_run": (
        lambda: callbacks.CSVTracker("logs").resume_run({"rows": -1, "columns": ["step"]}),
        "CSVTracker: the saved run must have 'rows' (an int >= 0) and 'columns' (a list of str "
        "starting with epoch, step), got {'rows': -1, 'columns': ['step']}",
    ),
    "empty_folder": (
        lambda: callbacks.CSVTracker(""),
        "CSVTracker: log_dir must be a folder, got ''",
    ),
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_error(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make, message = DOCUMENTED[name]
    with pytest.raises((CheckpointError, ConfigError)) as raised:
        make()
    assert str(raised.value) == message
    section = ERRORS_PAGE.read_text(encoding="utf-8").split("## CSV tracker", 1)[-1]
    section = section.split("\n## ", 1)[0]
    assert message in section and f"`test_documented_error[{name}]`" in section
