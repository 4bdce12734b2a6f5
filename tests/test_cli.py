"""The command line and the example script, run as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _backends import backends

from unitrain.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_train_writes_metrics_and_checkpoints_then_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--backend", "numpy", "--epochs", "3", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert {"epoch", "step", "lr", "loss", "val_loss", "val_accuracy", "seconds"} <= set(rows[0])
    assert rows[-1]["val_accuracy"] > 0.9
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints[-1] == "epoch=0003-step=000135"
    printed = capsys.readouterr().out
    assert "final val_accuracy=" in printed
    with pytest.warns(UserWarning, match="already finished"):
        assert (
            main(
                [
                    "train",
                    "--backend",
                    "numpy",
                    "--epochs",
                    "3",
                    "--out",
                    str(out),
                    "--resume",
                    "latest",
                ]
            )
            == 0
        )


def test_inspect_prints_the_contents(tmp_path, capsys):
    out = tmp_path / "run"
    main(["train", "--backend", "numpy", "--epochs", "1", "--out", str(out)])
    capsys.readouterr()
    assert main(["inspect", str(out / "checkpoints" / "epoch=0001-step=000045")]) == 0
    printed = capsys.readouterr().out
    assert '"step": 45' in printed and "layers.0.weight" in printed and "(64, 128)" in printed


def test_backends_lists_every_builtin(capsys):
    assert main(["backends"]) == 0
    printed = capsys.readouterr().out
    for name in ("numpy", "torch", "jax", "tensorflow"):
        assert name in printed


def test_errors_are_printed_without_a_traceback(tmp_path, capsys):
    assert main(["train", "--backend", "pytorch", "--out", str(tmp_path)]) == 2
    assert "unknown backend 'pytorch'" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err


def test_unitrain_backend_environment_variable_picks_the_backend(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("UNITRAIN_BACKEND", "numpy")
    assert main(["train", "--epochs", "1", "--out", str(tmp_path)]) == 0
    assert "on numpy" in capsys.readouterr().out


def test_example_script_runs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "digits_mlp.py"),
            "--backend",
            "numpy",
            "--epochs",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr
    assert "numpy: val_accuracy=0.9" in result.stdout
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "checkpoints" / "best").is_dir()


@pytest.mark.parametrize("backend", backends())
def test_train_and_example_run_unchanged_on_every_backend(backend, tmp_path, capsys):
    assert main(["train", "--backend", backend, "--epochs", "1", "--out", str(tmp_path)]) == 0
    assert f"on {backend}" in capsys.readouterr().out
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "digits_mlp.py"),
            "--backend",
            backend,
            "--epochs",
            "1",
            "--out",
            str(tmp_path / "example"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"{backend}: val_accuracy=" in result.stdout


def test_ctrl_c_finishes_the_save_and_prints_one_line_to_resume(tmp_path):
    """A real SIGINT mid-training: exit 130, one line naming a valid checkpoint, no traceback."""
    from unitrain.checkpoint import list_checkpoints, load_checkpoint

    out = tmp_path / "run"
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", "numpy"]
    command += ["--epochs", "500", "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list_checkpoints(out / "checkpoints") and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    named = lines[0].split("last checkpoint ")[1].split("; resume with: ")
    assert load_checkpoint(named[0]).trainer["step"] > 0  # the checkpoint is complete
    assert named[0] == str(list_checkpoints(out / "checkpoints")[-1])
    assert named[1].endswith(f"--out {out} --resume latest")
