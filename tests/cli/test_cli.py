"""The command line and the example script, run as a user runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _backends import FRAMEWORKS, backends, installed

from unitrain import Trainer, TrainerConfig, models
from unitrain.checkpoint import list_checkpoints
from unitrain.cli import main

ROOT = Path(__file__).resolve().parents[2]


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
    assert "final val_loss=" in printed and " val_accuracy=0.9" in printed
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
    for name in FRAMEWORKS:
        assert name in printed
    lines = {line.split()[0]: line for line in printed.splitlines()}
    assert lines["numpy"].endswith(f"numpy {np.__version__}")  # what its versions() reports
    for name in installed():  # torch's and TensorFlow's from metadata (see _versions_of)
        assert re.search(rf"  {name} \d", lines[name]), lines[name]


#: Two third-party backends: one whose versions() reads modules only, one whose versions()
#: reads what its constructor sets.
_THIRD_PARTY = """
import importlib.metadata

from unitrain.backends.protocol import Capabilities


class ModuleVersions:
    name = "mine"
    capabilities = Capabilities()

    def versions(self):
        return {"minelib": "1.2", "numpy": importlib.metadata.version("numpy")}


class StateVersions(ModuleVersions):
    def versions(self):
        return {"minelib": self.library_version}
"""


def test_backends_shows_what_a_third_partys_versions_reports(tmp_path, monkeypatch, capsys):
    """A third party's version was '-': the metadata knows only the built-ins' frameworks."""
    from unitrain.backends import registry

    (tmp_path / "mine_backend.py").write_text(_THIRD_PARTY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = {"mine": "mine_backend:ModuleVersions", "mine_state": "mine_backend:StateVersions"}
    monkeypatch.setattr(registry, "_entry_points", lambda: entries)
    assert main(["backends"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["mine"].split()[-4:] == ["minelib", "1.2,", "numpy", np.__version__]
    # A versions() that needs its constructor's state falls back to the version of the
    # distribution that registered the backend; one found only by this test has none.
    assert lines["mine_state"].split()[-2:] == ["cpu", "-"]


def test_errors_are_printed_without_a_traceback(tmp_path, capsys):
    assert main(["train", "--backend", "pytorch", "--out", str(tmp_path)]) == 2
    assert "unknown backend 'pytorch'" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "nothing.py")]) == 2
    assert "neither a file nor a built-in recipe" in capsys.readouterr().err


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
    # No early stopping (the recipe's would end the run after ~10 epochs, about a second, so
    # the signal could land after training), so the signal lands mid-training.
    command += ["--epochs", "500", "--set", "callbacks.0.patience=1000", "--out", str(out)]
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
    assert named[1].endswith(f"--out {out} --resume auto")


def _interrupted_run(out: Path, delay: float) -> tuple[int | str, str]:
    """Start training, send SIGINT ``delay`` s after the first checkpoint; the exit status
    and stderr, or ``"hang"`` (and every thread's stack, from faulthandler) after 30 s."""
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", "numpy"]
    command += ["--epochs", "500", "--set", "callbacks.0.patience=1000", "--out", str(out)]
    environment = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment)
    deadline = time.monotonic() + 120
    while not list_checkpoints(out / "checkpoints") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=30)
        return process.returncode, stderr
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # faulthandler prints where each thread waits
        return "hang", process.communicate(timeout=30)[1]


@pytest.mark.slow  # 40 interrupted runs, 4 at a time: about 30 s
def test_ctrl_c_at_any_moment_exits_and_never_hangs(tmp_path):
    """Interrupts landing all over the loop. With the TensorBoard logger on tensorboardX's
    SummaryWriter, a run hung at exit in its queue; this test caught it in 1 of 2 tries."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        runs = [
            pool.submit(_interrupted_run, tmp_path / f"r{i}", 0.05 * (i % 7)) for i in range(40)
        ]
        outcomes = [run.result() for run in runs]
    for status, stderr in outcomes:
        assert status == 130, stderr[-4000:]
        assert stderr.count("\n") == 1 and "resume with:" in stderr, stderr


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "unitrain.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_a_recipe_file_with_set_trains_and_writes_metrics_events_and_checkpoints(tmp_path):
    out = tmp_path / "run"
    recipe = ROOT / "examples" / "recipes" / "digits.toml"
    args = ["train", str(recipe), "--backend", "numpy", "--out", str(out)]
    assert main([*args, "--set", "config.epochs=2", "--set", "callbacks.0.patience=5"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert [p.name for p in list_checkpoints(out / "checkpoints")][-1] == "epoch=0002-step=000090"
    tags = _scalars(out / "tensorboard")
    assert {"epoch/loss", "epoch/val_loss", "epoch/val_accuracy", "epoch/lr"} <= set(tags)
    assert {"train/loss", "train/lr"} <= set(tags)
    steps, values = zip(*tags["epoch/val_loss"])
    assert steps == (45, 90)
    assert values == pytest.approx([r["val_loss"] for r in rows], rel=1e-6)
    assert main(["plot", str(out)]) == 0
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Read TensorBoard event files back (TFRecord framing, Event protos from tensorboardX)."""
    from tensorboardX.proto.event_pb2 import Event

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            length = int.from_bytes(data[offset : offset + 8], "little")
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4  # length, its crc, the record, its crc
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_epoch_lines_stream_as_they_happen_and_the_stop_reason_is_printed(tmp_path, capsys):
    from unitrain.callbacks import ConsoleLogger

    flushes = []

    class Stream:
        def write(self, text: str) -> None:
            flushes.append(("write", text))

        def flush(self) -> None:
            flushes.append(("flush", ""))

    logger = ConsoleLogger(stream=Stream())
    trainer = Trainer(models.MLP((2, 2)), backend="numpy", callbacks=[logger])
    trainer.config = TrainerConfig(epochs=2, batch_size=4)
    trainer.fit((np.zeros((8, 2), "float32"), np.zeros(8, "int64")))
    lines = "".join(text for kind, text in flushes).splitlines()
    assert lines[0] == "epoch 1/2: training ..."  # the stream is no terminal: say it started
    assert lines[1].startswith("epoch 1/2: loss=") and lines[2].startswith("epoch 2/2: ")
    assert [kind for kind, _ in flushes].count("flush") >= 3  # each line flushed as printed

    out = tmp_path / "stop"
    args = ["train", "--backend", "numpy", "--out", str(out), "--set", "callbacks.0.patience=0"]
    assert main([*args, "--set", "callbacks.0.min_delta=10"]) == 0
    printed = capsys.readouterr().out
    assert "stopped after epoch 2 of 10: early stopping: val_loss did not improve" in printed
    assert main(["train", "--backend", "numpy", "--epochs", "1", "--out", str(tmp_path / "d")]) == 0
    assert "done: 1 of 1 epochs" in capsys.readouterr().out


def test_inspect_lists_a_folder_of_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    main(["train", "--backend", "numpy", "--epochs", "2", "--out", str(out)])
    capsys.readouterr()
    for folder in (out, out / "checkpoints"):  # the run folder or its checkpoints
        assert main(["inspect", str(folder)]) == 0
        printed = capsys.readouterr().out
        assert "2 checkpoints" in printed
        assert "epoch=0002-step=000090  2      90" in printed and "ok" in printed


def test_closed_pipes_warnings_and_framework_noise_print_no_tracebacks(tmp_path):
    for command in ("conformance --list", f"inspect {tmp_path}/run"):
        if command.startswith("inspect"):
            main(["train", "--backend", "numpy", "--epochs", "1", "--out", f"{tmp_path}/run"])
        shell = f"{sys.executable} -m unitrain.cli {command} | head -1"
        result = subprocess.run(shell, shell=True, capture_output=True, text=True, timeout=120)
        assert result.stderr == "", result.stderr
        assert len(result.stdout.splitlines()) == 1
    fresh = ["train", "--backend", "numpy", "--epochs", "1", "--resume", "latest"]
    result = _run(*fresh, "--out", str(tmp_path / "fresh"))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"unitrain: warning: resume='latest': no checkpoint in {tmp_path / 'fresh'}/checkpoints "
        "yet; starting from scratch"
    ]


@pytest.mark.parametrize("backend", backends("tensorflow"))
def test_tensorflow_start_up_lines_are_hidden(backend, tmp_path):
    result = _run("train", "--backend", backend, "--epochs", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "oneDNN" not in result.stderr and "cpu_feature_guard" not in result.stderr
    assert result.stderr == "", result.stderr
    listing = _run("backends")  # lists TensorFlow's devices, so imports it
    assert listing.returncode == 0 and listing.stderr == "", listing.stderr


@pytest.mark.parametrize("other", backends("torch"))
def test_compare_prints_each_backend_per_epoch_and_plots(other, tmp_path):
    out = tmp_path / "compare"
    backends_flag = ["--backends", f"numpy,{other}"]
    result = _run("compare", "digits", *backends_flag, "--epochs", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("epoch"))
    assert header.split() == ["epoch", "metric", "numpy", other, "abs", "diff", "rel", "diff"]
    val_loss = [line.split() for line in lines if " val_loss " in f" {line} "]
    assert len(val_loss) == 2
    for row in val_loss:
        numpy_value, other_value, spread = float(row[-4]), float(row[-3]), float(row[-2])
        assert spread == pytest.approx(abs(numpy_value - other_value), abs=2e-6)
        assert float(row[-1]) == pytest.approx(spread / max(numpy_value, other_value), abs=2e-6)
        assert spread < 1e-3  # the kit's promise, on this recipe
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.harness  # the whole kit on numpy in a pytest subprocess: ~1 min in CI
def test_the_kit_as_pytest_passes_from_the_repository_root():
    """The project's own pytest settings (coverage threshold) must not fail a user's kit run."""
    command = [sys.executable, "-m", "pytest", "--pyargs", "unitrain.conformance"]
    command += ["--unitrain-backend", "numpy", "-n", "0", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert (
        " passed, " in result.stdout.splitlines()[-1]
        and "failed" not in result.stdout.splitlines()[-1]
    )


def test_the_kits_page_states_the_kits_check_count():
    from unitrain.conformance import all_checks
    from unitrain.conformance._registry import FAMILIES

    page = " ".join((ROOT / "docs" / "conformance.md").read_text().split())
    assert f"{len(all_checks())} checks in {len(FAMILIES)} families" in page
    assert f"each of the {len(all_checks())} checks" in page.lower()


def test_the_tensorboard_logger_does_not_import_torch(tmp_path):
    code = (
        "import sys, numpy as np\n"
        "from unitrain import Trainer, TrainerConfig, models\n"
        "from unitrain.callbacks import TensorBoardLogger\n"
        f"logger = TensorBoardLogger({str(tmp_path)!r})\n"
        "trainer = Trainer(models.MLP((2, 2)), backend='numpy', callbacks=[logger],\n"
        "                  config=TrainerConfig(epochs=1, batch_size=4))\n"
        "trainer.fit((np.zeros((8, 2), 'float32'), np.zeros(8, 'int64')))\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert "epoch/loss" in _scalars(tmp_path)


def test_a_python_recipe_with_a_native_model_and_its_own_logger_trains(tmp_path, capsys):
    pytest.importorskip("torch")
    recipe = tmp_path / "native.py"
    recipe.write_text(
        "import numpy as np\n"
        "import torch\n"
        "from unitrain import callbacks\n"
        "from unitrain.recipes import Recipe\n"
        "\n"
        "def recipe():\n"
        "    x = np.random.default_rng(0).normal(size=(64, 4)).astype('float32')\n"
        "    y = (x[:, 0] > 0).astype('int64')\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), "
        "torch.nn.Linear(8, 2))\n"
        f"    logger = callbacks.JSONLLogger({str(tmp_path / 'mine.jsonl')!r})\n"
        "    return Recipe(model=model, data=((x, y), (x, y)), callbacks=[logger])\n"
    )
    out = tmp_path / "run"
    assert (
        main(["train", str(recipe), "--backend", "torch", "--epochs", "2", "--out", str(out)]) == 0
    )
    assert "training native on torch" in capsys.readouterr().out
    assert len((tmp_path / "mine.jsonl").read_text().splitlines()) == 2  # the recipe's logger
    assert not (out / "metrics.jsonl").exists()
    assert [p.name for p in list_checkpoints(out / "checkpoints")][-1] == "epoch=0002-step=000004"
