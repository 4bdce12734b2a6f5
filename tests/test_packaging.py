"""The package is one source tree: a wheel built from it holds every package folder, and an
installed wheel imports the adapters and the kit with no mapping from elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_maps_no_folder_and_finds_packages_itself():
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setuptools
    assert "packages" not in setuptools or "find" in setuptools["packages"]


def test_a_wheel_ships_every_package_and_imports_from_where_it_is_installed(tmp_path):
    wheel_command = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist"]
    built = subprocess.run(
        [sys.executable, "-m", "pip", *map(str, wheel_command), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("unitrain-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    folders = {
        init.parent.relative_to(ROOT).as_posix()
        for init in (ROOT / "unitrain").rglob("__init__.py")
    }
    missing = sorted(f for f in folders if f"{f}/__init__.py" not in shipped)
    assert not missing, f"package folders missing from the wheel: {missing}"
    assert "unitrain/conformance/test_kit.py" in shipped  # the kit's pytest entry point

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import unitrain.backends.numpy, unitrain.conformance.plugin, unitrain.cli;"
        "print(unitrain.backends.numpy.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(site)
