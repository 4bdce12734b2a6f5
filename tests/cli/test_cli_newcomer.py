"""What a newcomer met on the command line: the messages and lines that must guide them."""

from __future__ import annotations

import io
import json
import re
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from unitrain import Trainer, TrainerConfig, models
from unitrain.callbacks import Callback, ConsoleLogger
from unitrain.cli import main
from unitrain.cli._launch import main as launcher_main

ROOT = Path(__file__).resolve().parents[2]


def test_a_misspelt_config_field_is_named_with_the_closest_and_the_fields_in_order(capsys):
    assert main(["train", "--backend", "numpy", "--set", "config.epoch=3"]) == 2
    error = capsys.readouterr().err
    assert "did you mean 'epochs'?" in error
    # Declaration order, as the config's docs list them, not a set's arbitrary order.
    assert "the fields are: epochs, batch_size, grad_accum_steps," in error


def test_a_misspelt_table_field_is_named_with_the_closest(capsys):
    assert main(["train", "--backend", "numpy", "--set", "optimizer.momentom=0.8"]) == 2
    assert "did you mean 'momentum'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        *([command, "--help"] for command in ("train", "compare", "plot", "backends", "inspect")),
        ["conformance", "--help"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_help_is_plain_text_without_restructuredtext_markup(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 0
    shown = capsys.readouterr().out
    assert not re.search(r"``|:[a-z]+:`|`\w", shown), shown


def test_the_launcher_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        launcher_main(["--help"])
    shown = capsys.readouterr().out
    assert "Start N local workers" in shown and "runs python -m module args N times" in shown
    assert "``" not in shown and ":class:" not in shown


class _Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize("terminal", [False, True])
def test_off_a_terminal_a_line_says_the_first_epoch_started(terminal):
    """A log file or pipe got nothing until the first epoch ended (25 s on JAX, compiling)."""
    stream = _Stream(terminal)
    started = []

    class Watch(Callback):
        def on_batch_begin(self, trainer, batch):
            started.append(stream.getvalue())  # what the log held when the first step ran

    trainer = Trainer(
        models.MLP((2, 2)),
        backend="numpy",
        callbacks=[ConsoleLogger(stream=stream), Watch()],
        config=TrainerConfig(epochs=2, batch_size=4),
    )
    trainer.fit((np.zeros((8, 2), "float32"), np.zeros(8, "int64")))
    announced = "epoch 1/2: training ...\n"
    assert started[0] == ("" if terminal else announced)
    lines = stream.getvalue().splitlines()
    assert len(lines) == (2 if terminal else 3)  # said once per fit, not every epoch


def test_backends_prints_each_line_before_importing_the_next_framework(monkeypatch, capsys):
    """Finding devices imports each framework (a minute for four); no line waited for all."""
    from unitrain.cli import _main

    seen_before_import = []

    def record(name):
        seen_before_import.append((name, capsys.readouterr().out))

    monkeypatch.setattr(_main, "quiet_framework_import", record)
    assert main(["backends"]) == 0
    rest = capsys.readouterr().out
    assert seen_before_import, "no backend installed"
    first_out = seen_before_import[0][1]
    assert first_out.startswith("backend ") and first_out.count("\n") == 1  # the header
    for (_, out), (name, _) in zip(seen_before_import[1:], seen_before_import):
        assert out.startswith(name + " ")  # the backend before it is printed already
    assert rest.split()[0] == seen_before_import[-1][0]


def test_the_toml_digits_recipe_sizes_its_schedule_to_the_epochs_set_as_the_built_in_does(
    tmp_path, capsys
):
    """The README calls them the same recipe; --set config.epochs=2 left the TOML's cosine
    sized for ten epochs (its last epoch at lr 0.0887, the built-in's at 0.001)."""
    last_lr = {}
    for recipe in ("digits", str(ROOT / "examples" / "recipes" / "digits.toml")):
        out = tmp_path / Path(recipe).name
        argv = ["train", recipe, "--backend", "numpy", "--out", str(out), "--quiet"]
        assert main([*argv, "--set", "config.epochs=2"]) == 0
        rows = (out / "metrics.jsonl").read_text().splitlines()
        last_lr[recipe] = json.loads(rows[-1])["lr"]
    capsys.readouterr()
    assert len(set(last_lr.values())) == 1, last_lr
    assert next(iter(last_lr.values())) < 0.002  # decayed to about min_lr as the run ends


def test_compare_labels_its_differences_absolute_and_relative():
    """An unlabelled "max diff" of 2.18e+14 on a perplexity of 1e15 read as a broken backend."""
    from unitrain.cli._train import _table

    table = _table(
        {
            "numpy": [{"epoch": 1, "loss": 2.0, "val_perplexity": 1.0e15}],
            "torch": [{"epoch": 1, "loss": 2.5, "val_perplexity": 1.218e15}],
        }
    ).splitlines()
    assert table[0].split() == ["epoch", "metric", "numpy", "torch", "abs", "diff", "rel", "diff"]
    assert table[1].split()[-2:] == ["5.00e-01", "2.00e-01"]  # 0.5 of 2.5
    assert table[2].split()[-2:] == ["2.18e+14", "1.79e-01"]  # large, yet 18 %
    assert table[-1].startswith("abs diff: ") and "rel diff: " in table[-1]


def test_compare_warns_that_native_dropout_makes_the_backends_differ(tmp_path, monkeypatch):
    from unitrain.cli import _train

    text = (ROOT / "examples" / "recipes" / "digits.toml").read_text()
    recipe = tmp_path / "dropout.toml"
    recipe.write_text(text.replace("dropout = 0.0", "dropout = 0.2"))
    failed = subprocess.CompletedProcess([], 1, "", "")
    monkeypatch.setattr(_train.subprocess, "run", lambda *_, **__: failed)  # train nothing
    argv = ["compare", str(recipe), "--backends", "numpy,torch", "--out", str(tmp_path / "c")]
    native = [*argv, "--set", "config.random=native"]
    with pytest.warns(UserWarning, match=r"dropout=0\.2.*draws its own dropout masks"):
        assert main(native) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the portable generator's masks agree: no warning
        assert main(argv) == 1
        assert main([*argv[:1], str(ROOT / "examples" / "recipes" / "digits.toml"), *argv[2:]]) == 1


def test_dropout_is_found_in_layers_and_options_of_a_model():
    from unitrain.cli._train import _dropout_in
    from unitrain.models import MLP, Dropout, Linear, Sequential

    assert _dropout_in(MLP((4, 2))) == ""
    assert _dropout_in(MLP((4, 2), dropout=0.1)) == "dropout=0.1"
    assert _dropout_in(Sequential([Linear(4, 4), Dropout(0.3)])) == "dropout p=0.3"
    assert _dropout_in(object()) == ""  # a native model: nothing to read
