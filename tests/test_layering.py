"""The layers keep to their lanes: adapters and the kit use the public core, the core's
modules import each other without a cycle, and no module writes another object's privates.

All of it is read from the source with ``ast`` (no framework is imported), except one
check that imports the modules of the Trainer's run state alone in fresh interpreters.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from _backends import FRAMEWORKS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "unitrain"
#: The built-in adapters, each in ``unitrain/backends/<name>/`` (read from the text, so every
#: adapter is checked whether or not its framework is installed).
ADAPTERS = tuple(FRAMEWORKS)
#: Core modules that are internal although their names carry no underscore.
INTERNAL = {"unitrain.backends.state"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def is_adapter(module: str) -> bool:
    return module.split(".")[1:2] == ["backends"] and module.split(".")[2:3] in (
        [name] for name in ADAPTERS
    )


def is_kit(module: str) -> bool:
    return module.split(".")[1:2] == ["conformance"]


def sources(part: str) -> list[Path]:
    """The modules of ``part``: "adapters", "kit", "core" (the rest) or "all"."""
    found = sorted(PACKAGE.rglob("*.py"))
    keep = {
        "adapters": lambda name: is_adapter(name),
        "kit": lambda name: is_kit(name),
        "core": lambda name: not is_adapter(name) and not is_kit(name),
        "all": lambda name: True,
    }[part]
    return [path for path in found if keep(module_name(path))]


def imported_modules(path: Path, *, runtime_only: bool = False) -> list[tuple[int, str]]:
    """``(line, module)`` of each absolute import in ``path``; with ``runtime_only``, only
    the module-level ones that run on import (not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                if not runtime_only:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
            elif not runtime_only and hasattr(node, "body"):  # functions, classes
                visit([*getattr(node, "body", [])])

    visit(tree.body)
    return found


def is_private_core(module: str) -> bool:
    """Whether ``module`` (or ``package.name`` from a from-import) is a private core module."""
    parts = module.split(".")
    if parts[0] != "unitrain" or is_adapter(module) or is_kit(module):
        return False
    return any(p.startswith("_") and not p.startswith("__") for p in parts[1:]) or any(
        ".".join(parts[:i]) in INTERNAL for i in range(2, len(parts) + 1)
    )


@pytest.mark.parametrize("part", ["adapters", "kit"])
def test_adapters_and_the_kit_import_only_public_core_modules(part):
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources(part)
        for line, module in imported_modules(path)
        if is_private_core(module)
    ]
    assert not bad, "import the public surface (unitrain, unitrain.backends.protocol, ...):\n" + (
        "\n".join(bad)
    )


def test_the_kit_reaches_adapters_only_through_the_registry():
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources("kit")
        for line, module in imported_modules(path)
        if is_adapter(module)
    ]
    assert not bad, "use unitrain.backends.registry.get_backend(name):\n" + "\n".join(bad)


def test_the_core_imports_no_adapter_and_not_the_kit():
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources("core")
        for line, module in imported_modules(path, runtime_only=True)
        if is_adapter(module) or is_kit(module)
    ]
    assert not bad, "the core finds backends through the registry:\n" + "\n".join(bad)


def test_the_private_core_check_tells_private_from_public():
    assert is_private_core("unitrain._errors.ConfigError")
    assert is_private_core("unitrain.models._base.as_pair")
    assert is_private_core("unitrain.backends.state.split_state")
    assert is_private_core("unitrain.training._lock.RunLock")
    assert not is_private_core("unitrain.backends.protocol.check_state")
    assert not is_private_core("unitrain.ConfigError")
    assert not is_private_core("unitrain.backends.torch.core.to_numpy")
    assert not is_private_core("unitrain.conformance._context.Context")


def test_core_modules_import_each_other_without_a_cycle():
    known = {module_name(path) for path in sources("all")}
    graph: dict[str, set[str]] = {}
    for path in sources("all"):
        targets = set()
        for _, module in imported_modules(path, runtime_only=True):
            # ``from package import name``: the submodule when ``name`` is one.
            target = module if module in known else module.rpartition(".")[0]
            if target in known and target != module_name(path):
                targets.add(target)
        graph[module_name(path)] = targets
    state: dict[str, str] = {}

    def cycle_from(node: str, trail: list[str]) -> list[str] | None:
        state[node] = "open"
        for successor in sorted(graph[node]):
            if state.get(successor) == "open":
                return [*trail[trail.index(successor) :], successor]
            if successor not in state and (found := cycle_from(successor, [*trail, successor])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = cycle_from(start, [start])
            assert found is None, "import cycle: " + " -> ".join(found)


def test_no_module_writes_another_objects_private_fields():
    bad = []
    for path in sources("all"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    private = isinstance(part, ast.Attribute) and part.attr.startswith("_")
                    if not private or part.attr.startswith("__"):
                        continue
                    if not (isinstance(part.value, ast.Name) and part.value.id in ("self", "cls")):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(part)}")
    assert not bad, "give the owner a method instead:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "module",
    [
        "unitrain.training.trainer",
        "unitrain.training._run_state",
        "unitrain.training._fit_loop",
        "unitrain.callbacks.model_checkpoint",
        "unitrain.checkpoint._remove",
    ],
)
def test_run_state_modules_import_alone(module):
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_the_tests_are_laid_out_like_the_package():
    """A test of ``unitrain/<part>/`` lives in ``tests/<part>/``; tests of the top-level
    modules and of the project as a whole (docs, packaging, layering) stay in ``tests/``."""
    tests = ROOT / "tests"
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and p.name[0] not in "._")
    assert folders, "tests/ has no package folders"
    for name in folders:
        assert (PACKAGE / name / "__init__.py").is_file(), (
            f"tests/{name}/ mirrors no package: unitrain/{name}/ does not exist"
        )
        assert any((tests / name).glob("test_*.py")), f"tests/{name}/ holds no test module"
    top = {p.stem.removeprefix("test_") for p in tests.glob("test_*.py")}
    assert not top & set(folders), (
        f"tests of a package stand beside its folder: {top & set(folders)}"
    )
