"""What a newcomer met on the command line: the messages and lines that must guide them."""

from __future__ import annotations

from unitrain.cli import main


def test_a_misspelt_config_field_is_named_with_the_closest_and_the_fields_in_order(capsys):
    assert main(["train", "--backend", "numpy", "--set", "config.epoch=3"]) == 2
    error = capsys.readouterr().err
    assert "did you mean 'epochs'?" in error
    # Declaration order, as the config's docs list them, not a set's arbitrary order.
    assert "the fields are: epochs, batch_size, grad_accum_steps," in error


def test_a_misspelt_table_field_is_named_with_the_closest(capsys):
    assert main(["train", "--backend", "numpy", "--set", "optimizer.momentom=0.8"]) == 2
    assert "did you mean 'momentum'?" in capsys.readouterr().err
