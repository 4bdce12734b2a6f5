"""Every module path that worked before the one-tree layout still imports, warns once with a
``DeprecationWarning`` that points at the importing line, and gives the moved module itself."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

from unitrain._moved import MOVED

#: A name each old path was used for, to show ``from old import name`` still works.
USED_FOR = {
    "unitrain.backend": "Backend",
    "unitrain.registry": "get_backend",
    "unitrain.strategy": "Strategy",
    "unitrain.precision": "LossScaler",
    "unitrain.state": "split_state",
    "unitrain.config": "TrainerConfig",
    "unitrain.trainer": "Trainer",
    "unitrain.rng": "seed_everything",
    "unitrain.recipe": "load_recipe",
    "unitrain.plot": "plot_runs",
}


def test_every_moved_path_has_a_name_to_import():
    assert set(USED_FOR) == set(MOVED)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_path_warns_at_the_importing_line_and_gives_the_new_module(old):
    new, _ = MOVED[old]
    name = USED_FOR[old]
    script = textwrap.dedent(
        f"""
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            from {old} import {name}  # line 5
        import {new} as new
        assert {name} is getattr(new, {name!r})
        import {old} as again
        assert again is new
        (warning,) = [w for w in caught if w.category is DeprecationWarning]
        print(warning.filename, warning.lineno, warning.message, sep="|")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    filename, line, message = done.stdout.strip().split("|")
    assert (filename, line) == ("<string>", "5")
    assert message.startswith(f"{old} moved to {new}; import from ")


def test_importing_an_old_path_twice_warns_once():
    old = "unitrain.state"
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match="moved to unitrain.backends.state"):
        first = importlib.import_module(old)
    second = importlib.import_module(old)  # a warning here would fail this run (filterwarnings)
    assert first is second is importlib.import_module("unitrain.backends.state")
