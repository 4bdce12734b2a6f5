"""Finding backends: by name, by module path, by entry point; and the errors when it fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from unitrain import BackendNotFoundError, ConfigError, MissingFrameworkError
from unitrain.backends import registry
from unitrain.backends.numpy import NumpyBackend


def test_lookup_by_name_and_by_module_path():
    assert registry.get_backend("numpy") is NumpyBackend
    assert registry.get_backend("unitrain.backends.numpy:NumpyBackend") is NumpyBackend
    assert registry.get_backend(NumpyBackend) is NumpyBackend


def test_builtin_backends_are_registered_as_entry_points():
    """Built-ins use the entry-point group a third party would (needs the installed package)."""
    import importlib.metadata

    names = {ep.name for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert {"numpy", "torch"} <= names


def test_a_third_party_entry_point_is_found(monkeypatch):
    class FakeEntryPoint:
        name, value = "mlx", "unitrain.backends.numpy:NumpyBackend"

    monkeypatch.setattr(
        registry.importlib.metadata, "entry_points", lambda group: [FakeEntryPoint()]
    )
    assert registry.get_backend("mlx") is NumpyBackend
    assert "mlx" in [info.name for info in registry.list_backends()]


def test_unknown_backend_lists_known_ones_and_suggests():
    with pytest.raises(
        BackendNotFoundError, match=r"unknown backend 'pytorch'.*numpy.*Did you mean 'torch'"
    ):
        registry.get_backend("pytorch")
    with pytest.raises(BackendNotFoundError, match="Did you mean 'tensorflow'"):
        registry.get_backend("tensorflo")


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (
            "no_such_module_xyz:Backend",
            BackendNotFoundError,
            "cannot import module 'no_such_module_xyz'",
        ),
        ("unitrain.backends.numpy:Missing", BackendNotFoundError, "no attribute 'Missing'"),
        (":Backend", ConfigError, "package.module:Class"),
        ("", BackendNotFoundError, "non-empty"),
    ],
)
def test_bad_module_paths(spec, error, message):
    with pytest.raises(error, match=message):
        registry.get_backend(spec)


def test_missing_framework_names_the_pip_extra():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        from unitrain import MissingFrameworkError
        from unitrain.backends import registry
        try:
            registry.get_backend("torch")
        except MissingFrameworkError as error:
            print(error)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'unitrain[torch]'" in out.stdout
    assert issubclass(MissingFrameworkError, ImportError)


def test_default_backend_follows_the_environment(monkeypatch):
    monkeypatch.setenv("UNITRAIN_BACKEND", "numpy")
    assert registry.default_backend_name() == "numpy"
    monkeypatch.delenv("UNITRAIN_BACKEND")
    assert registry.default_backend_name() in registry.DEFAULT_ORDER


def test_import_unitrain_imports_no_framework():
    heavy = "('torch', 'jax', 'tensorflow', 'keras', 'optax')"
    code = (
        "import sys, unitrain, unitrain.recipes, unitrain.cli; "
        f"print(sorted(m for m in {heavy} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_unitrain_is_cheap_and_loads_names_on_use():
    code = (
        "import sys, unitrain; print('numpy' in sys.modules); "
        "from unitrain import Trainer, schedules; print(Trainer.__module__, schedules.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "unitrain.training.trainer", "unitrain.schedules"]
    import unitrain

    assert set(dir(unitrain)) >= {"Trainer", "TrainerConfig", "schedules", "callbacks"}
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        unitrain.Trainr  # noqa: B018
