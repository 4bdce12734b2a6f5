"""What a newcomer met on the command line: the messages and lines that must guide them."""

from __future__ import annotations

import re

import pytest

from unitrain.cli import main
from unitrain.cli._launch import main as launcher_main


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
