"""Recipes are data: a TOML recipe or a ``--set`` cannot run code or write outside the run.

A ``package.module:Class`` type is refused before anything is imported unless imports are
allowed; registered types (built in, or through the ``unitrain.callbacks`` / ``unitrain.data``
entry points) need no flag; logger and checkpoint paths stay inside the run folder.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from unitrain import ConfigError, callbacks
from unitrain.cli import main
from unitrain.recipes import (
    Recipe,
    _trust,
    apply_overrides,
    load_recipe,
    recipe_from_dict,
    recipe_to_dict,
    recipe_to_toml,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (ROOT / "examples" / "recipes" / "digits.toml").read_text()
REFUSAL = r"'{}'.*--allow-imports.*allow_imports=True.*Python recipe"


def toml_recipe(tmp_path: Path, extra: str, *, data: str = 'type = "digits"') -> Path:
    """The shipped digits recipe with its [data] replaced and ``extra`` tables added."""
    start = SHIPPED.index("[data]")
    end = SHIPPED.index("[optimizer]")
    path = tmp_path / "recipe.toml"
    text = SHIPPED[:start] + f"[data]\n{data}\n\n" + SHIPPED[end:] + textwrap.dedent(extra)
    path.write_text(text)
    return path


def test_a_toml_callback_naming_os_system_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = toml_recipe(
        tmp_path, f'\n[[callbacks]]\ntype = "os:system"\ncommand = "touch {marker}"\n'
    )
    with pytest.raises(ConfigError, match=REFUSAL.format("os:system")):
        load_recipe(path)
    assert not marker.exists()


def test_toml_data_naming_popen_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = toml_recipe(
        tmp_path, "", data=f'type = "subprocess:Popen"\nargs = ["touch", "{marker}"]'
    )
    with pytest.raises(ConfigError, match=REFUSAL.format("subprocess:Popen")):
        load_recipe(path)
    assert not marker.exists()


def test_set_data_type_os_system_on_the_command_line_exits_2_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "ran"
    status = main(
        [
            "train",
            "digits",
            "--backend",
            "numpy",
            "--out",
            str(tmp_path / "run"),
            "--set",
            "data.type=os:system",
            "--set",
            f"data.command=touch {marker}",
        ]
    )
    assert status == 2
    assert not marker.exists()
    assert "'os:system'" in capsys.readouterr().err


def test_a_set_table_holding_a_type_is_refused_too(tmp_path):
    marker = tmp_path / "ran"
    table = f'{{type = "os:system", command = "touch {marker}"}}'
    with pytest.raises(ConfigError, match=REFUSAL.format("os:system")):
        apply_overrides(load_recipe("digits"), [f"callbacks.0={table}"])
    assert not marker.exists()


def test_a_string_elsewhere_in_a_toml_recipe_does_not_make_it_a_trusted_type(tmp_path):
    path = toml_recipe(
        tmp_path,
        '\n[[callbacks]]\ntype = "CSVLogger"\npath = "os:system"\n',
        data='type = "digits"',
    )
    with pytest.raises(ConfigError, match=REFUSAL.format("os:system")):
        load_recipe(path, ["callbacks.0.type=os:system"])
    with pytest.raises(ConfigError, match=REFUSAL.format("os:system")):
        load_recipe(path, ["data.type=os:system"])


def test_a_refused_type_is_not_even_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "loud_module.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\nclass Loud:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = toml_recipe(tmp_path, '\n[[callbacks]]\ntype = "loud_module:Loud"\n')
    with pytest.raises(ConfigError, match=REFUSAL.format("loud_module:Loud")):
        load_recipe(path)
    assert not marker.exists() and "loud_module" not in sys.modules


@pytest.mark.parametrize("where", ["/tmp/unitrain-elsewhere/metrics.csv", "../escape.csv"])
def test_a_logger_path_outside_the_run_folder_is_refused(tmp_path, where):
    path = toml_recipe(tmp_path, f'\n[[callbacks]]\ntype = "CSVLogger"\npath = "{where}"\n')
    with pytest.raises(ConfigError, match=r"inside the run folder.*--allow-absolute-paths"):
        load_recipe(path)
    recipe = load_recipe(path, allow_absolute_paths=True)
    assert str(recipe.callbacks[-1].path) == where


@pytest.mark.parametrize(
    "assignment",
    [
        "callbacks.1.dirpath=/tmp/unitrain-elsewhere",
        "callbacks.1.dirpath=ok/../../escape",
        "config.checkpoint_dir=/tmp/unitrain-elsewhere",
    ],
)
def test_set_cannot_point_a_checkpoint_outside_the_run_folder(assignment):
    with pytest.raises(ConfigError, match="inside the run folder"):
        load_recipe("digits", [assignment])
    load_recipe("digits", [assignment], allow_absolute_paths=True)


def test_a_toml_name_cannot_move_the_run_folder_elsewhere(tmp_path):
    path = toml_recipe(tmp_path, "")
    path.write_text(path.read_text().replace('name = "digits"', 'name = "../../elsewhere"'))
    with pytest.raises(ConfigError, match=r"name = '\.\./\.\./elsewhere'.*inside the run folder"):
        load_recipe(path)


def test_a_relative_logger_path_inside_the_run_folder_is_fine(tmp_path):
    path = toml_recipe(tmp_path, '\n[[callbacks]]\ntype = "CSVLogger"\npath = "logs/m.csv"\n')
    assert load_recipe(path).callbacks[-1].path == Path("logs/m.csv")


def test_build_roots_relative_callback_paths_in_the_run_folder(tmp_path):
    recipe = load_recipe("digits")
    recipe.callbacks = [callbacks.CSVLogger("m.csv"), callbacks.ModelCheckpoint("ckpt")]
    built = recipe.build("numpy", run_dir=tmp_path / "run")
    paths = [getattr(c, "path", None) or c.dirpath for c in built.callbacks.callbacks]
    assert paths == [tmp_path / "run" / "m.csv", tmp_path / "run" / "ckpt"]
    assert recipe.callbacks[0].path == Path("m.csv")  # the recipe itself is left as it was


def test_allow_imports_keeps_naming_a_module_class_working(tmp_path):
    path = toml_recipe(
        tmp_path,
        '\n[[callbacks]]\ntype = "unitrain.callbacks:TerminateOnNaN"\n',
        data='type = "unitrain.recipes:Digits"\nseed = 3',
    )
    with pytest.raises(ConfigError, match=REFUSAL.format("unitrain.recipes:Digits")):
        load_recipe(path)
    recipe = load_recipe(path, allow_imports=True)
    assert recipe.data.seed == 3
    assert isinstance(recipe.callbacks[-1], callbacks.TerminateOnNaN)
    with pytest.warns(UserWarning, match="dropped"):
        retyped = load_recipe("digits", ["callbacks.0.type=os:getcwd"], allow_imports=True)
    assert isinstance(retyped.callbacks[0], str)  # imported and called: what the flag allows


def test_cli_allow_imports_is_passed_to_the_recipe_and_to_compare_children(tmp_path, monkeypatch):
    from unitrain.cli import _train

    ran: list[list[str]] = []

    class Failed:
        returncode, stdout, stderr = 1, "", ""

    monkeypatch.setattr(
        _train.subprocess, "run", lambda command, **_: ran.append(command) or Failed()
    )
    path = toml_recipe(tmp_path, '\n[[callbacks]]\ntype = "unitrain.callbacks:TerminateOnNaN"\n')
    arguments = ["compare", str(path), "--backends", "numpy,numpy", "--out", str(tmp_path)]
    assert main(arguments) == 2  # refused in the parent
    assert ran == []
    assert main([*arguments, "--allow-imports", "--allow-absolute-paths"]) == 1
    assert "--allow-imports" in ran[0] and "--allow-absolute-paths" in ran[0]


def write_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package with a callback and a data class, as an installed plugin would ship them."""
    (tmp_path / "stopping_plugin.py").write_text(
        textwrap.dedent(
            """
            from unitrain.callbacks import Callback
            from unitrain.recipes import Digits

            class StopEarly(Callback):
                def __init__(self, after: int = 1) -> None:
                    self.after = after

            class MoreDigits(Digits):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registered = {
        "unitrain.callbacks": {"stop_early": "stopping_plugin:StopEarly"},
        "unitrain.data": {"more_digits": "stopping_plugin:MoreDigits"},
    }
    monkeypatch.setattr(_trust, "entry_point_types", lambda group: registered[group])


def test_an_entry_point_type_resolves_without_the_flag(tmp_path, monkeypatch):
    write_plugin(tmp_path, monkeypatch)
    path = toml_recipe(
        tmp_path, '\n[[callbacks]]\ntype = "stop_early"\nafter = 4\n', data='type = "more_digits"'
    )
    recipe = load_recipe(path)
    assert type(recipe.callbacks[-1]).__name__ == "StopEarly" and recipe.callbacks[-1].after == 4
    assert type(recipe.data).__name__ == "MoreDigits"
    # Written out, the class is named by its import path, which its entry point vouches for.
    again = recipe_from_dict(recipe_to_dict(recipe))
    assert again.callbacks[-1].after == 4


def test_an_unknown_type_lists_the_registered_ones(tmp_path, monkeypatch):
    write_plugin(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"unknown callback type 'nope'.*stop_early"):
        apply_overrides(load_recipe("digits"), ["callbacks.0.type=nope"])


def test_built_in_types_round_trip_and_retype_without_any_flag(tmp_path):
    with pytest.warns(UserWarning, match="dropped: monitor, patience"):
        recipe = load_recipe(
            "digits", ["callbacks.0.type=TerminateOnNaN", "callbacks.1.dirpath=ckpt"]
        )
    assert isinstance(recipe.callbacks[0], callbacks.TerminateOnNaN)
    path = tmp_path / "again.toml"
    path.write_text(recipe_to_toml(recipe))
    assert recipe_to_dict(load_recipe(path)) == recipe_to_dict(recipe)


def test_a_python_recipe_is_code_and_keeps_its_own_classes_and_paths(tmp_path, monkeypatch):
    write_plugin(tmp_path, monkeypatch)
    monkeypatch.setattr(_trust, "entry_point_types", lambda group: {})
    path = tmp_path / "coded.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from unitrain import callbacks, models
            from unitrain.recipes import Recipe
            from unitrain.recipes import Digits
            from stopping_plugin import StopEarly

            def recipe():
                return Recipe(
                    model=models.MLP((64, 10)),
                    data=Digits(),
                    callbacks=[StopEarly(2), callbacks.CSVLogger({str(tmp_path / "m.csv")!r})],
                )
            """
        )
    )
    recipe = load_recipe(path, ["optimizer.momentum=0.5"])  # rebuilt from data, no flag needed
    assert isinstance(recipe, Recipe) and recipe.callbacks[0].after == 2
    assert recipe.callbacks[1].path == tmp_path / "m.csv"
    with pytest.raises(ConfigError, match=REFUSAL.format("stopping_plugin:StopEarly")):
        recipe_from_dict(recipe_to_dict(recipe))  # the same classes as data need the flag
