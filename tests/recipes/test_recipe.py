"""Recipes: Python and TOML files, their round trip, and ``--set`` overrides."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from unitrain import ConfigError, TrainerConfig, callbacks, optim, schedules
from unitrain.recipes import (
    apply_overrides,
    load_recipe,
    recipe_from_dict,
    recipe_to_dict,
    recipe_to_toml,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_digits_recipe_round_trips_through_toml(tmp_path):
    recipe = load_recipe("digits")
    path = tmp_path / "digits.toml"
    path.write_text(recipe_to_toml(recipe))
    again = load_recipe(path)
    assert recipe_to_dict(again) == recipe_to_dict(recipe)
    assert again.schedule == recipe.schedule and again.model == recipe.model
    assert [type(c) for c in again.callbacks] == [type(c) for c in recipe.callbacks]
    assert again.callbacks[0].patience == 3


def test_the_shipped_toml_example_equals_the_built_in_recipe():
    shipped = load_recipe(ROOT / "examples" / "recipes" / "digits.toml")
    assert recipe_to_dict(shipped) == recipe_to_dict(load_recipe("digits"))


def test_a_python_recipe_file_is_loaded_and_named_after_its_file(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(
        textwrap.dedent(
            """
            import numpy as np
            from unitrain import models
            from unitrain.recipes import Recipe

            def recipe():
                x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
                y = (x[:, 0] > 0).astype("int64")
                return Recipe(model=models.MLP((4, 3)), data=((x, y), None))
            """
        )
    )
    recipe = load_recipe(path)
    assert recipe.name == "tiny" and recipe.model.sizes == (4, 3)
    with pytest.raises(ConfigError, match="has no to_dict"):
        recipe_to_dict(recipe)  # its data is arrays: it stays a Python recipe


def test_overrides_change_config_nested_parts_and_list_items():
    recipe = apply_overrides(
        load_recipe("digits"),
        [
            "config.epochs=2",
            "config.device=cpu",  # not TOML: taken as a string
            "schedule.schedule.base_lr=0.05",
            "callbacks.0.patience=7",
            "model.sizes=[64, 32, 10]",
            "config.precision=32",  # a TOML integer: the precision "32"
        ],
    )
    assert recipe.config.epochs == 2 and recipe.config.device == "cpu"
    assert recipe.config.precision == "32"
    assert recipe.schedule.schedule.base_lr == 0.05
    assert recipe.callbacks[0].patience == 7
    assert recipe.model.sizes == (64, 32, 10)


def test_setting_another_type_starts_that_type_from_its_defaults_and_says_what_was_dropped():
    with pytest.warns(UserWarning, match="'sgd' were dropped: momentum, nesterov, weight_decay"):
        recipe = apply_overrides(
            load_recipe("digits"), ["optimizer.type=lion", "optimizer.beta2=0.98"]
        )
    assert recipe.optimizer == optim.Lion(beta2=0.98)
    with pytest.warns(UserWarning, match="'cosine_decay' were dropped: base_lr, decay_steps"):
        recipe = apply_overrides(
            recipe, ["schedule.schedule.type=constant", "schedule.schedule.lr=0.01"]
        )
    assert recipe.schedule.schedule == schedules.Constant(0.01)
    assert recipe.optimizer == optim.Lion(beta2=0.98)  # an earlier part is kept


def test_setting_the_type_a_table_already_has_changes_nothing(recwarn):
    recipe = load_recipe("digits")
    assert apply_overrides(recipe, ["optimizer.type=sgd"]).optimizer == recipe.optimizer
    assert not recwarn.list


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("epochs=3", "section.key=value"),
        ("config.epoch=3", "unknown config field"),
        ("config.epochs=0", "epochs must be an int >= 1"),
        ("callbacks.9.patience=1", "not an index below 2"),
        ("nothing.x=1", "unknown section"),
        ("model.sizes.0.type=relu", "'type' is inside a value"),
        ("optimizer.type=nadam", "unknown optimizer type"),
    ],
)
def test_bad_overrides_say_what_is_wrong(assignment, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(load_recipe("digits"), [assignment])


def test_bad_recipe_files_say_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="neither a file nor a built-in"):
        load_recipe(tmp_path / "missing.py")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"defines recipe\(\)"):
        load_recipe(empty)
    broken = tmp_path / "broken.toml"
    broken.write_text("[model\n")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_recipe(broken)
    with pytest.raises(ConfigError, match="unknown callback type 'Nope'"):
        recipe_from_dict({**recipe_to_dict(load_recipe("digits")), "callbacks": [{"type": "Nope"}]})


def test_callbacks_describe_the_arguments_they_were_given():
    checkpoint = callbacks.ModelCheckpoint(Path("ckpt"), every_n_epochs=None, every_n_steps=5)
    assert checkpoint.to_dict() == {
        "type": "ModelCheckpoint",
        "dirpath": "ckpt",
        "every_n_epochs": None,
        "every_n_steps": 5,
    }
    rebuilt = callbacks.callback_from_dict(checkpoint.to_dict())
    assert (rebuilt.every_n_epochs, rebuilt.every_n_steps) == (None, 5)
    with pytest.raises(ConfigError, match="not plain data"):
        callbacks.ConsoleLogger(stream=object()).to_dict()


def test_a_recipe_builds_a_trainer_that_trains():
    recipe = apply_overrides(load_recipe("digits"), ["config.epochs=1"])
    recipe.callbacks = [c for c in recipe.callbacks if not isinstance(c, callbacks.ModelCheckpoint)]
    trainer = recipe.build("numpy")
    history = trainer.fit(*recipe.load_data())
    assert isinstance(trainer.optimizer, optim.SGD) and len(history) == 1
    assert history[0]["val_accuracy"] > 0.8


def test_a_recipe_that_takes_the_config_sizes_its_schedule_to_the_epochs_set():
    three = load_recipe("digits", ["config.epochs=3", "optimizer.momentum=0.5"])
    assert three.config.epochs == 3 and three.optimizer.momentum == 0.5
    assert three.schedule.warmup_steps == 45 and three.schedule.schedule.decay_steps == 2 * 45
    assert three.schedule(3 * 45) == pytest.approx(1e-3)  # fully decayed as the run ends
    # The TOML file writes its lengths in epochs, so the same rule sizes it.
    toml = load_recipe(ROOT / "examples" / "recipes" / "digits.toml", ["config.epochs=3"])
    assert toml.schedule == three.schedule


@pytest.mark.parametrize(
    ("length", "config", "updates"),
    [
        ('"1 epoch"', {}, 45),
        ('"0.5 epochs"', {}, 22),
        ('"config.epochs epochs"', {"epochs": 4}, 180),
        ('"(config.epochs - 1) epochs"', {"epochs": 1}, 1),  # never below one update
        ('"2 epochs"', {"grad_accum_steps": 2}, 46),  # updates, not batches
        ("45", {}, 45),
    ],
)
def test_a_toml_schedule_length_in_epochs_counts_the_updates(tmp_path, length, config, updates):
    text = (ROOT / "examples" / "recipes" / "digits.toml").read_text()
    text = text.replace('warmup_steps = "1 epoch"', f"warmup_steps = {length}")
    path = tmp_path / "epochs.toml"
    path.write_text(text)
    assignments = [f"config.{key}={value}" for key, value in config.items()]
    assert load_recipe(path, assignments).schedule.warmup_steps == updates


def test_a_length_in_epochs_needs_data_that_knows_its_size():
    from unitrain.recipes._epochs import schedule_in_updates

    with pytest.raises(ConfigError, match="no train_size"):
        schedule_in_updates({"warmup_steps": "1 epoch"}, object(), TrainerConfig())


@pytest.mark.parametrize(
    "optimizer",
    [optim.RMSprop(centered=True, momentum=0.9), optim.Lion(weight_decay=0.1)],
    ids=lambda o: o.type_name,
)
def test_a_toml_recipe_names_any_registered_optimizer(tmp_path, optimizer):
    text = (ROOT / "examples" / "recipes" / "digits.toml").read_text()
    start = text.index("[optimizer]")
    end = text.index("[", start + 1)
    fields = "\n".join(
        f"{key} = {str(value).lower() if isinstance(value, bool) else repr(value)}"
        for key, value in optimizer.to_dict().items()
    )
    path = tmp_path / "other.toml"
    path.write_text(text[:start] + f"[optimizer]\n{fields}\n\n" + text[end:])
    recipe = load_recipe(path)
    assert recipe.optimizer == optimizer
    assert recipe_from_dict(recipe_to_dict(recipe)).optimizer == optimizer
